"""Helpers: the scripted server (real HTTP on 127.0.0.1) with a real gateway in front of it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from osmosis_core import PolicyEndpoint
from osmosis_core.http import aclose_http
from osmosis_core.testing import ScriptedPolicyServer, calculator
from osmosis_gateway import PolicyGateway

REPO = Path(__file__).resolve().parents[3]
UPSTREAM_KEY = "sk-Qx7vR2kZp9WmT4nJ-0123456789"  # no word a message holds: any 8 of its characters are redacted
QUESTION = [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What is 12 times 7?"},
]
MULTIPLY_TOOL = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    },
}


def run[T](main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main`` in a fresh event loop, closing the loop's HTTP clients after it."""

    async def wrapped() -> T:
        try:
            return await main()
        finally:
            await aclose_http()

    return asyncio.run(wrapped())


@asynccontextmanager
async def stack(
    *,
    flavor: str = "vllm",
    adapter: str = "vllm",
    api_key: str | None = UPSTREAM_KEY,
    script: Any = calculator,
    **options: Any,
) -> AsyncIterator[tuple[ScriptedPolicyServer, PolicyGateway]]:
    """A scripted upstream (requiring ``api_key``) and a started gateway in front of it (``options``:
    the gateway's)."""
    async with ScriptedPolicyServer(script, api_key=api_key, flavor=flavor) as server:  # type: ignore[arg-type]
        upstream = PolicyEndpoint(server.url, "osmosis-stub", api_key)
        async with PolicyGateway(upstream, adapter=adapter, **options) as gateway:  # type: ignore[arg-type]
            yield server, gateway


async def post(
    url: str, body: dict[str, Any], *, token: str | None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """POST JSON; the status and the raw body."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=sent) as response:
        return response.status, await response.read()


def sse_docs(raw: bytes) -> list[dict[str, Any]]:
    """The JSON documents of an event stream (without ``[DONE]``)."""
    docs = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            docs.append(json.loads(line[6:]))
    return docs


async def raw_upstream(answer: Any) -> tuple[asyncio.Server, str, list[bytes]]:
    """An upstream that reads each request (its head and Content-Length body) and runs
    ``await answer(request, writer)``; the requests it got are listed."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
                )
                seen.append(head + await reader.readexactly(length))
                if not await answer(seen[-1], writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", seen


async def call_through(url: str, body: dict | bytes, *, api_key: str | None = None, **gateway_options: Any):
    """One call through a gateway in front of ``url``: (status, answer body, the call's record)."""
    async with PolicyGateway(PolicyEndpoint(url, "m", api_key), **gateway_options) as gateway:
        policy = gateway.open_rollout("r")
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {policy.api_key}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as session:
            try:
                async with session.post(policy.chat_completions_url, data=data, headers=headers) as response:
                    status, raw = response.status, await response.read()
            except aiohttp.ClientError:
                status, raw = None, b""
        trace = gateway.pop_trace("r")
    return status, raw, trace


async def answer_json(writer: asyncio.StreamWriter, doc: Any, status: bytes = b"200 OK") -> bool:
    """Write ``doc`` as a whole JSON answer (for :func:`raw_upstream`); True: the connection goes on."""
    body = json.dumps(doc).encode()
    head = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (status, len(body))
    writer.write(head + body)
    await writer.drain()
    return True
