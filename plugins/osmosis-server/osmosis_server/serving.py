"""Serving an app with uvicorn, programmatically: what ``osmosis serve`` runs.

:func:`serve` binds the socket itself (so a taken port is one clear error, and ``port=0`` picks a
free one that is then printed), runs uvicorn on it, and returns after a graceful stop: SIGTERM or
Ctrl-C make the app drain while it still answers (see :mod:`osmosis_server.app`), then uvicorn
stops; a second signal stops it at once. It returns normally after a signal (exit status 0),
instead of re-raising the signal as plain uvicorn does.

>>> from osmosis_core import AgentWorkflow, LocalBackend   # doctest: +SKIP
>>> serve(create_app(LocalBackend(MyWorkflow)), host="127.0.0.1", port=8000)   # doctest: +SKIP
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

from osmosis_core import OsmosisError

__all__ = ["bind", "serve"]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port=0``: a free one).

    :raises OsmosisError: the address cannot be bound (taken, not local, bad name).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OsmosisError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OsmosisError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://host:port`` of a listening socket, the address it is bound to (``0.0.0.0``: every
    IPv4 address of the machine; ``[::]``: every address).

    >>> with bind("127.0.0.1", 0) as s:
    ...     url_of(s).startswith("http://127.0.0.1:")
    True
    """
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    sock: socket.socket | None = None,
    on_listening: Callable[[str], None] | None = None,
    log_level: str = "warning",
) -> None:
    """Serve ``app`` until a signal stops it (after the app's drain).

    :param sock: an already bound socket (:func:`bind`) instead of ``host``/``port``.
    :param on_listening: called with the URL once the app has started and the socket accepts.
    :param log_level: uvicorn's own log level (the app logs through ``osmosis_server``).
    :raises OsmosisError: the address cannot be bound, or the app failed to start.
    """
    import uvicorn

    sock = sock if sock is not None else bind(host, port)
    url = url_of(sock)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and not self.should_exit and on_listening is not None:
                on_listening(url)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # like uvicorn's, without remembering the signal to re-raise it after the stop
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            else:
                self.should_exit = True

    config = uvicorn.Config(
        app,
        lifespan="on",
        access_log=False,
        log_level=log_level,
        server_header=False,
        proxy_headers=False,
        timeout_graceful_shutdown=10,
        backlog=2048,
    )
    server = Server(config)
    try:
        server.run(sockets=[sock])
    except SystemExit:
        raise OsmosisError("the server failed to start (see the lines above)") from None
    finally:
        sock.close()
    if not server.started:
        raise OsmosisError("the server failed to start (see the lines above)")
