"""The relay of a no-network trial, without a sandbox: a real unix socket, real TCP on loopback, the
scripted policy server; streaming answers and several calls on one connection pass through whole."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
import httpx
import pytest

from osmosis_core.testing import ScriptedPolicyServer
from osmosis_harbor.relay import HostRelay, loopback_address, parse_address, start_sandbox_forwarder, via_port


def test_calls_and_streams_cross_the_relay_and_it_leaves_nothing(tmp_path):
    with ScriptedPolicyServer() as server:
        target = loopback_address(server.url)
        assert target == ("127.0.0.1", server.port)

        async def main() -> tuple[list[int], str, Path]:
            relay = HostRelay(target)
            socket = await relay.start()
            assert oct(socket.stat().st_mode & 0o777) == "0o600"
            assert oct(socket.parent.stat().st_mode & 0o777) == "0o700"
            port = await anyio.to_thread.run_sync(start_sandbox_forwarder, str(socket))
            base = via_port(server.url, port)
            body = {"model": "osmosis-stub", "messages": [{"role": "user", "content": "What is 2 times 3?"}]}
            try:
                async with httpx.AsyncClient(base_url=base, timeout=10) as client:  # one kept-alive connection
                    plain = [(await client.post("/chat/completions", json=body)).status_code for _ in range(3)]
                    async with client.stream("POST", "/chat/completions", json={**body, "stream": True}) as answer:
                        streamed = "".join([chunk async for chunk in answer.aiter_text()])
            finally:
                await relay.aclose()
            return plain, streamed, socket

        plain, streamed, socket = anyio.run(main)
        assert plain == [200, 200, 200]
        assert streamed.rstrip().endswith("data: [DONE]")
        assert len(server.requests) == 4
    assert not socket.parent.exists()  # closed: the socket and its folder are gone


def test_a_relay_folder_is_swept_only_when_no_process_holds_its_lock():
    """The owner's flock decides, not its pid: a live owner in another PID namespace (or behind a reused
    pid) keeps its folder; one that was killed leaves a lock anyone can take."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = Path(tempfile.mkdtemp(prefix=f"osmosis-relay-{int(dead.stdout)}-"))
    held = Path(tempfile.mkdtemp(prefix=f"osmosis-relay-{int(dead.stdout)}-"))
    for folder in (stale, held):
        (folder / "owner.lock").touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); sys.stdin.read()", str(held / "owner.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        for folder in (stale, held):
            os.utime(folder, (1, 1))  # old enough to be swept
        relay = HostRelay(("127.0.0.1", 9))

        async def main() -> None:
            await relay.start()
            await relay.aclose()

        anyio.run(main)
        assert not stale.exists()
        assert held.exists()
    finally:
        holder.communicate("")
        for folder in (stale, held):
            if folder.exists():
                (folder / "owner.lock").unlink()
                folder.rmdir()


@pytest.mark.parametrize("value", ["10.0.0.1:80", "example.org:80", "127.0.0.1", "127.0.0.1:x"])
def test_only_a_loopback_address_with_a_port_is_relayed(value):
    with pytest.raises(ValueError, match="policy_relay must be a loopback host:port"):
        parse_address(value)
    assert parse_address("[::1]:8000") == ("::1", 8000)


def test_a_closed_path_answers_a_502_that_says_which_end_is_gone(tmp_path):
    import socket as sockets

    with sockets.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]

    async def main() -> tuple[httpx.Response, httpx.Response]:
        relay = HostRelay(("127.0.0.1", free))
        socket = await relay.start()
        try:
            to_relay = await anyio.to_thread.run_sync(start_sandbox_forwarder, str(socket))
            to_nothing = await anyio.to_thread.run_sync(start_sandbox_forwarder, str(tmp_path / "gone.sock"))
            async with httpx.AsyncClient(timeout=10) as client:
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                down = await client.post(f"http://127.0.0.1:{to_relay}/v1/chat/completions", json=body)
                gone = await client.post(f"http://127.0.0.1:{to_nothing}/v1/chat/completions", json=body)
        finally:
            await relay.aclose()
        return down, gone

    down, gone = anyio.run(main)
    assert down.status_code == 502
    assert gone.status_code == 502
    assert f"the policy at 127.0.0.1:{free}, relayed into this no-network trial, is not reachable" in down.text
    assert "Connection refused" in down.text
    assert "this no-network trial's path to its policy" in gone.text
    assert "gone.sock" in gone.text


def test_past_its_share_a_trial_waits_in_the_backlog_and_holds_nothing_of_the_host():
    with ScriptedPolicyServer() as server:

        async def main() -> tuple[int, list[bytes]]:
            relay = HostRelay(loopback_address(server.url), max_connections=2)
            socket = await relay.start()
            try:
                held = [await anyio.connect_unix(socket) for _ in range(2)]
                waiting = [await anyio.connect_unix(socket) for _ in range(2)]  # in the backlog
                for stream in waiting:  # a request past the share is not read: nothing is buffered for it
                    await stream.send(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                await anyio.sleep(0.3)
                accepted = relay.open_connections
                for stream in held:
                    await stream.aclose()
                answers = [await stream.receive() for stream in waiting]  # served once there is room
                for stream in waiting:
                    await stream.aclose()
            finally:
                await relay.aclose()
            return accepted, answers

        accepted, answers = anyio.run(main)
    assert accepted == 2
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers)


def test_a_connection_quiet_both_ways_for_the_idle_timeout_is_cut():
    with ScriptedPolicyServer() as server:

        async def main() -> tuple[bytes, float, int]:
            relay = HostRelay(loopback_address(server.url), idle_timeout=0.3)
            socket = await relay.start()
            try:
                async with await anyio.connect_unix(socket) as stream:
                    await stream.send(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                    answer = await stream.receive()
                    started = anyio.current_time()
                    with anyio.fail_after(5):
                        rest = b"".join([chunk async for chunk in stream])
                    quiet = anyio.current_time() - started
                await anyio.sleep(0.05)
                return answer + rest, quiet, relay.open_connections
            finally:
                await relay.aclose()

        answer, quiet, left = anyio.run(main)
    assert answer.startswith(b"HTTP/1.1 200")
    assert 0.2 < quiet < 3
    assert left == 0
