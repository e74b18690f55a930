"""Throughput of the stub policy server under injected latency.

Starts ``python -m osmosis_core.testing.policy_server --latency L`` in a subprocess and drives N
chat-completion requests over C keep-alive connections made with raw ``asyncio.open_connection``
(httpx's pool is too slow to measure the server).  With latency L the ideal rate is C / L requests/s;
the script prints the achieved rate and its ratio to that ideal (target >= 0.9).

    python bench/policy_server_rate.py [--requests 3000] [--concurrency 100] [--latency 0.1] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _request_bytes(port: int, stream: bool) -> bytes:
    body = json.dumps(
        {
            "model": "osmosis-stub",
            "messages": [
                {"role": "system", "content": "You multiply numbers. Use the multiply tool."},
                {"role": "user", "content": "Multiply the numbers.\nval1 = 12\nval2 = 7"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "multiply",
                        "parameters": {
                            "type": "object",
                            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                        },
                    },
                }
            ],
            "stream": stream,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


async def _drive(port: int, total: int, concurrency: int, stream: bool) -> tuple[float, int]:
    request = _request_bytes(port, stream)
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]
    # one warm-up request per connection, not timed
    for _, writer in conns:
        writer.write(request)
    for reader, _ in conns:
        await _read_response(reader)

    remaining = total
    errors = 0

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal remaining, errors
        while remaining > 0:
            remaining -= 1
            writer.write(request)
            if await _read_response(reader) != 200:
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(r, w) for r, w in conns))
    elapsed = time.perf_counter() - start
    for _, writer in conns:
        writer.close()
    return elapsed, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--stream", action="store_true", help="request SSE streams")
    parser.add_argument("--min-ratio", type=float, default=0.0, help="exit 1 below this ratio to ideal")
    args = parser.parse_args()

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "osmosis_core.testing.policy_server", "--latency", str(args.latency)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("osmosis stub policy listening on "):
            print(f"server did not start: {line!r}", file=sys.stderr)
            return 1
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        cpu0 = _cpu_seconds(proc.pid)
        elapsed, errors = asyncio.run(_drive(port, args.requests, args.concurrency, args.stream))
        cpu = _cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        rc = proc.wait(timeout=10)

    rate = args.requests / elapsed
    ideal = args.concurrency / args.latency if args.latency > 0 else float("inf")
    ratio = rate / ideal if args.latency > 0 else float("nan")
    print(
        f"{args.requests} requests, concurrency {args.concurrency}, latency {args.latency}s"
        f"{', stream' if args.stream else ''}: {elapsed:.3f}s, {rate:.0f} requests/s, "
        f"ideal {ideal:.0f}/s, ratio {ratio:.3f}, errors {errors}, "
        f"server CPU {cpu:.2f}s ({cpu / elapsed:.0%} of one core), server exit {rc}"
    )
    return 1 if ratio < args.min_ratio or errors or rc != 0 else 0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    raise SystemExit(main())
