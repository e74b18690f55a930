"""A lean HTTP server for one handler: aiohttp's low-level server (no router, no middlewares).

The scripted policy server and the policy gateway answer every request with one coroutine and
share their cores with what they serve, so their CPU per request is kept small.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["cut_response", "drop_connection", "start_http_server"]


async def start_http_server(
    handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]], host: str, port: int, *, max_body: int
) -> tuple[web.BaseRunner, int]:
    """Listen on ``host:port`` (0: a free port) in the running loop; the runner (``await
    runner.cleanup()`` stops it) and the port. Bodies over ``max_body`` bytes are refused (413)."""
    from aiohttp import web

    loop = asyncio.get_running_loop()

    def make_request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=max_body)

    server = web.Server(handler, request_factory=make_request, access_log=None, max_field_size=65536)
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
