"""The gateway's HTTP server: one handler, each request read by httptools (llhttp, the parser
uvicorn uses), each answer written whole or as a chunked stream.

Why not aiohttp's low-level server (``web.Server``), which the scripted policy server uses and the
gateway used before: it was about a third of the gateway's CPU per call, and that CPU is what
``bench/gateway_overhead.py`` holds to a target (0.3 ms a call). The same bench read 0.415 ms of
gateway CPU per call on aiohttp's server and 0.310 ms on this one, and a throughput ratio of 0.942
and 0.963 (1,000 two-call rollouts at concurrency 100, one run each, back to back on 2 cores; with
the later changes, runs on a busier day read 0.90 to 0.95: the ratio moves with the machine's load,
the bench's byte relay shows how much of it is the hop). It does only what the gateway needs:

* HTTP/1.1 and 1.0, kept-alive connections (closed after :data:`IDLE_SEC` idle, or stalled
  that long in the middle of a request), one request at a time per connection (pipelined ones wait
  their turn, in order);
* request bodies with a ``Content-Length`` or chunked (trailers ignored), up to ``max_body`` (else
  413, as soon as the length is known), ``Expect: 100-continue`` (answered when the request's turn
  comes); a request line or headers (or trailers) over 64 KiB get 431; after such a refusal the
  rest is read and dropped for :data:`LINGER_SEC`, so that the client reads the answer; a
  ``precheck`` answers from the head alone (an unauthorised call), its body dropped unread;
  reading stops while 16 requests or 1 MiB of bodies wait their turn;
* whole answers with a ``Content-Length``; streamed answers chunked (to an HTTP/1.0 client: ended by
  the close); both with write back-pressure; a connection dropped without an answer
  (:meth:`Request.drop`) or cut in the middle of one (:meth:`StreamResponse.cut`);
* a handler that raises (or whose answer cannot be written): 500 (logged), or the connection closed
  if its answer had begun.

>>> async def handler(request: Request) -> Response:
...     return Response(200, b'{"path": "%s"}' % request.path.encode())
>>> async def main() -> None:
...     server = await HttpServer(handler, max_body=1 << 20).start("127.0.0.1", 0)
...     ...                                   # http://127.0.0.1:{server.port}/anything
...     await server.close()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Final, cast

import httptools

__all__ = ["HttpServer", "Request", "Response", "StreamResponse"]

logger = logging.getLogger(__name__)

IDLE_SEC: Final = 75.0
"""A connection idle this long (nothing read, nothing being answered) is closed: aiohttp's server's
time, longer than the clients' own (httpx 5 s, aiohttp 15 s), so a client never sends on a connection
the server has just closed."""
MAX_HEAD_BYTES: Final = 65536
"""The request line and the headers together (and the trailers of a chunked body)."""
_PIPELINED: Final = 16
"""Requests read ahead on one connection before it stops reading."""
_READ_AHEAD_BYTES: Final = 1 << 20
"""Request bodies read ahead on one connection before it stops reading."""
LINGER_SEC: Final = 10.0
"""How long a refused client's body is read and dropped before the connection closes."""
_REASONS: Final = {status.value: status.phrase.encode() for status in HTTPStatus}
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_FAILED: Final = b'{"error":{"message":"the gateway failed","type":"server_error","param":null,"code":500}}'
"""The body of a 500: the handler failed, or its answer cannot be written."""


