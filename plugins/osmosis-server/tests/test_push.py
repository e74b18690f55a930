"""Push mode: results POSTed to the trainer's callback_url, retried with backoff, in order."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from server_helpers import TOKEN, read_lines, run
from workflows import EndsWithLabel, Sleepy

from osmosis_core import LocalBackend
from osmosis_server import ServerSettings
from osmosis_trainer import RolloutClient, RolloutRequest


async def receiver(fail_first: int):
    """A callback receiver on 127.0.0.1 that answers 500 to its first ``fail_first`` deliveries."""
    attempts: list[dict] = []
    accepted: list[dict] = []

    async def handle(request: web.Request) -> web.Response:
        data = await request.json()
        attempts.append({"body": data, "auth": request.headers.get("Authorization")})
        if len(attempts) <= fail_first:
            return web.Response(status=500, text="not yet")
        accepted.append(data)
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/results", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/results", attempts, accepted


def test_results_are_pushed_in_order_and_retried_and_need_no_polling(serve):
    # a lease far shorter than the rollout: a pushed rollout has none, so it must not expire
    settings = ServerSettings(lease_timeout_sec=0.5, result_wait_sec=0.2, grace_sec=1)
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel), settings=settings)

    async def go():
        runner, url, attempts, accepted = await receiver(fail_first=2)
        try:
            client = RolloutClient(served.url, token=TOKEN)
            admission = await client.submit(
                RolloutRequest(
                    rollout_id="pushed",
                    initial_messages=[{"role": "user", "content": "hi"}],
                    chat_completions_url="http://127.0.0.1:9/v1",
                    label="42",
                    metadata={"sleep": 0.8, "grade_sleep": 0.8},
                    callback_url=url,
                    callback_api_key="callback-secret-123",
                )
            )
            for _ in range(200):
                if len(accepted) == 2:
                    break
                await asyncio.sleep(0.05)
            polled = await client.result(admission)  # still readable by polling
            return attempts, accepted, polled
        finally:
            await runner.cleanup()

    attempts, accepted, polled = run(go)
    assert len(attempts) == 4  # two refused, then the workflow's result, then the final one
    assert attempts[0]["body"] == attempts[1]["body"] == attempts[2]["body"]  # the same delivery, retried
    assert all(a["auth"] == "Bearer callback-secret-123" for a in attempts)
    workflow, final = accepted
    assert (workflow["stage"], workflow["final"], workflow["status"]) == ("workflow", False, "success")
    assert workflow["reward"] is None
    assert (final["stage"], final["final"], final["status"], final["reward"]) == ("grader", True, "success", 1.0)
    assert final["sample"]["messages"][-1]["content"] == "#### 42"
    assert polled.reward == 1.0
    [line] = read_lines(served.service.folder.results_path)
    assert line["status"] == "success"
    assert line["reward"] == 1.0
    assert "callback-secret-123" not in json.dumps(line)


def test_a_failed_workflow_is_pushed_once_as_final(serve):
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel))

    async def go():
        runner, url, _attempts, accepted = await receiver(fail_first=0)
        try:
            client = RolloutClient(served.url, token=TOKEN)
            admission = await client.submit(
                RolloutRequest(
                    rollout_id="broken",
                    initial_messages=[{"role": "user", "content": "hi"}],
                    chat_completions_url="http://127.0.0.1:9/v1",
                    label="42",
                    metadata={"fail": "no"},
                    callback_url=url,
                )
            )
            await client.result(admission)
            for _ in range(100):
                if accepted:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            return accepted
        finally:
            await runner.cleanup()

    [only] = run(go)
    assert (only["final"], only["status"], only["error"]["category"]) == (True, "failure", "validation_error")
