"""The HTTP clients osmosis keeps per event loop (on aiohttp), and the one way they are closed.

Every HTTP call the core makes (the policy through :func:`osmosis_core.chat_completion`, a judge,
a result callback) goes through the running loop's one :class:`aiohttp.ClientSession`
(:func:`client_session`), and the agent integrations' ``AsyncOpenAI`` clients ride on openai's
own aiohttp transport (``osmosis_openai.client``, in the osmosis-openai distribution). Why
aiohttp: at a hundred concurrent requests httpx's pool spends 3.6 to 10 ms of CPU per request,
aiohttp 0.36 ms (``bench/http_transport.py``), and it is a maintained library that handles proxies, TLS and the
edges of HTTP for us.

The session:

* pools keep-alive connections with no cap on their number (the backend's concurrency is the
  cap), and closes one idle for :data:`KEEPALIVE_SEC`;
* never retries a request: a POST that may have reached the server is never sent twice
  (aiohttp re-sends only idempotent methods, and only on a reused connection that failed);
* has no overall timeout: a rollout's own ``agent_timeout_sec`` bounds its calls.

Send requests with :func:`http_request`: it adds the proxy that ``HTTP_PROXY`` / ``HTTPS_PROXY`` /
``NO_PROXY`` name for the URL's host, worked out once per host. (aiohttp's own ``trust_env`` reads
the environment and ``~/.netrc`` again in a thread for every request: two thread hops, a third of
the client's CPU at a hundred concurrent calls, ``bench/http_transport.py``.)

**Closing.** The clients of a loop are closed when the loop shuts down, with no help from its
owner: ``asyncio.run``, ``asyncio.Runner``, ``anyio.run`` and ``uvloop.run`` end by closing the
loop's asynchronous generators (``loop.shutdown_asyncgens()``), and the first client of a loop
starts one whose ``finally`` closes them, after every other generator that was being closed then
(whose own ``finally`` may still send a request). A script that runs ``asyncio.run(main())`` with a
:class:`~osmosis_core.LocalBackend` or a rollout client so ends without "Unclosed client session".
Whoever wants them closed earlier, or runs a loop that is closed without that shutdown
(``loop.close()`` alone), awaits :func:`aclose_http` (or ``async with http_scope():``) on the
loop, as every loop osmosis runs does, and the local backend's ``aclose()``. A module that keeps
its own per-loop client registers how to close it with :func:`on_close`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import sys
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any

from osmosis_core.records import DEFAULT_MAX_RESPONSE_BYTES

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "KEEPALIVE_SEC",
    "ResponseTooLarge",
    "aclose_http",
    "client_session",
    "http_request",
    "http_scope",
    "on_close",
    "preload",
    "proxy_options",
    "read_limited",
]

KEEPALIVE_SEC = 4.0
"""An idle pooled connection is closed after this long: before uvicorn's servers (vLLM, SGLang) close
theirs, after 5 s, so a request is rarely sent on a connection the server is dropping."""

CONNECT_TIMEOUT_SEC = 30.0
READ_TIMEOUT_SEC = 600.0
"""Per-request socket limits: no byte for this long is a failure. A rollout's own timeout is
usually far shorter."""


class ResponseTooLarge(Exception):
    """A response body exceeded its limit (the body was not read past it)."""

    def __init__(self, limit: int, seen: int | None = None) -> None:
        self.limit = limit
        self.seen = seen
        size = f"{seen} bytes" if seen is not None else "more"
        super().__init__(f"the response body ({size}) is over the {limit}-byte limit")


_Closer = Callable[[], Awaitable[None]]


class _LoopClients:
    """One loop's HTTP clients, and the generator that closes them when the loop shuts down."""

    __slots__ = ("closed", "closers", "sentinel", "session")

    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None
        self.closers: list[_Closer] = []
        self.closed = False
        self.sentinel: AsyncGenerator[None] | None = None

    async def aclose(self) -> None:
        """Close the session and every registered closer, once (a second call returns at once)."""
        if self.closed:
            return
        self.closed = True
        session, closers = self.session, self.closers
        self.session, self.closers = None, []
        errors: list[BaseException] = []
        for closer in reversed(closers):
            try:
                await closer()
            except Exception as exc:  # close the rest anyway
                errors.append(exc)
        if session is not None and not session.closed:
            await session.close()
        if errors:
            raise errors[0]


_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClients] = weakref.WeakKeyDictionary()
_ACLOSE = "async_generator_athrow"


async def _closed_at_loop_shutdown(clients: _LoopClients) -> AsyncGenerator[None]:
    """Suspended at its ``yield`` for the loop's life; its ``finally`` closes ``clients`` when the
    loop's shutdown closes it (see the module)."""
    try:
        yield
    finally:
        if not clients.closed:
            await _after_other_generators()
            loop = asyncio.get_running_loop()
            if _loops.get(loop) is clients:
                del _loops[loop]
            await clients.aclose()