class _Clock:
    """The ``Date`` header, written once a second."""

    second = 0
    value = b""

    @classmethod
    def date(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second, cls.value = now, formatdate(now, usegmt=True).encode()
        return cls.value


def _head(status: int, content_type: str, headers: dict[str, str] | None) -> bytearray:
    head = bytearray(b"HTTP/1.1 %d %s\r\nDate: %s\r\n" % (status, _REASONS.get(status, b"Unknown"), _Clock.date()))
    if content_type:
        head += b"Content-Type: " + content_type.encode("latin-1") + b"\r\n"
    if headers:
        for name, value in headers.items():
            head += f"{name}: {value}\r\n".encode("latin-1")
    return head


class Request:
    """One request, read whole: ``method``, ``path`` (as sent, not decoded), ``query``, ``headers``
    (names in lower case; a repeated header's values joined by ``", "``) and ``body``."""

    __slots__ = (
        "_answering",
        "_connection",
        "_refusal",
        "body",
        "context",
        "headers",
        "http_11",
        "keep_alive",
        "method",
        "path",
        "query",
    )

    def __init__(
        self,
        connection: _Connection,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes,
        *,
        keep_alive: bool,
        http_11: bool,
        context: Any = None,
    ) -> None:
        self._connection = connection
        self.method = method
        self.path = path
        self.query = query
        self.context = context
        """What the server's ``precheck`` said of the request, when not a response (else None)."""
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.http_11 = http_11
        self._answering = False
        self._refusal: Response | None = None
        """What ``precheck`` answered from the head alone (the body was read and dropped)."""

    @property
    def peer_gone(self) -> bool:
        """Whether the client closed the connection."""
        return self._connection.closed

    def drop(self) -> Response:
        """Close the connection without an answer (the response returned is never sent)."""
        self._connection.close()
        return Response(204)


class Response:
    """A whole answer (sent with its ``Content-Length``)."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self, status: int = 200, body: bytes = b"", *, content_type: str = "", headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers

    def encode(self, *, keep_alive: bool, head_only: bool = False, http_10: bool = False) -> bytes:
        head = _head(self.status, self.content_type, self.headers)
        head += b"Content-Length: %d\r\n" % len(self.body)
        if not keep_alive:
            head += b"Connection: close\r\n"
        elif http_10:  # (an HTTP/1.0 client that asked to keep it is told it is kept)
            head += b"Connection: keep-alive\r\n"
        head += b"\r\n"
        if not head_only:
            head += self.body
        return bytes(head)


class StreamResponse:
    """An answer written as it comes: :meth:`prepare`, then :meth:`write` each piece, then
    :meth:`write_eof`. Writing after the client hung up raises :class:`ConnectionResetError`."""

    __slots__ = ("_chunked", "_connection", "content_type", "finished", "headers", "status")

    def __init__(self, status: int = 200, *, content_type: str = "", headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.content_type = content_type
        self.headers = headers
        self.finished = False
        self._connection: _Connection | None = None
        self._chunked = True

    async def prepare(self, request: Request) -> None:
        """Send the status and headers."""
        connection = request._connection
        if connection.closed or connection.transport is None or connection.transport.is_closing():
            raise ConnectionResetError("the client hung up")
        self._connection = connection
        request._answering = True
        head = _head(self.status, self.content_type, self.headers)
        self._chunked = request.http_11
        if self._chunked:
            head += b"Transfer-Encoding: chunked\r\n"
            if not request.keep_alive:
                head += b"Connection: close\r\n"
        else:  # an HTTP/1.0 client: the close ends the answer
            head += b"Connection: close\r\n"
            request.keep_alive = False
        head += b"\r\n"
        connection.transport.write(bytes(head))

    async def write(self, data: bytes) -> None:
        """Send one piece (waits while the client reads slower than the answer comes)."""
        connection = self._live()
        if not data:
            return
        assert connection.transport is not None
        connection.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        if connection.write_paused:
            await connection.drained()

    async def write_eof(self) -> None:
        """End the answer."""
        connection = self._live()
        assert connection.transport is not None
        if self._chunked:
            connection.transport.write(b"0\r\n\r\n")
        self.finished = True

    def cut(self) -> StreamResponse:
        """Cut the connection in the middle of this answer (after what was written reached the socket)."""
        if self._connection is not None:
            self._connection.close(flush=False)
        return self

    def _live(self) -> _Connection:
        connection = self._connection
        if connection is None:
            raise RuntimeError("the stream was not prepared")
        if connection.closed or connection.transport is None or connection.transport.is_closing():
            raise ConnectionResetError("the client hung up")
        return connection


Handler = Callable[[Request], Awaitable[Response | StreamResponse]]
Precheck = Callable[[str, str, dict[str, str]], Any]


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed as they come, served one at a time by a task."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[Request | Response] = deque()
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.refused = False
        self.in_head = False  # between a request's first byte and the end of its headers
        self.in_message = False  # between a request's first byte and its end
        self.mixed = False  # the data being read holds more than an open request's head or trailers
        self.framing = 0  # bytes read in a message since its last body bytes (its head, its trailers)
        self.continue_owed = False  # an Expect: 100-continue behind a request being answered
        self.reading_paused = False
        self.write_paused = False
        self.queued = 0  # bytes of the request bodies waiting their turn
        self.rejected: Response | None = None  # the precheck's answer to the request being read
        self._drain: asyncio.Future[None] | None = None
        self.loop = asyncio.get_running_loop()
        self.active_at = self.loop.time()
        """When it last read or answered (:meth:`HttpServer._sweep` closes one idle too long)."""
        self._reset()

    def _reset(self) -> None:
        self.target = b""
        self.method = self.path = self.query = ""
        self.context: Any = None
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.head_size = 0

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # (uvloop's is no subclass of it)
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.active_at = self.loop.time()  # (a client that stalls mid-request is idle too)
        if self.refused:
            return
        self.mixed = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not served")
        except httptools.HttpParserError as exc:
            if not self.refused:
                self._refuse(400, f"not an HTTP request: {exc}")
        if self.in_message and not self.mixed and not self.refused:
            # httptools holds a header line until it ends: bound what a request's head (or trailers) takes
            self.framing += len(data)
            if self.framing > MAX_HEAD_BYTES:
                self._refuse(431, f"the request line and headers are over {MAX_HEAD_BYTES} bytes")

    def eof_received(self) -> bool:
        return False  # (the transport closes itself; a call in flight finds the client gone)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self._wake(ConnectionResetError("the client hung up"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake(None)

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset()
        self.in_head = self.in_message = self.mixed = True
        self.framing = 0

    def on_url(self, url: bytes) -> None:
        self.target += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4  # (_count, inline: a request has many headers)
        if self.head_size > MAX_HEAD_BYTES:
            self._count(0)
        if not self.in_head:
            return  # a trailer
        key = name.lower().decode("latin-1")
        headers = self.headers
        if key in headers:
            headers[key] = f"{headers[key]}, {value.decode('utf-8', 'surrogateescape')}"
        else:
            headers[key] = value.decode("utf-8", "surrogateescape")  # (as aiohttp reads them)

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.refused:
            return
        self.method = self.parser.get_method().decode("latin-1")
        self.path, _, self.query = self.target.decode("latin-1").partition("?")
        length = self.headers.get("content-length")
        precheck = self.server.precheck
        if length is not None and length.isdigit() and int(length) > self.server.max_body:
            self._refuse(413, f"the request body is over {self.server.max_body} bytes")
        elif precheck is not None and (verdict := precheck(self.method, self.path, self.headers)) is not None:
            if isinstance(verdict, Response):
                self.rejected = verdict  # the body is read and dropped; the refusal answers the request
            else:
                self.context = verdict
        elif self.headers.get("expect", "").lower() == "100-continue" and self.parser.get_http_version() == "1.1":
            if self.task is None:
                self._continue()
            else:  # not into the answer of a request before it: when that one is answered
                self.continue_owed = True

    def on_body(self, body: bytes) -> None:
        self.mixed = True
        self.framing = 0
        if self.refused or self.rejected is not None:
            return
        self.size += len(body)
        if self.size > self.server.max_body:
            self._refuse(413, f"the request body is over {self.server.max_body} bytes")
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = self.continue_owed = False
        if self.refused:
            return
        parser = self.parser
        request = Request(
            self,
            self.method,
            self.path,
            self.query,
            self.headers,
            b"".join(self.body),
            keep_alive=parser.should_keep_alive(),
            http_11=parser.get_http_version() == "1.1",
            context=self.context,
        )
        request._refusal, self.rejected = self.rejected, None
        self._reset()
        self._queue(request)

    # -- serving -----------------------------------------------------------------------------------

    def _count(self, size: int) -> None:
        self.head_size += size
        if self.head_size > MAX_HEAD_BYTES and not self.refused:
            self._refuse(431, f"the request line and headers are over {MAX_HEAD_BYTES} bytes")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` after the requests before it, then close (what the client still sends is
        read and dropped for :data:`LINGER_SEC`, so that it reads the answer: :meth:`_linger`)."""
        self.refused = True
        body = b'{"error":{"message":"%s","type":"invalid_request_error","param":null,"code":%d}}' % (
            message.replace("\\", "\\\\").replace('"', '\\"').encode(),
            status,
        )
        self._queue(Response(status, body, content_type="application/json"))

    def _queue(self, item: Request | Response) -> None:
        self.pending.append(item)
        self.queued += len(item.body)
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._serve())
            self.server.tasks.add(self.task)
        elif (
            (len(self.pending) >= _PIPELINED or self.queued > _READ_AHEAD_BYTES)
            and self.transport is not None
            and not self.reading_paused
        ):
            self.reading_paused = True
            self.transport.pause_reading()

    async def _serve(self) -> None:
        try:
            while self.pending and not self.closed:
                item = self.pending.popleft()
                self.queued -= len(item.body)
                if (
                    self.reading_paused
                    and len(self.pending) < _PIPELINED // 2
                    and self.queued <= _READ_AHEAD_BYTES // 2
                    and not self.refused
                ):
                    self.reading_paused = False
                    assert self.transport is not None
                    self.transport.resume_reading()
                if isinstance(item, Response):  # a refusal: the last answer on this connection
                    assert self.transport is not None
                    self.transport.write(item.encode(keep_alive=False))
                    self._linger()
                    return
                if not await self._answer(item):
                    return
        except Exception:  # (a bug here: not a task exception never retrieved, and not a hung connection)
            logger.exception("the gateway's HTTP server failed")
            self.close(flush=False)
        finally:
            task, self.task = self.task, None
            if task is not None:
                self.server.tasks.discard(task)
            if not self.closed and not self.pending:
                if self.continue_owed:
                    self.continue_owed = False
                    self._continue()
                self.active_at = self.loop.time()

    async def _answer(self, request: Request) -> bool:
        """Serve one request; whether the connection goes on."""
        stream: StreamResponse | None = None
        try:
            response = request._refusal or await self.server.handler(request)
        except Exception:
            logger.exception("the gateway failed on %s %s", request.method, request.path)
            if request._answering:  # in the middle of a stream: cut it
                self.close(flush=False)
                return False
            response = Response(500, _FAILED, content_type="application/json")
        if self.closed or self.transport is None or self.transport.is_closing():
            return False  # dropped, cut or hung up
        if isinstance(response, StreamResponse):
            stream = response
            if stream._connection is None:  # returned unprepared: an empty answer
                await stream.prepare(request)
                await stream.write_eof()
            if not stream.finished:
                self.close(flush=False)
                return False
            if not request.keep_alive:
                self.close(flush=True)
                return False
            return True
        head_only, http_10 = request.method == "HEAD", not request.http_11
        try:
            self._send(response, keep_alive=request.keep_alive, head_only=head_only, http_10=http_10)
        except UnicodeEncodeError:  # a header that HTTP cannot carry (not latin-1)
            logger.exception("the gateway's answer to %s %s cannot be written", request.method, request.path)
            failed = Response(500, _FAILED, content_type="application/json")
            self._send(failed, keep_alive=request.keep_alive, head_only=head_only, http_10=http_10)
        if self.write_paused and request.keep_alive:  # the client reads slower than it asks: wait for it
            try:
                await self.drained()
            except ConnectionResetError:
                return False
        return request.keep_alive

    def _send(self, response: Response, *, keep_alive: bool, head_only: bool, http_10: bool) -> None:
        assert self.transport is not None
        self.transport.write(response.encode(keep_alive=keep_alive, head_only=head_only, http_10=http_10))
        if not keep_alive:
            self.close(flush=True)

    def _linger(self) -> None:
        """After a refusal: stop writing and read (and drop) what the client still sends until it
        closes, for :data:`LINGER_SEC` at most. Closing at once would reset a connection whose
        client is still sending its body, and the client would lose the answer (aiohttp's
        server lingers the same way)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not transport.can_write_eof():
            self.close(flush=True)
            return
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()
        transport.write_eof()
        self.loop.call_later(LINGER_SEC, self.close)

    def _continue(self) -> None:
        if self.transport is not None and not self.transport.is_closing() and not self.refused:
            self.transport.write(_CONTINUE)

    def close(self, *, flush: bool = True) -> None:
        """Close the connection (``flush``: once what was written is sent; else at once)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if flush or transport.get_write_buffer_size():
            transport.close()  # abort() would discard the bytes not yet handed to the kernel
        else:
            transport.abort()

    async def drained(self) -> None:
        """Wait until the transport takes writes again (or the client hung up)."""
        if self.closed:
            raise ConnectionResetError("the client hung up")
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()
        await self._drain

    def _wake(self, exc: BaseException | None) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)


