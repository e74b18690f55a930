"""RolloutClient: completion order, 429s, lost connections and gateway errors, stopping early."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import subprocess
import sys
import time

import aiohttp
from aiohttp import web
from server_helpers import TOKEN, Served, read_lines, run
from workflows import EndsWithLabel, Sleepy

from osmosis_core import LocalBackend
from osmosis_server import RolloutStatus, ServerSettings, create_app
from osmosis_trainer import RolloutClient, RolloutRequest


def request(rid: str, sleep: float = 0.0, **more) -> RolloutRequest:
    return RolloutRequest(
        rollout_id=rid,
        initial_messages=[{"role": "user", "content": "hi"}],
        chat_completions_url="http://127.0.0.1:9/v1",
        label="42",
        metadata={"sleep": sleep},
        **more,
    )


def test_run_many_yields_results_in_completion_order(serve):
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel, max_concurrent=8))
    sleeps = {"slow": 0.9, "fast": 0.05, "middle": 0.45}

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        return [r.rollout_id async for r in client.run_many([request(k, v) for k, v in sleeps.items()], concurrency=3)]

    assert run(go) == ["fast", "middle", "slow"]


def test_run_many_waits_through_429s_when_the_server_is_full(serve):
    served = serve(
        LocalBackend(Sleepy, grader=EndsWithLabel, max_concurrent=1), settings=ServerSettings(max_queued=0, grace_sec=1)
    )

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        return [r async for r in client.run_many([request(f"r{i}", 0.05) for i in range(3)], concurrency=3)]

    results = run(go)
    assert sorted(r.rollout_id for r in results) == ["r0", "r1", "r2"]
    assert all(r.reward == 1.0 for r in results)
    assert served.service.health()["server"]["counts"]["refused_full"] >= 2


async def lossy_proxy(upstream: str, *, drop_first_submit: bool, bad_gateway_polls: int):
    """A reverse proxy on 127.0.0.1 that loses the answer to the first POST /rollout (after the
    server admitted it) and answers 502 to the first result polls."""
    seen = {"dropped": 0, "bad_gateway": 0}
    session = aiohttp.ClientSession()

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path.endswith("/result") and seen["bad_gateway"] < bad_gateway_polls:
            seen["bad_gateway"] += 1
            return web.Response(status=502, text="bad gateway")
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with session.request(request.method, upstream + request.path_qs, data=body, headers=headers) as answer:
            content = await answer.read()
            status = answer.status
        if drop_first_submit and request.method == "POST" and request.path == "/rollout" and not seen["dropped"]:
            seen["dropped"] += 1
            assert request.transport is not None
            request.transport.abort()  # the server admitted it; the answer never reaches the client
            return web.Response(status=500)
        return web.Response(status=status, body=content, content_type="application/json")

    url, cleanup = await _serve(handle)

    async def close() -> None:
        await cleanup()
        await session.close()

    return url, seen, close


async def _serve(handle):
    """``handle`` answering every request on 127.0.0.1: its URL and its clean-up."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", runner.cleanup


def test_a_resubmit_after_a_lost_answer_is_already_admitted_and_gateway_errors_are_retried(serve):
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel))

    async def go():
        url, seen, close = await lossy_proxy(served.url, drop_first_submit=True, bad_gateway_polls=2)
        try:
            client = RolloutClient(url, token=TOKEN)
            admission = await client.submit(request("lost-answer", 0.1))
            result = await client.result(admission)
            return admission, result, seen
        finally:
            await close()

    admission, result, seen = run(go)
    assert seen == {"dropped": 1, "bad_gateway": 2}
    assert admission.resubmitted
    assert result.status is RolloutStatus.SUCCESS
    assert result.reward == 1.0
    assert len(read_lines(served.service.folder.results_path)) == 1  # admitted once, run once


def test_connection_errors_are_retried_until_the_server_is_up(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = create_app(
        LocalBackend(Sleepy, grader=EndsWithLabel), token=TOKEN, run_dir=tmp_path / "run", configure_logging=False
    )
    served = Served(app, port=port)

    async def go():
        client = RolloutClient(f"http://127.0.0.1:{port}", token=TOKEN)
        task = asyncio.create_task(client.run(request("early")))
        await asyncio.sleep(0.6)  # the first attempts find nothing listening
        assert not task.done()
        await asyncio.to_thread(served.__enter__)
        return await task

    try:
        started = time.monotonic()
        result = run(go)
    finally:
        served.__exit__(None, None, None)
    assert result.reward == 1.0
    assert time.monotonic() - started > 0.6


def test_stopping_run_many_early_cancels_what_is_in_flight_on_the_server(serve):
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel, max_concurrent=4))

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        requests = [request("first", 0.05)] + [request(f"stuck-{i}", 60) for i in range(5)]
        async with contextlib.aclosing(client.run_many(requests, concurrency=6)) as results:
            async for result in results:
                return result

    first = run(go)
    assert first.rollout_id == "first"
    for _ in range(100):
        if served.service.health()["lifecycle"]["active_rollouts"] == 0:
            break
        time.sleep(0.05)
    lines = {line["rollout_id"]: line["status"] for line in read_lines(served.service.folder.results_path)}
    assert lines == {"first": "success", **{f"stuck-{i}": "cancelled" for i in range(5)}}


