"""The rollout client's HTTP sessions (aiohttp): one shared by the clients of an event loop, closed
when the loop shuts down, and the pool of a client used as ``async with``.

osmosis-core has the same kind of per-loop session for the rollout runtime; a trainer's image has no
osmosis-core, so the client keeps its own. It closes with no help from the loop's owner:
``asyncio.run``, ``asyncio.Runner`` and ``uvloop.run`` end by closing the loop's asynchronous
generators (``loop.shutdown_asyncgens()``), and the loop's first shared session starts one whose
``finally`` closes it, once no :meth:`RolloutClient.run_many` is still using it (a ``run_many``
being closed at the same moment may still send its cancel; it waits for those only: waiting for
every generator being closed, as osmosis-core's does, would wait for osmosis-core's own, which
waits for this one, on a loop that has both). A script that runs
``asyncio.run(main())`` with a plain ``RolloutClient(url)`` so ends without "Unclosed client
session"; whoever wants a pool closed at a given moment uses ``async with RolloutClient(url)``.

Proxies: ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``NO_PROXY`` are read once per client, for its server's
URL (aiohttp's ``trust_env`` would read them, and ``~/.netrc``, in a thread for every request).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
import weakref
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "KEEPALIVE_SEC",
    "check_listening",
    "is_loopback",
    "new_session",
    "proxy_options",
    "shared_session",
    "using_shared_session",
]

KEEPALIVE_SEC = 4.0
"""An idle pooled connection is closed after this long (uvicorn, which serves ``osmosis serve``,
closes its idle connections after 5 s: a request is rarely sent on a connection being dropped)."""


def new_session() -> aiohttp.ClientSession:
    """A session with a keep-alive pool of no fixed size (the client's concurrency is the cap)."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_SEC)
    return aiohttp.ClientSession(connector=connector)


class _Shared:
    """One loop's shared session, how many ``run_many`` use it, and the generator that closes it."""

    __slots__ = ("closed", "idle", "sentinel", "session", "users")

    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None
        self.users = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.closed = False
        self.sentinel: AsyncGenerator[None, None] | None = None


_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Shared] = weakref.WeakKeyDictionary()


async def _closed_at_loop_shutdown(shared: _Shared) -> AsyncGenerator[None, None]:
    """Suspended at its ``yield`` for the loop's life; the loop's shutdown closes it, and ``finally``
    closes the session once no ``run_many`` uses it."""
    try:
        yield
    finally:
        await shared.idle.wait()
        shared.closed = True
        loop = asyncio.get_running_loop()
        if _loops.get(loop) is shared:
            del _loops[loop]
        session, shared.session = shared.session, None
        if session is not None and not session.closed:
            await session.close()


def _shared() -> _Shared:
    loop = asyncio.get_running_loop()
    shared = _loops.get(loop)
    if shared is None or shared.closed:
        shared = _loops[loop] = _Shared()
        if sys.get_asyncgen_hooks().firstiter is not None:  # the loop tracks its generators (asyncio's, uvloop's)
            # calling __anext__() hands the generator to the loop's first-iteration hook (which keeps
            # it among those shutdown_asyncgens closes); one synchronous step runs it to its yield
            sentinel = shared.sentinel = _closed_at_loop_shutdown(shared)
            try:
                sentinel.__anext__().send(None)
            except StopIteration:
                pass
    return shared


def shared_session() -> aiohttp.ClientSession:
    """The running loop's shared session (made on first use). :raises RuntimeError: no running loop."""
    shared = _shared()
    if shared.session is None or shared.session.closed:
        shared.session = new_session()
    return shared.session


class using_shared_session:
    """``async with``: the loop's shutdown closes the shared session only after the block ends.

    A class, not an ``@asynccontextmanager``: that is an asynchronous generator, which the loop's
    shutdown would close (ending the block) before the generator that holds it runs its ``finally``.
    """

    def __init__(self) -> None:
        self._shared: _Shared | None = None

    async def __aenter__(self) -> None:
        shared = self._shared = _shared()
        shared.users += 1
        shared.idle.clear()

    async def __aexit__(self, *exc: object) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.users -= 1
            if shared.users == 0:
                shared.idle.set()


def proxy_options(url: str) -> dict[str, Any]:
    """``proxy`` / ``proxy_auth`` keywords for requests to ``url``'s host, from ``HTTP(S)_PROXY`` and
    ``NO_PROXY`` (empty: no proxy)."""
    scheme = url.partition("://")[0].lower()
    if not (os.environ.get(f"{scheme}_proxy") or os.environ.get(f"{scheme.upper()}_PROXY")):
        return {}
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        proxy, auth = get_env_proxy_for_url(URL(url))
    except LookupError:
        return {}
    return {"proxy": proxy, "proxy_auth": auth}


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address: the only place a trainer-side server (the live
    policy, the token-in bridge) listens without a token."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listening(host: str, api_key: str | None, what: str) -> None:
    """Refuse a trainer-side server (``what``) that would listen beyond loopback without a token.

    :raises ValueError: ``host`` is not loopback and ``api_key`` is None, or ``api_key`` is blank.
    """
    if api_key is None and not is_loopback(host):
        raise ValueError(
            f"host={host!r} is reachable from other machines: pass api_key= ({what} has no other "
            "authentication), or listen on 127.0.0.1"
        )
    if api_key is not None and not api_key.strip():
        raise ValueError("api_key is empty")
