"""The gateway's client for a plain-http upstream: kept-alive connections, each answer read by
httptools (llhttp, the parser uvicorn uses), whole (:meth:`UpstreamClient.post`) or streamed
(:meth:`UpstreamClient.stream`).

Why not aiohttp's client, which the gateway keeps for https and proxied upstreams: per call it
cost about 0.4 M of the 0.69 M instructions of a bare pass-through aiohttp proxy, against 0.01 M
for this client (callgrind on the proxy process, 300 calls through each; the same proxy with this
client: 0.28 M), and the gateway's CPU per call is what ``bench/gateway_overhead.py`` holds to a
target. The bench measures the gateway either way (``GATEWAY_BENCH_CLIENT=aiohttp``): whole
answers cost 1.15 M instructions per call with aiohttp's client, 0.77 M with this one (callgrind),
0.43 ms and 0.31 ms of CPU per call (one loaded run each, back to back). Streamed answers
(``bench/gateway_overhead.py --stream``, on a shared 2-core machine): 0.575 and 0.580 ms of CPU
per call when streams still went through aiohttp's client, 0.360 and 0.360 ms through this one;
then alternating, ``GATEWAY_BENCH_CLIENT=aiohttp`` against this client: 0.620 and 0.545 ms
against 0.310 and 0.335 ms.

It does only what the gateway needs: one POST at a time per connection; a ``Content-Length``,
chunked or close-ended answer; gzip and deflate inflated (it asks for none); a size limit on whole
answers; a connect time limit, and a read time limit for a whole answer or for a streamed one's
head and then each of its pieces; one retry on a fresh connection when a kept-alive one failed
unanswered within :data:`RETRY_WINDOW_SEC` of the call (the upstream had closed it as it went).
A streamed answer's pieces come as they arrive; its reading pauses while more than
:data:`PAUSE_BYTES` wait for the consumer; its connection is kept only when the answer ended
cleanly, and aborted when the consumer leaves it before the end.

>>> client = UpstreamClient("http://127.0.0.1:8000/v1/chat/completions", {"Content-Type": "application/json"})
>>> client.request_head("r-1")[:45]
b'POST /v1/chat/completions HTTP/1.1\\r\\nHost: 127'
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar, cast
from urllib.parse import urlsplit

import httptools

from osmosis_core.plugin import DEFAULT_MAX_RESPONSE_BYTES, KEEPALIVE_SEC, ResponseTooLarge

__all__ = ["StreamedAnswer", "UpstreamClient", "UpstreamUnreachable"]

CONNECT_TIMEOUT_SEC: Final = 30.0
READ_TIMEOUT_SEC: Final = 600.0
"""The time a whole answer may take; for a streamed one, its head and then each piece."""
PAUSE_BYTES: Final = 256 * 1024
"""A streamed answer's reading pauses while more than this waits for its consumer."""
RETRY_WINDOW_SEC: Final = 0.25
"""A kept-alive connection that fails before any answer within this long of the call is taken to
have been closed by the upstream as the call went (its idle time ran out), and the call is sent once
more on a new connection; a later failure is the upstream's, and the call is not sent twice."""
_T = TypeVar("_T")
_UNSAFE: Final = frozenset("\r\n\0")
_INFLATED: Final = ("gzip", "deflate", "x-gzip")


class UpstreamUnreachable(OSError):
    """The upstream refused or could not take the connection."""


