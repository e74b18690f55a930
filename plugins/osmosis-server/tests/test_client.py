"""RolloutClient: completion order, 429s, lost connections and gateway errors, stopping early."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time

import aiohttp
from aiohttp import web
from server_helpers import TOKEN, Served, read_lines, run
from workflows import EndsWithLabel, Sleepy

from osmosis_core import LocalBackend
from osmosis_server import RolloutClient, RolloutRequest, RolloutStatus, ServerSettings, create_app


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
    from osmosis_server.client import ServerUnavailable

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
