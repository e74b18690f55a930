"""A lean HTTP server for one handler: aiohttp's low-level server (no router, no middlewares).

The scripted policy server and the policy gateway answer every request with one coroutine and
share their cores with what they serve, so their CPU per request is kept small. aiohttp does the
protocol: keep-alive, pipelined requests answered in order (reading paused while they wait),
``Content-Length`` and chunked bodies read with flow control, chunked answers written with
back-pressure, and the *lingering close* after an answer given before the body was read (the rest
of the body is read and dropped for up to 10 s, so the client reads the answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["IDLE_SEC", "MAX_FIELD_BYTES", "cut_response", "drop_connection", "start_http_server"]

IDLE_SEC: Final = 75.0
"""A kept-alive connection idle this long is closed (aiohttp's server's time before 3.12): longer
than the clients' own (httpx 5 s, aiohttp 15 s, osmosis's 4 s), so a client never sends on a
connection the server has just closed."""
MAX_FIELD_BYTES: Final = 65536
"""The longest request line or header line; a longer one gets 431 and the connection is closed."""


def _server(handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]], **options: Any) -> web.Server:
    """aiohttp's low-level server, answering a request line or header over its limit with 431
    (aiohttp answers 400, as to any unparsable request), and logging a request it cannot parse at
    debug level, by the kind of its fault alone: the client's answer says what was wrong, a client
    sending garbage must not fill the log with tracebacks, and the bad line may hold a token."""
    from aiohttp import web
    from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

    class Handler(web.RequestHandler):
        def log_exception(self, *args: Any, **kw: Any) -> None:
            exc = kw.get("exc_info")
            if isinstance(exc, HttpProcessingError):  # (its text may quote a header line: a token)
                self.logger.debug("a request that is not HTTP was refused: %s", type(exc).__name__)
            else:
                super().log_exception(*args, **kw)

        def handle_error(
            self,
            request: web.BaseRequest,
            status: int = 500,
            exc: BaseException | None = None,
            message: str | None = None,
        ) -> web.StreamResponse:
            if isinstance(exc, LineTooLong):
                status, message = 431, "Request Header Fields Too Large"
            return super().handle_error(request, status, exc, message)

    class Server(web.Server):
        def __call__(self) -> web.RequestHandler:
            return Handler(self, loop=self._loop, **self._kwargs)

    return Server(handler, **options)


async def start_http_server(
    handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
    host: str,
    port: int,
    *,
    max_body: int,
    idle_sec: float = IDLE_SEC,
    cancel_on_hang_up: bool = False,
) -> tuple[web.BaseRunner, int]:
    """Listen on ``host:port`` (0: a free port) in the running loop; the runner (``await
    runner.cleanup()`` stops it) and the port.

    Bodies over ``max_body`` bytes are refused (413) when read with ``await request.read()``; a
    request line or header over :data:`MAX_FIELD_BYTES` gets 431. With ``cancel_on_hang_up``, a
    handler is cancelled when its client closes the connection (what it awaits is cancelled too: an
    upstream call, say), instead of running on for nobody.
    """
    from aiohttp import web

    loop = asyncio.get_running_loop()

    def make_request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=max_body)

    server = _server(
        handler,
        request_factory=make_request,
        access_log=None,
        max_line_size=MAX_FIELD_BYTES,
        max_field_size=MAX_FIELD_BYTES,
        keepalive_timeout=idle_sec,
        handler_cancellation=cancel_on_hang_up,
    )
    runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=2048, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])


def drop_connection(request: web.BaseRequest) -> web.Response:
    """Close the connection without an answer (the response returned is never sent)."""
    from aiohttp import web

    if request.transport is not None:
        request.transport.close()
    return web.Response(status=204)


def cut_response(request: web.BaseRequest, response: web.StreamResponse) -> web.StreamResponse:
    """Cut the connection in the middle of ``response`` (after what was written reached the socket)."""
    transport = request.transport
    if transport is not None:
        if transport.get_write_buffer_size():
            transport.close()  # abort() would discard the bytes not yet handed to the kernel
        else:
            transport.abort()
    return response
