"""Benchmark: HTTP clients at a hundred concurrent POSTs, the choice behind osmosis's policy client.

A plain asyncio HTTP/1.1 server in a subprocess answers every POST after a fixed latency (100 ms)
with a chat-completion body. The client sends N POSTs at a given concurrency through each client
and prints requests/s, the ratio to the ideal (concurrency / latency) and the client's CPU time
per request (``time.process_time``), all in one run:

* httpx's default ``AsyncClient`` pool;
* httpx with ``PooledTransport``, the core's own transport until it was replaced (read from the
  git history, commit ``cd59413``; the row is skipped without a git checkout);
* httpx2 on openai's aiohttp transport (``openai.DefaultAioHttpClient``, the ``openai[aiohttp]``
  extra): what the agent integrations' ``AsyncOpenAI`` clients use;
* a bare ``aiohttp.ClientSession``;
* osmosis's policy client: ``osmosis_core.chat_completion`` on the loop's aiohttp session, inside
  a rollout context (headers, size limit, JSON decode and checks included).

    python bench/http_transport.py [--requests 3000] [--concurrency 100] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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
PAYLOAD = {
    "model": "bench-model",
    "messages": [{"role": "user", "content": "What is 6 times 7? " * 10}],
    "max_tokens": 100,
}


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

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=2048)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


# -- clients ------------------------------------------------------------------------------------

Post = Callable[[], Awaitable[None]]


async def drive(post: Post, total: int, concurrency: int) -> tuple[float, float]:
    """``total`` calls of ``post``, ``concurrency`` at a time, after a warm-up wave; (wall s, CPU s)."""
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await post()

    await asyncio.gather(*(post() for _ in range(concurrency)))  # open the connections
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - wall, time.process_time() - cpu


def report(name: str, total: int, wall: float, cpu: float, concurrency: int, latency: float) -> None:
    ideal = concurrency / latency
    rate = total / wall
    print(
        f"  {name:<40} {rate:7.1f} req/s  {rate / ideal:5.2f} of ideal  client CPU {cpu / total * 1e3:5.2f} ms/request",
        flush=True,
    )


def pooled_transport_from_history() -> types.ModuleType | None:
    """The core's former ``osmosis_core/http.py`` (PooledTransport), from git history, or None."""
    try:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", "cd59413:osmosis_core/http.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType("former_osmosis_http")
    module.__file__ = str(Path(tempfile.gettempdir()) / "former_osmosis_http.py")
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


async def bench(url: str, total: int, concurrency: int, latency: float) -> None:
    import aiohttp
    import httpx

    async def run(name: str, post: Post) -> None:
        wall, cpu = await drive(post, total, concurrency)
        report(name, total, wall, cpu, concurrency, latency)

    async with httpx.AsyncClient(timeout=120.0) as client:

        async def httpx_post() -> None:
            (await client.post(url, json=PAYLOAD)).raise_for_status()

        await run("httpx default pool", httpx_post)

    former = pooled_transport_from_history()
    if former is None:
        print("  httpx + PooledTransport (former core)     skipped: needs the git history (commit cd59413)")
    else:
        transport = former.PooledTransport()
        async with httpx.AsyncClient(transport=transport, timeout=120.0, trust_env=False) as client:

            async def pooled_post() -> None:
                (await client.post(url, json=PAYLOAD)).json()

            await run("httpx + PooledTransport (former core)", pooled_post)

    import httpx2
    import openai

    async with openai.DefaultAioHttpClient(limits=httpx2.Limits(max_connections=0), timeout=120.0) as client2:

        async def httpx2_aiohttp_post() -> None:
            (await client2.post(url, json=PAYLOAD)).json()

        await run("httpx2 + aiohttp (openai's transport)", httpx2_aiohttp_post)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def aiohttp_post() -> None:
            async with session.post(url, json=PAYLOAD) as response:
                await response.json()

        await run("aiohttp ClientSession", aiohttp_post)

    from osmosis_core import PolicyEndpoint, RolloutContext, chat_completion
    from osmosis_core.http.client import http_scope

    policy = PolicyEndpoint(url.removesuffix("/chat/completions"), "bench-model")
    async with http_scope():

        async def osmosis_post() -> None:
            with RolloutContext("bench", policy):  # as each rollout does
                await chat_completion(PAYLOAD["messages"], max_tokens=100)

        await run("osmosis chat_completion (aiohttp)", osmosis_post)


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
        print(
            f"http_transport: {args.requests} POSTs, concurrency {args.concurrency}, server latency "
            f"{args.latency * 1000:.0f} ms (ideal {args.concurrency / args.latency:.0f} req/s)"
        )
        asyncio.run(
            bench(f"http://127.0.0.1:{port}/v1/chat/completions", args.requests, args.concurrency, args.latency)
        )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