class HttpServer:
    """Serves ``handler`` on one address (in the running event loop).

    :param handler: answers a :class:`Request` with a :class:`Response` or a finished
        :class:`StreamResponse`.
    :param max_body: a larger request body is refused with 413.
    :param precheck: called with a request's method, path and headers before its body is read; a
        :class:`Response` it returns answers the request (its body is read and dropped, never held),
        anything else but None reaches the handler as :attr:`Request.context`.
    """

    def __init__(self, handler: Handler, *, max_body: int, precheck: Precheck | None = None) -> None:
        self.handler = handler
        self.max_body = max_body
        self.precheck = precheck
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int) -> HttpServer:
        """Listen on ``host:port`` (0: a free port, then read :attr:`port`)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=2048, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._sweeper = loop.call_later(self._sweep_every(), self._sweep)
        return self

    @staticmethod
    def _sweep_every() -> float:
        return min(IDLE_SEC / 4, 5.0)

    def _sweep(self) -> None:
        """Close the connections idle (not answering, nothing read) for :data:`IDLE_SEC`; one
        timer for them all, not one a request (a connection is closed 0 to 5 s after its time)."""
        loop = asyncio.get_running_loop()
        horizon = loop.time() - IDLE_SEC
        for connection in list(self.connections):
            if connection.task is None and connection.active_at < horizon:
                connection.close()
        self._sweeper = loop.call_later(self._sweep_every(), self._sweep)

    async def close(self) -> None:
        """Stop listening and close every connection (calls in flight are cut)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()  # (close() would wait on a client that does not read)
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            async with asyncio.timeout(2):
                await server.wait_closed()
        except TimeoutError:  # (a connection that would not close: the loop ends it)
            pass
        self.port = None
