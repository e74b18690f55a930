"""What the policy gateway costs: two-call rollouts through it against the same rollouts without it.

The scripted server (``--flavor vllm``, 100 ms per call) runs in a child process, and so does the
gateway (``PolicyGateway``, vLLM adapter), so neither's CPU counts against the driver, and the
gateway's own CPU time is read from ``/proc`` around its phase. The driver (this process, one
aiohttp session) runs N two-call tool-calling rollouts at concurrency C: straight to the server,
then through the gateway (each rollout at its own URL with its own token, every call captured),
alternating, best of ``--repeat`` kept. Then it captures 10,000 calls at a higher concurrency
without popping a trace and reads the gateway's RSS growth.

    python bench/gateway_overhead.py [--rollouts 1000] [--concurrency 100] [--latency 0.1] [--repeat 3] [--stream]
    python bench/gateway_overhead.py --instructions [--stream]    # callgrind: instructions per call

The gateway is served and calls the stand-in with aiohttp (its low-level server and the core's
pooled client session), and runs on uvloop, as ``osmosis gateway`` does (``GATEWAY_BENCH_UVLOOP=0``:
asyncio's loop).

It also prints the stand-in's and the driver's CPU per call in the gateway phase and the machine's
load average before and after: on a shared machine the CPU times are noisy (the same build reads
differently from run to run), and ``--instructions`` is the steady measure: the
gateway child under ``valgrind --tool=callgrind``, its user-space instructions per call over 300
two-call rollouts (concurrency 20, 10 ms per call) after 100 to warm up; the kernel's share (the
sockets' send and receive, about a fifth of the CPU time) is not counted.

What the ratio depends on: every ratio printed is taken within this one run (each repeat times
the rollouts without the gateway, then through it, then through a byte relay; each pair's ratio is
printed, and the best of each side), so the machine's load shifts both sides alike, but not
equally. The stand-in, the driver and the gateway are three processes on the same cores (two on
the machine this was written on, shared with other work): at concurrency 100 and 100 ms per call,
the calls come in waves of up to 100, and each process works through a wave one call at a time,
so whatever CPU the gateway spends on a call is added to the wave's time whenever the cores are
full; "cores busy" (the three processes' CPU over the phase's time) says how close to full they
were on average.

The hop's floor: the third side of each repeat goes through a byte relay (``_Relay``: plain
asyncio protocols on the same loop, each side's bytes written to the other as they come, no HTTP
read, nothing captured). It costs about 0.05 ms of CPU per call and 0.98 to 1.0 of the throughput
without it, so the hop itself (a third process, two more sockets) is nearly free, and what the
gateway loses beyond it is its own CPU per call.

Targets: throughput with the gateway over without it >= 0.93; gateway CPU per call <= 0.45 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        },
    }
]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- the gateway child ---------------------------------------------------------------------------


async def serve_gateway(upstream: str, ids: int) -> None:
    import gc

    from osmosis_core import PolicyEndpoint
    from osmosis_core.http import aclose_http
    from osmosis_gateway import PolicyGateway

    gateway = PolicyGateway(PolicyEndpoint(upstream, "osmosis-stub"), adapter="vllm")
    await gateway.start()
    tokens = {f"r{i}": gateway.open_rollout(f"r{i}").api_key for i in range(ids)}
    gc.freeze()
    print(json.dumps({"url": gateway.url, "tokens": tokens}), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin
    complete = sum(1 for i in range(ids) if (t := gateway.trace(f"r{i}")) and t.calls and t.complete)
    print(json.dumps({"complete_traces": complete}), flush=True)
    await gateway.aclose()
    await aclose_http()


# -- the hop's floor: a byte relay ---------------------------------------------------------------


class _Relay(asyncio.Protocol):
    """One side of a relayed connection: what it reads is written to its peer; a peer that cannot
    take more pauses this side's reading (the least a proxy must do; no HTTP is read)."""

    def __init__(self, upstream: tuple[str, int] | None = None) -> None:
        self.upstream = upstream  # set on the client's side: where to connect
        self.transport: asyncio.Transport | None = None
        self.peer: _Relay | None = None
        self.early: list[bytes] = []  # what came before the peer was connected
        self.connecting: asyncio.Task[None] | None = None  # (held: the loop keeps only a weak reference)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is no asyncio.Transport subclass)
        if self.upstream is not None:
            self.connecting = asyncio.get_running_loop().create_task(self._connect(*self.upstream))

    async def _connect(self, host: str, port: int) -> None:
        assert self.transport is not None
        try:
            peer_transport, peer = await asyncio.get_running_loop().create_connection(_Relay, host, port)
        except OSError:
            self.transport.close()
            return
        if self.transport.is_closing():
            peer_transport.close()
            return
        self.peer, peer.peer = peer, self
        peer_transport.writelines(self.early)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early.append(data)
        else:
            assert self.peer.transport is not None
            self.peer.transport.write(data)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def serve_relay(upstream: str) -> None:
    """Relay 127.0.0.1:<port> to the stand-in byte for byte, until the parent closes our stdin."""
    from urllib.parse import urlsplit

    target = urlsplit(upstream)
    host, port = target.hostname, target.port
    assert host is not None
    assert port is not None
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Relay((host, port)), "127.0.0.1", 0)
    print(json.dumps({"url": f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{target.path}"}), flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()


# -- the driver ----------------------------------------------------------------------------------


async def rollout(session: Any, url: str, token: str | None, n: int, stream: bool) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"What is {n % 97} times 7?"}]
    for _turn in range(2):
        body = {"model": "osmosis-stub", "messages": messages, "tools": TOOLS, "stream": stream}
        async with session.post(url, json=body, headers=headers) as response:
            raw = await response.read()
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {raw[:200]!r}")
        message: dict[str, Any] = (
            {"role": "assistant", "content": None} if stream else json.loads(raw)["choices"][0]["message"]
        )
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "84"}]
        else:
            messages += [message or {"role": "assistant", "content": "84"}, {"role": "tool", "content": "84"}]