async def _after_other_generators() -> None:
    """Wait for the other asynchronous generators the loop is closing now: a ``finally`` of theirs
    may still send a request on the session (e.g. ``RolloutClient.run_many`` cancelling what it had
    in flight). The loop closes each in a task of its own whose coroutine is the generator's
    ``aclose()``; the task that awaits them all (the loop's ``shutdown_asyncgens``) is not one."""
    current = asyncio.current_task()
    # (CPython's name for that awaitable; elsewhere nothing is waited for)
    others = [task for task in asyncio.all_tasks() if task is not current and type(task.get_coro()).__name__ == _ACLOSE]
    if others:
        await asyncio.wait(others)


def _clients() -> _LoopClients:
    loop = asyncio.get_running_loop()
    clients = _loops.get(loop)
    if clients is None:
        clients = _loops[loop] = _LoopClients()
        if sys.get_asyncgen_hooks().firstiter is not None:  # the loop tracks its generators (asyncio's and uvloop's do)
            # Start the generator that closes them at the loop's shutdown: calling __anext__() hands
            # it to the running loop's first-iteration hook (which keeps it, weakly, among the
            # generators shutdown_asyncgens closes); one synchronous step runs it to its yield.
            sentinel = clients.sentinel = _closed_at_loop_shutdown(clients)
            with suppress(StopIteration):
                sentinel.__anext__().send(None)
    return clients


def client_session() -> aiohttp.ClientSession:
    """The running loop's shared :class:`aiohttp.ClientSession` (made on first use).

    Do not close it yourself: :func:`aclose_http` does, for the loop's owner.

    :raises RuntimeError: outside a running event loop.
    """
    clients = _clients()
    session = clients.session
    if session is None or session.closed:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_SEC)
        session = clients.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SEC, sock_read=READ_TIMEOUT_SEC),
        )
    return session


def preload() -> None:
    """Import aiohttp now (about 0.1 s, with its TLS contexts), not on a run's first request.

    The runner calls it before its clock starts, and a worker pool before it forks, so that
    the workers inherit it.
    """
    import aiohttp  # noqa: F401


def http_request(method: str, url: str, **kwargs: Any) -> Any:
    """``client_session().request(method, url, **kwargs)`` with the environment's proxy for ``url``.

    Use it as ``async with http_request("POST", url, json=...) as response:``.
    """
    if "proxy" not in kwargs:
        kwargs.update(proxy_options(url))
    return client_session().request(method, url, **kwargs)


def proxy_options(url: str) -> dict[str, Any]:
    """``proxy`` / ``proxy_auth`` keywords for a request to ``url``, from ``HTTP(S)_PROXY`` and ``NO_PROXY``."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    host = rest.split("/", 1)[0]
    return _proxy_for(scheme, host, _proxy_environment(scheme))


def _proxy_environment(scheme: str) -> tuple[str | None, ...]:
    # only the variables that decide a proxy for this scheme (aiohttp reads <scheme>_proxy and
    # no_proxy): a scan of the whole environment per request cost 0.2 ms (bench/run_throughput.py)
    get = os.environ.get
    upper = scheme.upper()
    return (get(f"{scheme}_proxy"), get(f"{upper}_PROXY"), get("no_proxy"), get("NO_PROXY"))


@functools.lru_cache(maxsize=256)
def _proxy_for(scheme: str, host: str, environment: tuple[str | None, ...]) -> dict[str, Any]:
    if not (environment[0] or environment[1]):
        return {}
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        proxy, auth = get_env_proxy_for_url(URL(f"{scheme}://{host}/"))
    except LookupError:
        return {}
    return {"proxy": proxy, "proxy_auth": auth}


def on_close(closer: _Closer) -> None:
    """Have :func:`aclose_http` of the running loop also await ``closer`` (a per-loop client's close)."""
    _clients().closers.append(closer)


async def aclose_http() -> None:
    """Close the running loop's HTTP clients (the session and every registered closer) now. Idempotent.

    The next :func:`client_session` on the loop makes a new session (closed in turn at the loop's
    shutdown, or by the next ``aclose_http``).
    """
    clients = _loops.pop(asyncio.get_running_loop(), None)
    if clients is None:
        return
    try:
        await clients.aclose()
    finally:
        sentinel = clients.sentinel
        # done with: its finally finds the clients closed (unless it is what is running this)
        if sentinel is not None and inspect.getasyncgenstate(sentinel) != inspect.AGEN_RUNNING:
            await sentinel.aclose()


@asynccontextmanager
async def http_scope() -> AsyncIterator[None]:
    """``async with http_scope():``: the loop's HTTP clients are closed (:func:`aclose_http`) when the
    block ends, as in the example of :mod:`osmosis_core.http`."""
    try:
        yield
    finally:
        await aclose_http()


async def read_limited(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body of ``response``, refusing one larger than ``limit`` bytes without reading it all.

    :raises ResponseTooLarge: the declared length, or the bytes received, pass ``limit``.
    """
    declared = response.content_length
    if declared is not None and declared > limit:
        response.release()
        raise ResponseTooLarge(limit, declared)
    if declared is not None and not response.headers.get("Content-Encoding"):
        return await response.read()  # aiohttp reads exactly the declared length
    # no length, or a compressed body (its length says nothing of what it inflates to): counted decoded
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            response.close()  # drop the connection: the rest of the body is never read
            raise ResponseTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