class _Connection(asyncio.Protocol):
    """One kept-alive connection. :attr:`waiter` is the future of the answer in flight, or of its
    head while :attr:`answer` streams it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, str, bytes]] | None = None
        self.answer: StreamedAnswer | None = None
        self.closed = False
        self.started = False
        self.idle_since = 0.0
        self.sent_at = 0.0
        self.last_read = 0.0
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
        if self.answer is not None:
            self.last_read = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(ConnectionResetError(f"the upstream's answer is not HTTP: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():  # no answer yet (or no head of a streamed one)
            if exc is None and self.started and not self.framed and self.answer is None:
                self.on_message_complete()  # the close ends an answer that names no length
            else:
                waiter.set_exception(exc or ConnectionResetError("the upstream closed the connection"))
        elif self.answer is not None:  # a streamed answer under way
            if exc is None and not self.framed:
                self.on_message_complete()
            else:
                self.answer.end(exc or ConnectionResetError("the upstream closed the connection mid-answer"))

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

    def on_headers_complete(self) -> None:
        answer, waiter = self.answer, self.waiter
        if answer is None or waiter is None or waiter.done():
            return  # (a whole answer is taken when complete)
        if self.encoding in _INFLATED:
            answer.inflate = zlib.decompressobj(47)  # 32 + 15: gzip or zlib, told by the header
        elif self.encoding not in ("", "identity"):
            self.fail(ConnectionResetError(f"the upstream's answer is {self.encoding}-encoded"))
            return
        waiter.set_result((self.parser.get_status_code(), self.content_type, b""))

    def on_body(self, body: bytes) -> None:
        if self.answer is not None:
            self.answer.feed(body)
            return
        self.size += len(body)
        if self.size > self.limit:
            self.fail(ResponseTooLarge(self.limit))
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = not self.closed and self.parser.should_keep_alive()
        if self.answer is not None:
            self.answer.end(None)
            return
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        content = b"".join(self.body)
        self.body = []
        if self.encoding in _INFLATED:
            try:  # (asked for identity; an upstream may compress anyway)
                content = zlib.decompress(content, 47)
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
        elif self.answer is not None:
            self.answer.end(exc)
        if self.transport is not None:
            self.transport.abort()


class StreamedAnswer:
    """An answer read as it comes (from :meth:`UpstreamClient.stream`): its :attr:`status` and
    :attr:`content_type`, then its body by ``async for piece in answer`` (each piece all that
    arrived since the last; ``ConnectionError`` when the upstream cut it, ``TimeoutError`` when no
    piece came in :data:`READ_TIMEOUT_SEC`) or whole by :meth:`read`. :meth:`close` it when done: a
    connection whose answer ended cleanly goes back to the pool, else it is aborted."""

    __slots__ = (
        "_buffered",
        "_client",
        "_connection",
        "_ended",
        "_error",
        "_paused",
        "_pieces",
        "_released",
        "_timer",
        "_wakeup",
        "content_type",
        "inflate",
        "status",
    )

    def __init__(self, client: UpstreamClient, connection: _Connection) -> None:
        self.status = 0
        self.content_type = ""
        self.inflate: zlib._Decompress | None = None
        self._client = client
        self._connection = connection
        self._pieces: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._ended = False
        self._released = False
        self._error: BaseException | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- the connection's side ---------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self._ended:
            return
        if self.inflate is not None:
            try:
                data = self.inflate.decompress(data)
            except zlib.error as exc:
                self._connection.fail(ConnectionResetError(f"the upstream's answer does not inflate: {exc}"))
                return
            if not data:
                return
        self._pieces.append(data)
        self._buffered += len(data)
        if self._buffered > PAUSE_BYTES and not self._paused and self._connection.transport is not None:
            self._paused = True  # the consumer fell behind: the upstream waits (TCP's window fills)
            self._connection.transport.pause_reading()
        self._wake()

    def end(self, error: BaseException | None) -> None:
        if self._ended:
            return
        if error is None and self.inflate is not None:
            rest = self.inflate.flush()
            if rest:
                self._pieces.append(rest)
        self._ended = True
        self._error = error
        self._wake()

    def start_timer(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(READ_TIMEOUT_SEC, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._ended:
            return
        idle = 0.0 if self._paused else time.monotonic() - self._connection.last_read
        if idle < READ_TIMEOUT_SEC:  # (a paused answer waits on its consumer, not on the upstream)
            self._timer = asyncio.get_running_loop().call_later(READ_TIMEOUT_SEC - idle, self._check)
        else:
            self._connection.fail(TimeoutError(f"no more of the upstream's answer in {READ_TIMEOUT_SEC:g} s"))

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    # -- the consumer's side -----------------------------------------------------------------------

    def __aiter__(self) -> StreamedAnswer:
        return self

    async def __anext__(self) -> bytes:
        while not self._pieces:
            if self._ended:
                self.close()
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            if self._released:
                raise RuntimeError("the answer was closed")
            self._wakeup = asyncio.get_running_loop().create_future()
            try:
                await self._wakeup
            finally:
                self._wakeup = None
        pieces = self._pieces
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self._pieces = []
        self._buffered = 0
        if self._paused:
            self._resume()
        return data

    async def read(self) -> bytes:
        """The rest of the body, whole (and the answer closed).

        :raises ResponseTooLarge: the body passed the client's ``max_bytes``.
        """
        limit = self._connection.limit
        parts: list[bytes] = []
        size = 0
        try:
            async for piece in self:
                size += len(piece)
                if size > limit:
                    raise ResponseTooLarge(limit)
                parts.append(piece)
        finally:
            self.close()
        return b"".join(parts)

    def close(self) -> None:
        """Done with the answer: its connection goes back to the pool when the answer ended cleanly
        and may be kept alive, else it is aborted (the rest of the answer is not read)."""
        if self._released:
            return
        self._released = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        connection = self._connection
        connection.answer = None
        if self._paused:
            self._resume()
        if self._ended and self._error is None and connection.keep_alive:
            self._client._keep(connection)
        else:
            connection.keep_alive = False
            if connection.transport is not None:
                connection.transport.abort()

    def _resume(self) -> None:
        self._paused = False
        self._connection.last_read = time.monotonic()
        transport = self._connection.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()


class UpstreamClient:
    """POSTs to one plain-http URL and reads its answers, whole or streamed, on connections it keeps alive.

    :param url: ``http://host:port/path`` (no proxy: the gateway uses aiohttp when one applies).
    :param headers: sent with every request (the upstream's key, its extra headers).
    :param max_bytes: a larger whole answer is :class:`~osmosis_core.plugin.ResponseTooLarge`.
    """

    def __init__(self, url: str, headers: dict[str, str], max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.username is not None:
            raise ValueError("a plain http:// URL without credentials is needed")  # (aiohttp's client does the rest)
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
        return await self._call(rollout_id, body, self._whole)

    async def stream(self, rollout_id: str, body: bytes) -> StreamedAnswer:
        """The upstream's answer once its head came (status, Content-Type), its body to be read as
        it comes; :meth:`StreamedAnswer.close` it (in a ``finally``).

        :raises UpstreamUnreachable: no connection could be made.
        :raises TimeoutError: no head in time.
        :raises ConnectionError: the upstream dropped the call or answered something that is not HTTP.
        :raises ValueError: the rollout id cannot be a header value.
        """
        return await self._call(rollout_id, body, self._streamed)

    async def _call(self, rollout_id: str, body: bytes, exchange: Callable[[_Connection, bytes], Awaitable[_T]]) -> _T:
        """``exchange`` on a kept-alive connection, or on a new one."""
        data = self._request(rollout_id, body)
        connection = self._take()
        if connection is not None:
            try:
                return await exchange(connection, data)
            except ConnectionError:
                if connection.started or asyncio.get_running_loop().time() - connection.sent_at > RETRY_WINDOW_SEC:
                    raise  # it answered (in part), or had the call a while: it was taken, not sent again
                # a kept-alive connection the upstream had closed as the call went: once more, on a new one
        return await exchange(await self._connect(), data)

    def close(self) -> None:
        """Close the idle connections (a call in flight keeps its own until it ends)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            if connection.transport is not None:
                connection.transport.close()

    def _request(self, rollout_id: str, body: bytes) -> bytes:
        if any(c in rollout_id for c in _UNSAFE):
            raise ValueError("a rollout id with a line break cannot be sent upstream")
        return self.request_head(rollout_id) + str(len(body)).encode() + b"\r\n\r\n" + body

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

    def _keep(self, connection: _Connection) -> None:
        """A connection whose answer ended: to the pool when it may be kept alive, else closed."""
        if connection.keep_alive and not connection.closed:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        elif connection.transport is not None:
            connection.transport.close()

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

    async def _send(self, connection: _Connection, data: bytes) -> tuple[int, str, bytes]:
        """Write the request; the answer (or a streamed one's head) within :data:`READ_TIMEOUT_SEC`."""
        assert connection.transport is not None
        loop = asyncio.get_running_loop()
        waiter = connection.waiter = loop.create_future()
        connection.started = False
        connection.keep_alive = False
        connection.sent_at = loop.time()
        connection.transport.write(data)
        timer = loop.call_later(READ_TIMEOUT_SEC, connection.fail, TimeoutError("no answer from the upstream in time"))
        try:
            answer: tuple[int, str, bytes] = await waiter
        except BaseException:
            connection.answer = None
            connection.transport.abort()  # (cancelled, or failed: never reused)
            raise
        finally:
            timer.cancel()
            connection.waiter = None
        return answer

    async def _whole(self, connection: _Connection, data: bytes) -> tuple[int, str, bytes]:
        answer = await self._send(connection, data)
        self._keep(connection)
        return answer

    async def _streamed(self, connection: _Connection, data: bytes) -> StreamedAnswer:
        answer = connection.answer = StreamedAnswer(self, connection)
        answer.status, answer.content_type, _ = await self._send(connection, data)
        answer.start_timer()
        return answer