async def _unavailable(retry_after: str):
    """A server on 127.0.0.1 that answers every request 503 with ``Retry-After``; the times it was asked."""
    times: list[float] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        times.append(time.monotonic())
        return web.Response(status=503, text="busy", headers={"Retry-After": retry_after})

    url, cleanup = await _serve(handle)
    return url, times, cleanup


def test_a_503_waits_its_retry_after_and_a_cancellation_ends_the_wait_at_once():
    from osmosis_trainer import ServerUnavailable

    async def go():
        url, times, close = await _unavailable("0.4")
        try:
            client = RolloutClient(url, token=TOKEN, retry_delays=(0.01, 0.01))
            with contextlib.suppress(ServerUnavailable):
                await client.submit(request("busy"))
            gaps = [b - a for a, b in itertools.pairwise(times)]
            with socket.socket() as probe:  # a port nothing listens on: a connection error, then a 30 s wait
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            slow = RolloutClient(f"http://127.0.0.1:{port}", token=TOKEN, retry_delays=(30.0,))
            task = asyncio.create_task(slow.submit(request("refused")))
            await asyncio.sleep(0.5)
            assert not task.done()
            started = time.monotonic()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return gaps, time.monotonic() - started
        finally:
            await close()

    gaps, cancel_took = run(go)
    assert len(gaps) == 2, gaps
    assert all(gap >= 0.38 for gap in gaps), gaps  # Retry-After, not the 0.01 s delay
    assert cancel_took < 0.2


def test_the_client_works_as_async_with_and_closes_its_connections_on_exit(serve):
    """Inside ``async with`` the client keeps its connection to the server alive (its own pool); the
    block's end closes it, and the client still works after, on the loop's shared session."""
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel))
    connections = served.server.server_state.connections  # uvicorn's open connections

    async def until_closed() -> int:
        for _ in range(500):  # uvicorn sees the close within a few ms
            if not connections:
                break
            await asyncio.sleep(0.01)
        return len(connections)

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        async with client as entered:
            assert entered is client
            first = await client.run(request("inside"))
            open_inside = len(connections)
        left_open = await until_closed()
        after = await client.run(request("after"))
        return first, open_inside, left_open, after

    first, open_inside, left_open, after = run(go)
    assert first.ok
    assert first.reward == 1.0
    assert open_inside == 1  # kept alive in the client's pool
    assert left_open == 0  # closed when the block ended
    assert after.ok


CLIENT_SCRIPT = r"""
import asyncio, gc, sys
import uvloop
from osmosis_trainer import RolloutClient, RolloutRequest

url, token = sys.argv[1], sys.argv[2]


def request(rollout_id):
    prompt = [{"role": "user", "content": "hi"}]
    return RolloutRequest(rollout_id=rollout_id, initial_messages=prompt, chat_completions_url="http://127.0.0.1:9/v1",
                          label="42")


async def plain(rollout_id):
    result = await RolloutClient(url, token=token).run(request(rollout_id))
    print(rollout_id, result.status.value)


async def entered(rollout_id):
    async with RolloutClient(url, token=token) as client:
        results = [r async for r in client.run_many([request(rollout_id)])]
    print(rollout_id, results[0].status.value)


async def beside_core(rollout_id):
    from osmosis_core.http import http_request

    async with http_request("GET", url + "/livez") as response:  # osmosis-core's own session on this loop
        await response.read()
    results = [r async for r in RolloutClient(url, token=token).run_many([request(rollout_id)])]
    print(rollout_id, results[0].status.value)


asyncio.run(plain("asyncio.run"))
uvloop.run(plain("uvloop.run"))
asyncio.run(entered("async-with"))
asyncio.run(beside_core("beside-core"))
gc.collect()
"""


def test_a_script_with_the_client_under_asyncio_run_ends_without_unclosed_sessions(serve, tmp_path):
    """``asyncio.run`` (or ``uvloop.run``) of a client that nobody closes: the loop's session closes
    with the loop; ``async with`` closes the client's own; and a loop where osmosis-core keeps its own
    session too closes both (each at the loop's shutdown, neither waiting for the other)."""
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel))
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env["PYTHONDEVMODE"] = "1"  # ResourceWarnings shown, asyncio's debug checks on
    proc = subprocess.run(
        [sys.executable, str(script), served.url, TOKEN], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    expected = ["asyncio.run success", "uvloop.run success", "async-with success", "beside-core success"]
    assert proc.stdout.splitlines() == expected, proc.stderr
    for unwanted in ("Unclosed", "unclosed", "Traceback"):
        assert unwanted not in proc.stderr, proc.stderr
