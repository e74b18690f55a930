"""The gateway's client for a plain-http upstream's whole (not streamed) answers: kept-alive
connections, each answer read by httptools (llhttp, the parser uvicorn uses).

Why not aiohttp's client, which the gateway uses for everything else (streams, https, proxies):
per call it cost about 0.4 M of the 0.69 M instructions of a bare pass-through aiohttp proxy,
against 0.01 M for this client (callgrind on the proxy process, 300 calls through each; the same
proxy with this client: 0.28 M), and the gateway's CPU per call is what
``bench/gateway_overhead.py`` holds to a target. The bench measures the gateway either way
(``GATEWAY_BENCH_CLIENT=aiohttp``): 1.15 M instructions per call with aiohttp's client, 0.77 M with
this one (callgrind), 0.43 ms and 0.31 ms of CPU per call (one loaded run each, back to back).
gzip and deflate answers are inflated (it asks for none). It does only what that path needs: one POST at a
time per connection, a ``Content-Length`` or chunked answer (or one ended by the close), a size
limit, a connect and a read time limit, a retry on a fresh connection when a kept-alive one was
closed by the upstream before it answered.

>>> client = WholeAnswerClient("http://127.0.0.1:8000/v1/chat/completions", {"Content-Type": "application/json"})
>>> client.request_head("r-1")[:45]
b'POST /v1/chat/completions HTTP/1.1\\r\\nHost: 127'
"""

from __future__ import annotations

import asyncio
import time
import zlib
from typing import Final, cast
from urllib.parse import urlsplit

import httptools

from osmosis_core.plugin import DEFAULT_MAX_RESPONSE_BYTES, KEEPALIVE_SEC, ResponseTooLarge

__all__ = ["UpstreamUnreachable", "WholeAnswerClient"]

CONNECT_TIMEOUT_SEC: Final = 30.0
READ_TIMEOUT_SEC: Final = 600.0
_UNSAFE: Final = frozenset("\r\n\0")


class UpstreamUnreachable(OSError):
    """The upstream refused or could not take the connection."""


class _Connection(asyncio.Protocol):
    """One kept-alive connection; :meth:`answer` is the future of the answer in flight."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, str, bytes]] | None = None
        self.closed = False
        self.started = False
        self.idle_since = 0.0
        self.keep_alive = False
        self._reset()

    def _reset(self) -> None:
        self.body: list[bytes] = []
        self.size = 0
        self.content_type = ""
        self.encoding = ""
        self.framed = False
        """The answer says where it ends (Content-Length or chunked); else the close ends it."""

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # (uvloop's is no subclass of it)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(ConnectionResetError(f"the upstream's answer is not HTTP: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is None or self.waiter.done():
            return
        if exc is None and self.started and not self.framed:
            self.on_message_complete()  # the close ends an answer that names no length
        else:
            self.waiter.set_exception(exc or ConnectionResetError("the upstream closed the connection"))

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.started = True
        self._reset()

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key == b"content-type":
            self.content_type = value.decode("latin-1")
        elif key == b"content-encoding":
            self.encoding = value.decode("latin-1").strip().lower()
        elif key == b"content-length" or (key == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.limit:
            self.fail(ResponseTooLarge(self.limit))
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        self.keep_alive = not self.closed and self.parser.should_keep_alive()
        content = b"".join(self.body)
        self.body = []
        if self.encoding in ("gzip", "deflate", "x-gzip"):
            try:  # (asked for identity; an upstream may compress anyway)
                content = zlib.decompress(content, 47)  # 32 + 15: gzip or zlib, told by the header
            except zlib.error as exc:
                self.fail(ConnectionResetError(f"the upstream's {self.encoding} answer does not inflate: {exc}"))
                return
            if len(content) > self.limit:
                self.fail(ResponseTooLarge(self.limit, len(content)))
                return
        elif self.encoding not in ("", "identity"):
            self.fail(ConnectionResetError(f"the upstream's answer is {self.encoding}-encoded"))
            return
        waiter.set_result((self.parser.get_status_code(), self.content_type, content))

    def fail(self, exc: BaseException) -> None:
        self.keep_alive = False
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()


class WholeAnswerClient:
    """POSTs to one plain-http URL and reads whole answers, on connections it keeps alive.

    :param url: ``http://host:port/path`` (no proxy: the gateway uses aiohttp when one applies).
    :param headers: sent with every request (the upstream's key, its extra headers).
    :param max_bytes: a larger answer is :class:`~osmosis_core.plugin.ResponseTooLarge`.
    """

    def __init__(self, url: str, headers: dict[str, str], max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"a plain http:// URL is needed, got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.max_bytes = max_bytes
        fixed = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "host", "accept-encoding")}
        lines = [
            f"POST {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
            f"Host: {parts.netloc}",
        ]
        lines += [f"{k}: {v}" for k, v in fixed.items()]
        lines.append("Accept-Encoding: identity")
        if any(c in line for line in lines for c in _UNSAFE):
            raise ValueError("a header holds a line break")
        self._head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._idle: list[_Connection] = []

    def request_head(self, rollout_id: str) -> bytes:
        """The request line and headers, up to the body's length."""
        return self._head + b"X-Osmosis-Rollout-Id: " + rollout_id.encode() + b"\r\nContent-Length: "

    async def post(self, rollout_id: str, body: bytes) -> tuple[int, str, bytes]:
        """(status, Content-Type, whole body) of the upstream's answer.

        :raises UpstreamUnreachable: no connection could be made.
        :raises ResponseTooLarge: the answer passed ``max_bytes``.
        :raises TimeoutError: no answer in time.
        :raises ConnectionError: the upstream dropped the call or answered something that is not HTTP.
        :raises ValueError: the rollout id cannot be a header value.
        """
        if any(c in rollout_id for c in _UNSAFE):
            raise ValueError("a rollout id with a line break cannot be sent upstream")
        data = self.request_head(rollout_id) + str(len(body)).encode() + b"\r\n\r\n" + body
        connection = self._take()
        if connection is not None:
            try:
                return await self._exchange(connection, data)
            except ConnectionError:
                if connection.started:
                    raise  # it answered (in part): the call was taken, not retried
                # a kept-alive connection the upstream closed before answering: once more, on a new one
        return await self._exchange(await self._connect(), data)

    def close(self) -> None:
        """Close the idle connections (a call in flight keeps its own until it ends)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            if connection.transport is not None:
                connection.transport.close()

    def _take(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            transport = connection.transport
            if (
                not connection.closed
                and transport is not None
                and not transport.is_closing()
                and (now - connection.idle_since < KEEPALIVE_SEC)
            ):
                return connection
            if connection.transport is not None:
                connection.transport.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SEC):
                _, connection = await loop.create_connection(lambda: _Connection(self.max_bytes), self.host, self.port)
        except TimeoutError:
            raise
        except OSError as exc:
            raise UpstreamUnreachable(exc.errno, f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return connection

    async def _exchange(self, connection: _Connection, data: bytes) -> tuple[int, str, bytes]:
        assert connection.transport is not None
        loop = asyncio.get_running_loop()
        waiter = connection.waiter = loop.create_future()
        connection.started = False
        connection.keep_alive = False
        connection.transport.write(data)
        timer = loop.call_later(READ_TIMEOUT_SEC, connection.fail, TimeoutError("no answer from the upstream in time"))
        try:
            answer: tuple[int, str, bytes] = await waiter
        except BaseException:
            connection.transport.abort()  # (cancelled, or failed: never reused)
            raise
        finally:
            timer.cancel()
            connection.waiter = None
        if connection.keep_alive:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.transport.close()
        return answer
