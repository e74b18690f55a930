"""Benchmark: httpx's default AsyncClient transport vs osmosis_core.http.PooledTransport.

A raw-asyncio HTTP/1.1 server runs in a subprocess and answers every POST after a fixed
latency (100 ms) with a chat-completion-like JSON body. The client sends N POSTs at a given
concurrency through (a) ``httpx.AsyncClient()`` and (b) ``httpx.AsyncClient`` with a
``PooledTransport``, and prints requests/s, the ratio to the ideal (concurrency / latency)
and the client's CPU time per request (``time.process_time``).

    python bench/http_transport.py [--requests 3000] [--concurrency 100] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from osmosis_core.http import PooledTransport

RESPONSE_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "bench-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The answer is 42. " * 20},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 100, "total_tokens": 220},
    }
).encode()


# -- server (subprocess) -------------------------------------------------------------------------


async def serve(latency: float) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(RESPONSE_BODY)
    reply = head + RESPONSE_BODY

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in request_head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                await asyncio.sleep(latency)
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


# -- client ------------------------------------------------------------------------------------


async def drive(client: httpx.AsyncClient, url: str, total: int, concurrency: int) -> tuple[float, float]:
    """Send ``total`` POSTs, ``concurrency`` at a time; return (wall seconds, CPU seconds)."""
    payload = {
        "model": "bench-model",
        "messages": [{"role": "user", "content": "What is 6 times 7? " * 10}],
        "max_tokens": 100,
    }
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            response = await client.post(url, json=payload)
            response.raise_for_status()
            response.json()

    # Warm-up: open the connections.
    await asyncio.gather(*(client.post(url, json=payload) for _ in range(concurrency)))
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - wall, time.process_time() - cpu


def report(name: str, total: int, wall: float, cpu: float, concurrency: int, latency: float) -> None:
    ideal = concurrency / latency
    rate = total / wall
    print(
        f"{name:<28} {rate:8.1f} req/s  {rate / ideal:6.1%} of ideal ({ideal:.0f} req/s)  "
        f"client CPU {cpu / total * 1e6:7.0f} us/request  ({wall:.1f} s wall)",
        flush=True,
    )


async def bench(url: str, total: int, concurrency: int, latency: float) -> None:
    async with httpx.AsyncClient(timeout=120.0) as client:
        wall, cpu = await drive(client, url, total, concurrency)
    report("httpx default transport", total, wall, cpu, concurrency, latency)
    async with httpx.AsyncClient(transport=PooledTransport(), timeout=120.0, trust_env=False) as client:
        wall, cpu = await drive(client, url, total, concurrency)
    report("httpx + PooledTransport", total, wall, cpu, concurrency, latency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.1, help="server latency in seconds")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.latency))
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--latency", str(args.latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        latency_ms = args.latency * 1000
        print(f"{args.requests} POSTs, concurrency {args.concurrency}, server latency {latency_ms:.0f} ms")
        asyncio.run(
            bench(f"http://127.0.0.1:{port}/v1/chat/completions", args.requests, args.concurrency, args.latency)
        )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