async def phase(urls: Sequence[tuple[str, str | None]], concurrency: int, stream: bool) -> float:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        queue = iter(enumerate(urls))

        async def worker() -> None:
            for n, (url, token) in queue:
                await rollout(session, url, token, n, stream)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


def start_child(arguments: list[str], wrapper: list[str] | None = None) -> tuple[subprocess.Popen[str], Any]:
    """A child of this script (under ``wrapper``, e.g. valgrind) and the line it prints when ready."""
    child = subprocess.Popen(
        [*(wrapper or []), sys.executable, __file__, *arguments],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if wrapper else None,
        text=True,
    )
    assert child.stdout is not None
    return child, json.loads(child.stdout.readline())


def start_gateway(
    upstream: str, ids: int, wrapper: list[str] | None = None
) -> tuple[subprocess.Popen[str], str, dict[str, str]]:
    """The gateway child (under ``wrapper``, e.g. valgrind), its URL and each rollout's token."""
    child, ready = start_child(["--serve-gateway", upstream, str(ids)], wrapper)
    return child, ready["url"], ready["tokens"]


def stop_child(child: subprocess.Popen[str], timeout: float = 30) -> Any:
    """Close the child's stdin (its signal to stop) and return the line it prints then, if any."""
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.close()
    line = child.stdout.readline()
    child.wait(timeout=timeout)
    return json.loads(line) if line else None


