"""The one path from a ``no-network`` trial to its policy: a unix socket, relayed on both sides.

A trial of a task with ``network_mode = "no-network"`` runs in its own network namespace, which
has nothing but its own loopback: no host loopback, no outside address, no DNS. To reach its
policy (with ``osmosis run --traces``, the policy gateway; else the ``[policy]`` itself) it gets:

* on the host, in the osmosis process, a :class:`HostRelay` for that trial alone: a unix socket in
  a private temporary folder (``0700``; the socket is the sandbox's root's, ``0600``) whose every
  connection is relayed, byte for byte, to the policy's one address, an ``http://`` endpoint on the
  host's loopback (:func:`loopback_address`). Nothing else of the host is behind it;
* that socket bound read-only into the sandbox at :data:`POLICY_SOCKET` (a mount point the trial
  cannot remove or replace);
* inside the sandbox, before the workflow starts, a forwarder (:func:`start_sandbox_forwarder`: a
  thread of the trial's runner, with its own event loop, so a workflow that blocks its own loop does
  not block its calls) listening on the sandbox's own ``127.0.0.1``, relaying each connection to
  the socket. The workflow's policy ``base_url`` points there (:func:`via_port`), path and token
  unchanged.

The relay does not read what crosses it: the gateway authorizes every call with the rollout's own
token, which is all a trial holds, so a trial can write only its own trace (another rollout id is
refused with 403, the gateway's own routes with 401/403). Nothing here outlives the trial: the
forwarder dies with the runner (and its sandbox's PID namespace), the host relay is closed when the
trial's environment stops and is part of the osmosis process, so it dies with it, even on
``kill -9``.

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
import ipaddress
import json
import os
import shutil
import tempfile
import threading
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


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then pass the end on (half-close)."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, problem: str) -> None:
    """Answer the connection's (first) HTTP request with a 502 that says ``problem``, then close it.

    The request is read first (headers, then a ``Content-Length`` body), so the client gets the
    answer rather than a reset.
    """
    with contextlib.suppress(Exception):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length" and value.strip().isdigit():
                await asyncio.wait_for(reader.readexactly(min(int(value.strip()), _MAX_UNREAD)), 5)
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
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connect: Connect, unreachable: str
) -> None:
    """Relay one accepted connection to a new connection made by ``connect`` (both ways), then close both.

    When ``connect`` fails, the caller gets an HTTP 502 saying ``unreachable`` and why, not a bare hang-up.
    """
    try:
        far_reader, far_writer = await connect()
    except OSError as exc:
        await _refuse(reader, writer, f"osmosis: {unreachable}: {os.strerror(exc.errno) if exc.errno else exc}")
        return
    try:
        await asyncio.gather(_pipe(reader, far_writer), _pipe(far_reader, writer))
    finally:
        for end in (writer, far_writer):
            end.close()


class HostRelay:
    """One trial's unix socket on the host, relayed to the policy's loopback ``(host, port)``.

    :param target: the policy's address (:func:`loopback_address`).
    :param owner: the host ``(uid, gid)`` of the sandbox's root, which gets the socket; None: this process's.
    :param max_connections: connections relayed at once; more are answered with a 502 (a trial cannot
        use up the osmosis process's file descriptors, which every trial shares).
    """

    def __init__(
        self, target: tuple[str, int], owner: tuple[int, int] | None = None, *, max_connections: int = 256
    ) -> None:
        self.target = target
        self.owner = owner
        self.max_connections = max_connections
        self._folder: Path | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def socket(self) -> Path:
        """The socket's host path (while started)."""
        if self._folder is None:
            raise RuntimeError("the relay is not started")
        return self._folder / "policy.sock"

    async def start(self) -> Path:
        """Listen on a fresh socket (in a folder only this user can enter); return its path."""
        # a short path (a unix socket's is at most 107 bytes): the trial's folder may be deep
        _sweep()
        self._folder = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket))
            os.chmod(self.socket, 0o600)
            if self.owner is not None:
                os.chown(self.socket, *self.owner)
        except BaseException:
            await self.aclose()
            raise
        return self.socket

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if len(self._connections) > self.max_connections:
                problem = f"osmosis: this trial has {self.max_connections} connections to its policy open already"
                await _refuse(reader, writer, problem)
                return
            host, port = self.target
            where = f"the policy at {host}:{port}, relayed into this no-network trial, is not reachable"
            await _splice(reader, writer, lambda: asyncio.open_connection(host, port), where)
        except asyncio.CancelledError:
            writer.close()  # cut by aclose(); ending quietly (asyncio logs a connection task that ends cancelled)
        finally:
            self._connections.discard(task)

    async def aclose(self) -> None:
        """Stop listening, cut the connections in flight, remove the socket."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
        folder, self._folder = self._folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _sweep() -> None:
    """Remove the socket folders of osmosis processes that are gone (killed before closing their relays)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*-*"):
        pid = folder.name[len(_PREFIX) :].split("-", 1)[0]
        with contextlib.suppress(OSError):
            if pid.isdigit() and not Path(f"/proc/{pid}").exists() and folder.lstat().st_uid == os.geteuid():
                shutil.rmtree(folder, ignore_errors=True)


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
            await _splice(reader, writer, lambda: asyncio.open_unix_connection(socket_path), where)

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
