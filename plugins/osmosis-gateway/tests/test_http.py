"""The gateway's HTTP over raw sockets (aiohttp's server and client underneath): framing, keep-alive,
pipelining, ``Expect``, limits (413, 431, 400), refusals from the head whose body is never held,
back-pressure, bounded streams, idle and stalled connections; on asyncio's loop and on uvloop's
(``osmosis gateway`` runs on uvloop)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import uvloop
from gateway_helpers import MULTIPLY_TOOL, QUESTION, UPSTREAM_KEY, stack

from osmosis_core import PolicyEndpoint
from osmosis_core.http import aclose_http
from osmosis_core.testing import Fault, ScriptedPolicyServer
from osmosis_gateway import PolicyGateway
from osmosis_gateway import gateway as gateway_module

pytestmark = pytest.mark.timeout(60)

BODY = json.dumps({"model": "osmosis-stub", "messages": QUESTION, "tools": [MULTIPLY_TOOL]}).encode()


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Callable[[], Awaitable[None]]], None]:
    """Runs a test's coroutine on asyncio's loop, then on uvloop's, closing the loop's HTTP clients."""
    runner = asyncio.run if request.param == "asyncio" else uvloop.run

    def go(main: Callable[[], Awaitable[None]]) -> None:
        async def wrapped() -> None:
            try:
                await main()
            finally:
                await aclose_http()

        runner(wrapped())

    return go


def port_of(gateway: PolicyGateway) -> int:
    return int(gateway.url.rsplit(":", 1)[1].split("/")[0])


def call(rollout: str, token: str, body: bytes = BODY, extra: str = "", version: str = "1.1") -> bytes:
    head = (
        f"POST /v1/rollouts/{rollout}/chat/completions HTTP/{version}\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def chunked_head(token: str, extra: str = "") -> str:
    return (
        f"POST /v1/rollouts/r/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Transfer-Encoding: chunked\r\n{extra}\r\n"
    )


async def exchange(port: int, data: bytes, *, wait: float = 10) -> bytes:
    """Send raw bytes; what came back before the gateway closed (or ``wait`` passed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    received = b""
    try:
        async with asyncio.timeout(wait):
            while chunk := await reader.read(65536):
                received += chunk
    except (TimeoutError, ConnectionError):
        pass
    writer.close()
    return received


def answers(raw: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each answer on a connection (bodies with a Content-Length)."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status == 100:
            raw = rest
            continue
        length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
        found.append((status, rest[:length]))
        raw = rest[length:]
    return found


def rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def test_pipelined_calls_are_answered_in_order_and_a_close_ends_the_connection(run) -> None:
    async def main() -> None:
        async with stack() as (server, gateway):
            slow, fast = gateway.open_rollout("slow"), gateway.open_rollout("fast")
            server.inject(Fault("delay", delay=0.3), rollout_id="slow")
            data = (
                call("slow", slow.api_key)
                + call("fast", fast.api_key)
                + call("fast", fast.api_key, extra="Connection: close\r\n")
            )
            got = answers(await exchange(port_of(gateway), data))
            assert [status for status, _ in got] == [200, 200, 200]
            assert [json.loads(body)["id"] is not None for _, body in got] == [True] * 3
            assert [c.status for c in gateway.pop_trace("slow").calls] == ["ok"]
            assert [c.status for c in gateway.pop_trace("fast").calls] == ["ok", "ok"]
            assert [r.rollout_id for r in server.requests] == ["slow", "fast", "fast"]  # in order

    run(main)


def test_chunked_bodies_expect_continue_and_http_1_0(run) -> None:
    async def main() -> None:
        async with stack() as (_server, gateway):
            policy = gateway.open_rollout("r")
            port = port_of(gateway)
            head = chunked_head(policy.api_key, "Connection: close\r\n")
            chunked = (
                head.encode() + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (BODY[:40], BODY[40:])) + b"0\r\n\r\n"
            )
            assert [s for s, _ in answers(await exchange(port, chunked))] == [200]
            # Expect: 100-continue: a call that may go on is told to send its body ...
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(call("r", policy.api_key, extra="Expect: 100-continue\r\n")[: -len(BODY)])
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(BODY)
            assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200 OK")
            writer.close()
            # ... one that may not is refused from its head, with no 100 Continue
            refused = await exchange(port, call("r", "forged", extra="Expect: 100-continue\r\n")[: -len(BODY)], wait=2)
            assert refused.startswith(b"HTTP/1.1 403 ")
            # an HTTP/1.0 client: answered, then closed
            old = await exchange(port, call("r", policy.api_key, version="1.0"))
            assert [s for s, _ in answers(old)] == [200]
            assert [c.status for c in gateway.pop_trace("r").calls] == ["ok", "ok", "ok"]

    run(main)


def test_limits_and_bad_requests_are_refused(run, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        monkeypatch.setattr(gateway_module, "_MAX_BODY", 1000)
        async with stack() as (server, gateway):
            policy = gateway.open_rollout("r")
            port = port_of(gateway)
            # over the limit by its Content-Length: refused from the head, the body never sent
            declared = call("r", policy.api_key, b"")[:-4].replace(b"Content-Length: 0", b"Content-Length: 5000")
            assert (await exchange(port, declared + b"\r\n\r\n")).startswith(b"HTTP/1.1 413 ")
            head = chunked_head(policy.api_key)
            chunked = head.encode() + b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n"  # over it once read
            assert (await exchange(port, chunked)).startswith(b"HTTP/1.1 413 ")
            huge_header = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n"
            assert (await exchange(port, huge_header)).split(b" ", 2)[1] == b"431"
            assert (await exchange(port, b"NOT HTTP AT ALL\r\n\r\n")).split(b" ", 2)[1] == b"400"
            assert server.requests == []
            # (refused from its head, the first left no record; the chunked one was a call being sent)
            assert [(c.status, c.http_status) for c in gateway.pop_trace("r").calls] == [("bad_request", 413)]

    run(main)


def test_a_header_line_without_end_is_refused_not_buffered(run) -> None:
    async def main() -> None:
        async with stack() as (_server, gateway):
            for head in (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ", b"GET /health HTTP/1.1\r\nX-"):
                reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gateway))
                writer.write(head)
                before = rss_mib()
                try:
                    for _ in range(1024):  # 64 MiB of one header line
                        writer.write(b"a" * 65536)
                        await writer.drain()
                except ConnectionError:
                    pass  # refused after 64 KiB and closed: the rest is never read
                assert rss_mib() - before < 32
                try:
                    assert (await reader.read(65536)).split(b" ", 2)[1] == b"431"
                except ConnectionError:
                    pass  # (the answer may be lost to the reset of a client that went on writing)
                writer.transport.abort()

    run(main)


def test_a_refused_call_is_answered_from_its_head_and_its_body_is_never_held(run) -> None:
    async def main() -> None:
        async with stack() as (server, gateway):
            policy = gateway.open_rollout("r")
            base = f"{gateway.url}/rollouts/r/chat/completions"
            async with httpx.AsyncClient() as client:
                chunks = iter([b"y" * (1 << 20)] * 48)
                before = rss_mib()

                async def body() -> AsyncIterator[bytes]:
                    for piece in chunks:
                        yield piece

                forged = await client.post(base, content=body(), headers={"Authorization": "Bearer forged"})
                assert forged.status_code == 403
                assert rss_mib() - before < 32  # 48 MiB sent, none of it held
                ok = await client.post(base, content=BODY, headers={"Authorization": f"Bearer {policy.api_key}"})
                assert ok.status_code == 200
            assert [r.rollout_id for r in server.requests] == ["r"]  # the refused call never went upstream

    run(main)


def test_a_rollout_sending_a_body_too_large_reads_the_413(run, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        monkeypatch.setattr(gateway_module, "_MAX_BODY", 1 << 20)
        async with stack() as (_server, gateway):
            policy = gateway.open_rollout("r")
            async with httpx.AsyncClient() as client:
                for _ in range(2):
                    reply = await client.post(
                        policy.chat_completions_url,
                        content=b"x" * (20 << 20),
                        headers={"Authorization": f"Bearer {policy.api_key}"},
                    )
                    assert reply.status_code == 413

    run(main)


def test_idle_and_stalled_connections_are_closed(run, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        monkeypatch.setattr(gateway_module, "_IDLE_SEC", 0.3)
        monkeypatch.setattr(gateway_module, "_BODY_STALL_SEC", 0.3)
        async with stack() as (_server, gateway):
            policy = gateway.open_rollout("r")
            port = port_of(gateway)
            partial = call("r", policy.api_key)
            for sent in (b"", b"GET /health HTTP/1.1\r\nHo", partial[:-10]):  # nothing, half a head, half a body
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(sent)
                assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()
            (stalled,) = gateway.pop_trace("r").calls  # the call whose body stalled, recorded as given up
            assert stalled.status == "client_gone"
            assert "stalled" in stalled.error

    run(main)


def test_a_rollout_that_stops_reading_a_stream_holds_it_back(run) -> None:
    async def main() -> None:
        async with ScriptedPolicyServer(flavor="vllm") as server:
            upstream = PolicyEndpoint(server.url, "osmosis-stub", max_response_bytes=1 << 30)
            async with PolicyGateway(upstream) as gateway:
                policy = gateway.open_rollout("r")
                server.inject(Fault("oversize", size=200 << 20), rollout_id="r")
                reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gateway))
                body = json.dumps({"model": "m", "messages": QUESTION, "stream": True}).encode()
                writer.write(call("r", policy.api_key, body))
                await reader.read(65536)  # the head and the first events; then nothing is read
                before = rss_mib()
                await asyncio.sleep(1.0)
                assert rss_mib() - before < 48  # not 200 MiB: the upstream is read as the rollout reads
                assert gateway.trace("r").calls[0].status == "pending"
                writer.transport.abort()
                trace = gateway.pop_trace("r")
        assert trace.calls[0].status in ("client_gone", "cancelled")

    run(main)


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_over_the_limit_is_refused_streamed_or_not(run, stream: bool) -> None:
    async def main() -> None:
        async with ScriptedPolicyServer(api_key=UPSTREAM_KEY, flavor="vllm") as server:
            upstream = PolicyEndpoint(server.url, "osmosis-stub", UPSTREAM_KEY, max_response_bytes=1 << 20)
            async with PolicyGateway(upstream) as gateway:
                policy = gateway.open_rollout("r")
                server.inject(Fault("oversize", size=8 << 20), rollout_id="r")
                body = json.dumps({"model": "m", "messages": QUESTION, "stream": stream}).encode()
                raw = await exchange(port_of(gateway), call("r", policy.api_key, body, extra="Connection: close\r\n"))
                trace = gateway.pop_trace("r")
        assert len(raw) < 2 << 20  # what reached the rollout: never the 8 MiB
        (recorded,) = trace.calls
        assert recorded.status == "upstream_error"
        assert "limit" in recorded.error or "too large" in recorded.error
        if stream:
            assert raw.startswith(b"HTTP/1.1 200 ")  # the stream had begun: it is cut
            assert not raw.endswith(b"0\r\n\r\n")
        else:
            assert raw.startswith(b"HTTP/1.1 502 ")

    run(main)


def test_the_gateway_speaks_http_only_through_aiohttp() -> None:
    """No protocol code of the gateway's own: serving and calling the upstream are aiohttp's (the
    httptools server and client it once carried are gone, and so is the dependency)."""
    import subprocess
    import sys

    probe = (
        "import sys, osmosis_gateway.gateway, osmosis_gateway.call\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('httptools', 'aiohttp')"
        " and m.split('.')[-1] in ('httptools', 'web_server', 'client')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "httptools" not in out
    assert "'aiohttp.web_server'" in out
    assert "'aiohttp.client'" in out
    import osmosis_gateway

    package = Path(osmosis_gateway.__file__).parent
    assert not (package / "server.py").exists()
    assert not (package / "upstream.py").exists()


def test_a_bearer_that_is_not_utf8_is_refused_not_a_500(run) -> None:
    async def main() -> None:
        async with stack() as (_server, gateway):
            gateway.open_rollout("r")
            raw = call("r", "x").replace(b"Bearer x", b"Bearer \xff\xfe")
            answer = await exchange(port_of(gateway), raw.replace(b"Host: x", b"Host: x\r\nConnection: close"))
            assert answer.split(b" ", 2)[1] == b"403"

    run(main)


def test_a_body_that_trickles_in_is_read_and_only_a_stall_gives_up(run, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        monkeypatch.setattr(gateway_module, "_BODY_STALL_SEC", 0.3)
        async with stack() as (_server, gateway):
            policy = gateway.open_rollout("r")
            reader, writer = await asyncio.open_connection("127.0.0.1", port_of(gateway))
            data = call("r", policy.api_key, extra="Connection: close\r\n")
            head, body = data[: -len(BODY)], data[-len(BODY) :]
            writer.write(head)
            for start in range(0, len(body), len(body) // 8 + 1):  # about 1 s in all, never 0.3 s without a byte
                writer.write(body[start : start + len(body) // 8 + 1])
                await writer.drain()
                await asyncio.sleep(0.12)
            assert [s for s, _ in answers(await asyncio.wait_for(reader.read(), 10))] == [200]
            writer.close()
            assert [c.status for c in gateway.pop_trace("r").calls] == ["ok"]

    run(main)


def test_a_line_the_server_cannot_parse_is_logged_without_its_text(run, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with stack() as (_server, gateway):
            bad = f"GET /health HTTP/1.1\r\nAuthorization: Bearer {gateway.bearer}\r\n X-Folded: y\r\n\r\n"
            with caplog.at_level(logging.DEBUG):
                assert (await exchange(port_of(gateway), bad.encode())).split(b" ", 2)[1] == b"400"
            assert gateway.bearer not in caplog.text
            assert "Traceback" not in caplog.text

    run(main)


def test_closing_the_loops_shared_clients_leaves_the_gateways_calls_alone(run) -> None:
    """The gateway has a client session of its own: a backend's or a script's ``aclose_http()`` on
    the same loop (``LocalBackend.aclose``, ``http_scope``) does not cut its calls."""

    async def main() -> None:
        async with stack() as (server, gateway):
            policy = gateway.open_rollout("r")
            server.inject(Fault("delay", delay=0.3), rollout_id="r")
            async with httpx.AsyncClient() as client:
                call_task = asyncio.ensure_future(
                    client.post(
                        policy.chat_completions_url, content=BODY, headers={"Authorization": f"Bearer {policy.api_key}"}
                    )
                )
                await asyncio.sleep(0.1)
                await aclose_http()  # (the loop's shared session, as a backend's aclose closes it)
                assert (await call_task).status_code == 200
            assert [c.status for c in gateway.pop_trace("r").calls] == ["ok"]

    run(main)