def instructions(stream: bool, rollouts: int = 300, warm: int = 100) -> None:
    """Print the gateway child's instructions per call (callgrind, counted only over ``rollouts``)."""
    import shutil
    import tempfile

    from osmosis_core.testing import StubPolicyProcess

    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("--instructions needs valgrind (apt-get install -y valgrind)")
    with tempfile.TemporaryDirectory() as folder, StubPolicyProcess(latency=0.01, flavor="vllm") as stub:
        out = Path(folder) / "callgrind.out"
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        child, gateway_url, tokens = start_gateway(stub.url, rollouts + warm, command)
        urls = [(f"{gateway_url}/rollouts/r{i}/chat/completions", tokens[f"r{i}"]) for i in range(rollouts + warm)]
        try:
            asyncio.run(phase(urls[:warm], 20, stream))
            subprocess.run(["callgrind_control", "--instr=on", str(child.pid)], check=True, capture_output=True)
            asyncio.run(phase(urls[warm:], 20, stream))
            subprocess.run(["callgrind_control", "--instr=off", str(child.pid)], check=True, capture_output=True)
            stop_child(child, timeout=300)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        totals = [line for line in out.read_text().splitlines() if line.startswith(("summary:", "totals:"))]
    count = max(int(line.split()[1]) for line in totals)
    calls = 2 * rollouts
    print(f"gateway instructions per call{' (streamed)' if stream else ''}: {count / calls / 1e6:.3f} M "
          f"(callgrind, user space, {calls} calls)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--instructions", action="store_true", help="count the gateway's instructions per call")
    parser.add_argument("--memory-calls", type=int, default=10_000)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--serve-gateway", nargs=2, metavar=("UPSTREAM", "IDS"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-relay", metavar="UPSTREAM", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway or args.serve_relay:
        serve = (
            serve_gateway(args.serve_gateway[0], int(args.serve_gateway[1]))
            if args.serve_gateway
            else serve_relay(args.serve_relay)
        )
        if os.environ.get("GATEWAY_BENCH_UVLOOP", "1") == "1":  # as `osmosis gateway` runs
            import uvloop

            uvloop.run(serve)
        else:
            asyncio.run(serve)
        return

    if args.instructions:
        instructions(args.stream)
        return

    from osmosis_core.testing import StubPolicyProcess

    load_before = os.getloadavg()[0]
    memory_rollouts = args.memory_calls // 2
    total_ids = args.rollouts * args.repeat + memory_rollouts
    with StubPolicyProcess(latency=args.latency, flavor="vllm") as stub:
        child, gateway_url, tokens = start_gateway(stub.url, total_ids)
        relay, ready = start_child(["--serve-relay", stub.url])
        direct_url, relay_url = stub.url + "/chat/completions", ready["url"] + "/chat/completions"
        direct: list[float] = []
        through: list[float] = []
        relayed: list[float] = []
        cpu: list[float] = []
        relay_cpu: list[float] = []
        others: list[tuple[float, float]] = []  # (stand-in, driver) CPU seconds of each phase through the gateway
        assert stub.pid is not None
        next_id = 0
        for _ in range(args.repeat):
            direct.append(asyncio.run(phase([(direct_url, None)] * args.rollouts, args.concurrency, args.stream)))
            ids = [f"r{i}" for i in range(next_id, next_id + args.rollouts)]
            next_id += args.rollouts
            urls = [(f"{gateway_url}/rollouts/{i}/chat/completions", tokens[i]) for i in ids]
            before, stub_before, driver_before = cpu_seconds(child.pid), cpu_seconds(stub.pid), time.process_time()
            through.append(asyncio.run(phase(urls, args.concurrency, args.stream)))
            cpu.append(cpu_seconds(child.pid) - before)
            others.append((cpu_seconds(stub.pid) - stub_before, time.process_time() - driver_before))
            before = cpu_seconds(relay.pid)
            relayed.append(asyncio.run(phase([(relay_url, None)] * args.rollouts, args.concurrency, args.stream)))
            relay_cpu.append(cpu_seconds(relay.pid) - before)
        stop_child(relay)
        rss_before = rss_mb(child.pid)
        ids = [f"r{i}" for i in range(next_id, next_id + memory_rollouts)]
        urls = [(f"{gateway_url}/rollouts/{i}/chat/completions", tokens[i]) for i in ids]
        asyncio.run(phase(urls, max(args.concurrency, 500), args.stream))
        rss_after = rss_mb(child.pid)
        done = stop_child(child)

    calls = 2 * args.rollouts
    ideal = calls * args.latency / args.concurrency
    best_direct, best_through = min(direct), min(through)
    print(f"{args.rollouts} two-call rollouts at concurrency {args.concurrency}, {args.latency * 1000:.0f} ms per call"
          f"{' (streamed)' if args.stream else ''}; ideal {ideal:.2f} s; {os.cpu_count()} cores, "
          f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")  # fmt: skip
    print(f"  without gateway: {best_direct:.2f} s ({ideal / best_direct:.2f} of ideal)  runs {direct}")
    print(f"  with gateway:    {best_through:.2f} s ({ideal / best_through:.2f} of ideal)  runs {through}")
    pairs = [round(d / t, 3) for d, t in zip(direct, through, strict=True)]
    print(f"  throughput with / without: {best_direct / best_through:.3f} (best of each; each repeat's pair {pairs})"
          "   (target >= 0.93)")  # fmt: skip
    per_call = min(cpu) / calls * 1000
    print(f"  gateway CPU per call: {per_call:.3f} ms   (target <= 0.45; per phase {[round(c, 2) for c in cpu]} s)")
    best = cpu.index(min(cpu))
    stub_cpu, driver_cpu = others[best]
    busy = (cpu[best] + stub_cpu + driver_cpu) / through[best]
    print(f"  CPU per call in that phase: stand-in {stub_cpu / calls * 1000:.3f} ms, "
          f"driver {driver_cpu / calls * 1000:.3f} ms (each its own process); "
          f"cores busy with the three: {busy:.2f} of {os.cpu_count()}")  # fmt: skip
    best_relayed = min(relayed)
    hop = [round(d / r, 3) for d, r in zip(direct, relayed, strict=True)]
    print(f"  the hop's floor, through a byte relay (plain asyncio on the same loop, no HTTP read): "
          f"{best_relayed:.2f} s, {best_direct / best_relayed:.3f} of without (each repeat's {hop}); "
          f"its CPU per call {min(relay_cpu) / calls * 1000:.3f} ms")  # fmt: skip
    print(f"  throughput with the gateway / through the relay: {best_relayed / best_through:.3f} "
          f"(each repeat's {[round(r / t, 3) for r, t in zip(relayed, through, strict=True)]})")  # fmt: skip
    grown = rss_after - rss_before
    print(f"  gateway RSS for {args.memory_calls} captured calls: {grown:.1f} MB "
          f"({grown * 1024 / args.memory_calls:.2f} KB a call; "
          f"{rss_before:.0f} -> {rss_after:.0f} MB); complete traces held: {done['complete_traces']}")  # fmt: skip


if __name__ == "__main__":
    main()
