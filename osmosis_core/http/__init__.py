"""osmosis's HTTP, on aiohttp, under one name: the client every rollout's calls share and the
loopback server helpers the plugins' servers and test servers are built on.

The client (:mod:`osmosis_core.http.client`): one :class:`aiohttp.ClientSession` per event loop,
closed with the loop.

* :func:`http_request` sends a request on it, with the proxy the environment names for the host;
  :func:`client_session` is the session itself, :func:`proxy_options` the proxy of a URL;
* :func:`read_limited` reads a body up to a limit (:class:`ResponseTooLarge` past it;
  :data:`DEFAULT_MAX_RESPONSE_BYTES`, the policy's default);
* :func:`aclose_http` (or ``async with http_scope():``) closes the loop's clients early;
  :func:`on_close` registers a client of your own to close with them; :data:`KEEPALIVE_SEC` is how
  long an idle connection is kept.

The server (:mod:`osmosis_core.http.server`): :func:`start_http_server` serves a handler with
aiohttp's server (loopback by default, body and header limits), and :func:`drop_connection` /
:func:`cut_response` are the faults a test server answers with.

>>> import asyncio
>>> from aiohttp import web
>>> from osmosis_core.http import http_request, http_scope, start_http_server
>>> async def hello(request: web.BaseRequest) -> web.Response:
...     return web.Response(text="hi")
>>> async def main() -> str:
...     runner, port = await start_http_server(hello, "127.0.0.1", 0, max_body=1024)
...     try:
...         async with http_scope(), http_request("GET", f"http://127.0.0.1:{port}/") as response:
...             return await response.text()
...     finally:
...         await runner.cleanup()
>>> asyncio.run(main())
'hi'
"""

from typing import TYPE_CHECKING

from osmosis_core import _reexport

if TYPE_CHECKING:
    from osmosis_core.http.client import DEFAULT_MAX_RESPONSE_BYTES as DEFAULT_MAX_RESPONSE_BYTES
    from osmosis_core.http.client import KEEPALIVE_SEC as KEEPALIVE_SEC
    from osmosis_core.http.client import ResponseTooLarge as ResponseTooLarge
    from osmosis_core.http.client import aclose_http as aclose_http
    from osmosis_core.http.client import client_session as client_session
    from osmosis_core.http.client import http_request as http_request
    from osmosis_core.http.client import http_scope as http_scope
    from osmosis_core.http.client import on_close as on_close
    from osmosis_core.http.client import proxy_options as proxy_options
    from osmosis_core.http.client import read_limited as read_limited
    from osmosis_core.http.server import cut_response as cut_response
    from osmosis_core.http.server import drop_connection as drop_connection
    from osmosis_core.http.server import start_http_server as start_http_server

__getattr__, __dir__, __all__ = _reexport.attach(
    "osmosis_core.http",
    submod_attrs={
        "client": [
            "DEFAULT_MAX_RESPONSE_BYTES",
            "KEEPALIVE_SEC",
            "ResponseTooLarge",
            "aclose_http",
            "client_session",
            "http_request",
            "http_scope",
            "on_close",
            "proxy_options",
            "read_limited",
        ],
        "server": ["cut_response", "drop_connection", "start_http_server"],
    },
    into=__name__,
)
