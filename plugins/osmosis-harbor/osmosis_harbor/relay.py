"""The one path from a ``no-network`` trial to its policy: a unix socket, relayed on both sides.

A trial of a task with ``network_mode = "no-network"`` runs in its own network namespace, which
has nothing but its own loopback: no host loopback, no outside address, no DNS. To reach its
policy (always through a policy gateway: :mod:`osmosis_harbor.gateways`) it gets:

* on the host, in the osmosis process, a :class:`HostRelay` for that trial alone: a unix socket in
  a private temporary folder (``0700``; the socket is the sandbox's root's, ``0600``) whose every
  connection is relayed, byte for byte, to one address, the gateway's ``http://`` endpoint on the
  host's loopback (:func:`loopback_address`). Nothing else of the host is behind it. At most
  ``max_connections`` (32) of a trial are accepted at once; more wait unread in the backlog, so a
  trial holds a bounded share of the osmosis process's descriptors and no buffer; a connection idle
  both ways for ``idle_timeout`` is cut;
* that socket bound read-only into the sandbox at :data:`POLICY_SOCKET` (a mount point the trial
  cannot remove or replace);
* inside the sandbox, before the workflow starts, a forwarder (:func:`start_sandbox_forwarder`: a
  thread of the trial's runner, with its own event loop, so a workflow that blocks its own loop does
  not block its calls) listening on the sandbox's own ``127.0.0.1``, relaying each connection to
  the socket. The workflow's policy ``base_url`` points there (:func:`via_port`), path and token
  unchanged.

The relay does not read what crosses it (a byte relay cannot filter a keep-alive HTTP stream), so
what is behind it must be safe to hand a trial whole: never the policy server itself (vLLM and
SGLang serve admin routes next to chat), always the gateway. It serves one rollout's chat and
models routes and authorizes every call with that rollout's own token, which is all a trial holds
(the policy's key stays in the osmosis process), so a trial can write only its own trace (another
rollout id is refused with 403, the gateway's own routes with 401/403, anything else is a 404).

Nothing here outlives the trial: the forwarder dies with the runner (and its sandbox's PID
namespace), the host relay is closed when the trial's environment stops and is part of the osmosis
process, so it dies with it, even on ``kill -9``.

>>> loopback_address("http://127.0.0.1:8000/v1/rollouts/r-1")
('127.0.0.1', 8000)
>>> loopback_address("https://api.openai.com/v1") is None
True
>>> via_port("http://localhost:8000/v1/rollouts/r-1", 41000)
'http://127.0.0.1:41000/v1/rollouts/r-1'
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import socket as sockets
import stat
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "POLICY_SOCKET",
    "HostRelay",
    "loopback_address",
    "parse_address",
    "start_sandbox_forwarder",
    "via_port",
]

POLICY_SOCKET = "/run/osmosis/policy.sock"
"""Where a no-network trial finds the socket to its policy."""

_CHUNK = 1 << 16
_MAX_UNREAD = 64 << 20
_PREFIX = "osmosis-relay-"
_LOCK = "owner.lock"
Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def loopback_address(base_url: str) -> tuple[str, int] | None:
    """``(host, port)`` of a plain ``http://`` policy URL on this machine's loopback; None for any other.

    Only such an endpoint is relayed into a no-network trial: a remote or ``https`` one would need
    the network the task forbids (or a certificate for 127.0.0.1).
    """
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    host = "127.0.0.1" if parts.hostname == "localhost" else parts.hostname
    try:
        if not ipaddress.ip_address(host).is_loopback:
            return None
        port = parts.port or 80
    except ValueError:
        return None
    return host, port


def parse_address(value: str) -> tuple[str, int]:
    """``"127.0.0.1:8000"`` or ``"[::1]:8000"`` as ``(host, port)``.

    :raises ValueError: not a loopback address with a port.
    """
    found = loopback_address(f"http://{value}")
    if found is None or f":{found[1]}" not in value:
        raise ValueError(f"policy_relay must be a loopback host:port (e.g. 127.0.0.1:8000), got {value!r}")
    return found


def via_port(base_url: str, port: int) -> str:
    """``base_url`` with its host and port replaced by the sandbox's ``127.0.0.1:port``."""
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[float]) -> None:
    """Copy until end of stream, then pass the end on (half-close); ``seen[0]``: the loop time of the last byte."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(_CHUNK):
            seen[0] = loop.time()
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, problem: str) -> None:
    """Answer the connection's (first) HTTP request with a 502 that says ``problem``, then close it.

    The request's head is read first, and its body (``Content-Length``, at most 64 MiB) read and
    dropped chunk by chunk, 5 s in all, so the client gets the answer rather than a reset; nothing
    of it is kept.
    """
    with contextlib.suppress(Exception):
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
            left = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length" and value.strip().isdigit():
                    left = min(int(value.strip()), _MAX_UNREAD)
            while left > 0 and (chunk := await reader.read(min(left, _CHUNK))):
                left -= len(chunk)
            body = json.dumps({"error": {"message": problem, "type": "server_error", "param": None, "code": 502}})
            data = body.encode()
            writer.write(
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(data)}\r\n\r\n".encode()
                + data
            )
            await writer.drain()
    writer.close()


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    connect: Connect,
    unreachable: str,
    idle_timeout: float | None = None,
) -> None:
    """Relay one accepted connection to a new connection made by ``connect`` (both ways), then close both.

    When ``connect`` fails, the caller gets an HTTP 502 saying ``unreachable`` and why, not a bare hang-up.
    With ``idle_timeout``, both are cut once no byte has crossed either way for that long.
    """
    try:
        far_reader, far_writer = await connect()
    except OSError as exc:
        await _refuse(reader, writer, f"osmosis: {unreachable}: {os.strerror(exc.errno) if exc.errno else exc}")
        return
    loop = asyncio.get_running_loop()
    seen = [loop.time()]
    ends = (writer, far_writer)

    async def watch(limit: float) -> None:
        while (quiet := loop.time() - seen[0]) < limit:  # noqa: ASYNC110 (a deadline that moves, not an event)
            await asyncio.sleep(limit - quiet)
        for end in ends:  # abort, not close: a close waits for a peer that may never read
            end.transport.abort()

    watchdog = asyncio.ensure_future(watch(idle_timeout)) if idle_timeout else None
    try:
        await asyncio.gather(_pipe(reader, far_writer, seen), _pipe(far_reader, writer, seen))
    finally:
        if watchdog is not None:
            watchdog.cancel()
        for end in ends:
            end.close()


class HostRelay:
    """One trial's unix socket on the host, relayed to the policy's loopback ``(host, port)``.

    :param target: the policy's address (:func:`loopback_address`).
    :param owner: the host ``(uid, gid)`` of the sandbox's root, which gets the socket; None: this process's.
    :param max_connections: connections relayed at once. The relay accepts no more while that many
        are open: a further one waits in the socket's backlog (itself ``max_connections`` long; past
        it, connecting fails at once), so a trial holds at most ``2 * max_connections`` of the
        osmosis process's file descriptors, which every trial shares, and no buffer of its own.
    :param idle_timeout: seconds a relayed connection may go without a byte either way before it is
        cut (longer than the policy's slowest answer: a call that does not stream is quiet until it ends).
    """

    def __init__(
        self,
        target: tuple[str, int],
        owner: tuple[int, int] | None = None,
        *,
        max_connections: int = 32,
        idle_timeout: float = 900,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self.target = target
        self.owner = owner
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self._folder: Path | None = None
        self._lock: int | None = None
        self._listener: sockets.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def socket(self) -> Path:
        """The socket's host path (while started)."""
        if self._folder is None:
            raise RuntimeError("the relay is not started")
        return self._folder / "policy.sock"

    @property
    def open_connections(self) -> int:
        """Connections accepted and not yet closed."""
        return len(self._connections)

    async def start(self) -> Path:
        """Listen on a fresh socket (in a folder only this user can enter); return its path."""
        # a short path (a unix socket's is at most 107 bytes): the trial's folder may be deep
        _sweep()
        self._folder = Path(tempfile.mkdtemp(prefix=_PREFIX))
        try:
            # held until aclose() or this process's end: the sweep of another process leaves the folder alone
            self._lock = os.open(self._folder / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            listener = self._listener = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
            listener.bind(str(self.socket))
            os.chmod(self.socket, 0o600)
            if self.owner is not None:
                os.chown(self.socket, *self.owner)
            listener.listen(self.max_connections)
            listener.setblocking(False)
            self._acceptor = asyncio.ensure_future(self._accept(listener))
        except BaseException:
            await self.aclose()
            raise
        return self.socket

    async def _accept(self, listener: sockets.socket) -> None:
        """Accept a connection only while fewer than ``max_connections`` are open."""
        loop = asyncio.get_running_loop()
        room = asyncio.Semaphore(self.max_connections)
        while True:
            await room.acquire()
            try:
                connection, _ = await loop.sock_accept(listener)
            except BaseException:
                room.release()
                raise
            task = asyncio.ensure_future(self._serve(connection))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)
            task.add_done_callback(lambda _: room.release())

    async def _serve(self, connection: sockets.socket) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=connection)
            host, port = self.target
            where = f"the policy at {host}:{port}, relayed into this no-network trial, is not reachable"
            connect = lambda: asyncio.open_connection(host, port)  # noqa: E731
            await _splice(reader, writer, connect, where, self.idle_timeout)
        except asyncio.CancelledError:
            pass  # cut by aclose(); ending quietly (asyncio logs a connection task that ends cancelled)
        finally:
            if writer is not None:
                writer.close()
            else:
                connection.close()

    async def aclose(self) -> None:
        """Stop listening, cut the connections in flight, remove the socket."""
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            acceptor.cancel()
            await asyncio.gather(acceptor, return_exceptions=True)
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        folder, self._folder = self._folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        lock, self._lock = self._lock, None
        if lock is not None:
            os.close(lock)


