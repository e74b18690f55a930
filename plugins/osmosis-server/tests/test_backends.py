"""Any ExecutionBackend: a third-party one, its failures, and one whose machinery goes away."""

from __future__ import annotations

import asyncio
import threading

import attrs
import httpx
from server_helpers import TOKEN, read_lines, run

from osmosis_core import ExecutionResult, ExecutionStage, ExecutionStatus, RolloutSample
from osmosis_core.plugin import BackendUnavailable, ExecutionBackend
from osmosis_server import RolloutStatus, ServerSettings
from osmosis_trainer import RolloutClient, RolloutRequest


class Remote(ExecutionBackend):
    """A backend of its own (no concurrency limit declared): answers twice, then its cluster is gone.

    ``metadata["mode"]``: "silent" returns without reporting anything (a broken backend), "raise"
    raises instead of reporting a result.
    """

    def __init__(self) -> None:
        self.answered = 0

    async def execute(self, request, on_workflow_complete, on_grader_complete=None):
        mode = request.metadata.get("mode")
        if mode == "silent":
            return
        if mode == "raise":
            raise RuntimeError("the backend's own bug")
        if self.answered == 2:
            raise BackendUnavailable("the cluster is gone")
        self.answered += 1
        sample = RolloutSample(messages=[*request.prompt, {"role": "assistant", "content": "remote"}])
        await on_workflow_complete(
            ExecutionResult(request.rollout_id, ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS, sample=sample)
        )


def request(rid: str, **metadata) -> RolloutRequest:
    return RolloutRequest(
        rollout_id=rid,
        initial_messages=[{"role": "user", "content": "hi"}],
        chat_completions_url="http://127.0.0.1:9/v1",
        metadata=metadata,
    )


def test_a_third_party_backend_its_failures_and_its_end(serve):
    served = serve(Remote(), settings=ServerSettings(max_queued=5, grace_sec=1))

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        health = await client.health()
        results = {
            rid: await client.run(request(rid, **md))
            for rid, md in (
                ("one", {}),
                ("silent", {"mode": "silent"}),
                ("raises", {"mode": "raise"}),
                ("two", {}),
                ("gone", {}),
            )
        }
        return health, results, await client.health()

    health, results, after = run(go)
    assert health["server"]["capacity"] == 5
    assert health["server"]["backend_slots"] == 0
    assert results["one"].status is RolloutStatus.SUCCESS
    assert results["two"].status is RolloutStatus.SUCCESS
    assert results["one"].sample.messages[-1]["content"] == "remote"
    assert results["one"].reward is None
    for rid, words in (
        ("silent", "returned without reporting a result"),
        ("raises", "the backend's own bug"),
        ("gone", "the backend is unavailable: the cluster is gone"),
    ):
        assert results[rid].status is RolloutStatus.FAILURE
        assert results[rid].error.category.value == "infra_error", results[rid]
        assert words in results[rid].error.message, results[rid]
        assert results[rid].err_category == "internal_error"
    assert after["status"] == "unavailable"
    assert after["lifecycle"]["accepting_rollouts"] is False
    refused = httpx.post(
        f"{served.url}/rollout", json=request("late").to_json(), headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert refused.status_code == 503
    assert "the cluster is gone" in refused.json()["detail"]
    lines = read_lines(served.service.folder.results_path)
    assert [line["rollout_id"] for line in lines] == ["one", "silent", "raises", "two", "gone"]


def test_a_failure_of_the_servers_own_steps_around_the_backend_is_a_redacted_failure(serve, caplog):
    """Opening a rollout's trace is the server's own step (not the backend's): a failure there ends
    the rollout as an infra_error failure whose message and log line hold no secret."""
    key = "sk-server-side-secret-key-1234"
    served = serve(Remote())
    service = served.service

    async def refuse(policy, rollout_id, **_keywords):
        raise RuntimeError(f"the gateway refused {rollout_id} (key {key})\nsecond line")

    service.traces = {}  # traces on: each rollout opens its route on the gateway first
    service.gateways.open = refuse

    async def go():
        return await RolloutClient(served.url, token=TOKEN).run(attrs.evolve(request("traced"), llm_api_key=key))

    with caplog.at_level("ERROR"):
        result = run(go)
    assert result.status is RolloutStatus.FAILURE
    assert result.error.category.value == "infra_error", result
    assert "the gateway refused traced" in result.error.message
    assert key not in result.error.message
    assert "\n" not in result.error.message
    assert key not in caplog.text
    assert "the gateway refused traced" in caplog.text


def test_a_stray_cancelled_error_from_the_servers_own_steps_is_a_failure_not_a_cancellation(serve):
    """A ``CancelledError`` nobody asked for (raised by opening the trace, the task not cancelled) is
    the server's failure: an infra_error that says so, not a rollout reported cancelled."""
    served = serve(Remote())
    service = served.service

    async def stray(policy, rollout_id, **_keywords):
        raise asyncio.CancelledError

    service.traces = {}
    service.gateways.open = stray

    async def go():
        return await RolloutClient(served.url, token=TOKEN).run(request("stray"))

    result = run(go)
    assert result.status is RolloutStatus.FAILURE, result
    assert result.error.category.value == "infra_error", result
    assert "CancelledError was raised while the server did not cancel the rollout" in result.error.message


def test_a_rollout_task_cancelled_from_outside_is_a_cancellation_not_a_stray_error(serve):
    """The other side of the rule above: the rollout's task cancelled by someone else than the
    server's own cancel (as the event loop going down cancels its tasks), while the server set no
    reason, is a cancellation, reported ``cancelled`` as at a shutdown, not the server's failure."""
    served = serve(Remote())
    service = served.service
    opened = threading.Event()

    async def hang(policy, rollout_id, **_keywords):
        opened.set()
        await asyncio.Event().wait()

    service.traces = {}
    service.gateways.open = hang

    async def go():
        running = asyncio.create_task(RolloutClient(served.url, token=TOKEN).run(request("outside")))
        assert await asyncio.to_thread(opened.wait, 30)
        await asyncio.to_thread(served.call, lambda: service._active["outside"].task.cancel())
        return await running

    result = run(go)
    assert result.status is RolloutStatus.CANCELLED, result
    assert result.error.category.value == "cancelled", result
    assert "the server shut down" in result.error.message