def _sweep() -> None:
    """Remove the socket folders of osmosis processes that are gone (killed before closing their relays).

    A live relay holds an exclusive ``flock`` on its folder's lock file, whichever PID namespace its
    process is in; a folder whose lock can be taken has no owner left.
    """
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        with contextlib.suppress(OSError):
            info = folder.lstat()
            # young: its owner may be between making it and locking it
            if info.st_uid != os.geteuid() or not stat.S_ISDIR(info.st_mode) or time.time() - info.st_mtime < 60:
                continue
            fd = os.open(folder / _LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(folder, ignore_errors=True)
            finally:
                os.close(fd)


def start_sandbox_forwarder(socket_path: str, *, timeout: float = 10) -> int:
    """Listen on ``127.0.0.1`` (a free port) and relay every connection to ``socket_path``; return the port.

    It runs in a daemon thread with its own event loop, so it lives exactly as long as the process
    (the trial's runner) that started it.

    :raises OSError: when it cannot listen (with the reason).
    """
    ready = threading.Event()
    outcome: dict[str, object] = {}

    async def serve() -> None:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            where = f"this no-network trial's path to its policy ({socket_path}) is closed"
            await _splice(reader, writer, lambda: asyncio.open_unix_connection(socket_path), where, None)

        try:
            server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        except OSError as exc:
            outcome["error"] = exc
            ready.set()
            return
        outcome["port"] = server.sockets[0].getsockname()[1]
        ready.set()
        async with server:
            await server.serve_forever()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), name="osmosis-policy-forwarder", daemon=True)
    thread.start()
    if not ready.wait(timeout):
        raise OSError(f"the policy forwarder did not start listening within {timeout:g} s")
    error = outcome.get("error")
    if isinstance(error, OSError):
        raise OSError(f"the policy forwarder cannot listen on 127.0.0.1: {error}") from error
    port = outcome["port"]
    assert isinstance(port, int)
    return port
