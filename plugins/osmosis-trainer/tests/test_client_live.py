"""The client on this Python (3.10 to 3.13, no osmosis-core) against a real ``osmosis serve --traces``
running in its own process, as a trainer and its rollout server run in a deployment; and what it
does when the server does not answer at all."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import warnings

import attrs
import pytest
from trainer_helpers import LABELS, PROMPTS, REFUSALS, SETUP_REFUSALS, answering

from osmosis_trainer import (
    RolloutClient,
    RolloutProtocolError,
    RolloutRequest,
    RolloutResult,
    SamplingParams,
    ServerUnavailable,
    group_advantages,
    is_setup_refusal,
    order_results,
    prompt_groups,
    repeat_prompts,
    rollout_rows,
    rows_metrics,
    trace_from_json,
)


def _requests(server, prompts, *, tag: str, policy_url: str | None = None) -> list[RolloutRequest]:
    """One request per row of ``prompts`` (already repeated per group, as a trainer hands them over)."""
    return [
        RolloutRequest(
            rollout_id=f"{tag}-g{group}-s{sample}",
            initial_messages=prompts[index],
            chat_completions_url=policy_url or server.policy_url,
            label=LABELS[PROMPTS.index(prompts[index])],
            row=group,
            sample_index=sample,
            sampling_params=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=256),
            policy_version="step-1",
        )
        for index, (group, sample) in enumerate(prompt_groups(prompts, 2))
    ]


def test_a_step_of_rollouts_through_osmosis_serve_becomes_one_training_row_per_prompt_row(live_server):
    prompts = repeat_prompts(PROMPTS, 2)
    requests = _requests(live_server, prompts, tag="step")

    async def step():
        client = RolloutClient(live_server.url, token=live_server.token)  # the loop's shared session
        return [result async for result in client.run_many(requests, concurrency=4)]

    results = order_results(requests, asyncio.run(step()))
    assert [r.rollout_id for r in results] == [r.rollout_id for r in requests]
    rows = [row for result in results for row in rollout_rows(result, sequences="last")]
    assert len(rows) == len(prompts)  # one row back per row given
    for result, row in zip(results, rows, strict=True):
        assert result.ok, result.error
        assert result.reward == 1.0
        trace = trace_from_json(result.trace)
        assert trace.complete
        first, last = trace.calls[0], trace.calls[-1]
        assert len(trace.calls) == 2  # the multiply tool call, then the answer
        assert not row.masked, row.mask_detail
        assert row.prompt_ids == list(first.prompt_token_ids)
        assert row.prompt_ids + row.completion_ids == list(last.prompt_token_ids) + list(last.completion_token_ids)
        generated = len(first.completion_token_ids) + len(last.completion_token_ids)
        assert sum(row.completion_mask) == generated
        assert 0 in row.completion_mask  # the tool's answer between the turns is not trained on
        assert row.completion_logprobs[: len(first.completion_token_ids)] == list(first.logprobs)
        assert all(lp == 0.0 for lp, m in zip(row.completion_logprobs, row.completion_mask, strict=True) if not m)
        assert (row.complete, row.prefix_breaks, row.delivered_fraction) == (True, 0, 1.0)
    metrics = rows_metrics(rows)
    assert (metrics["masked_rows"], metrics["incomplete_rollouts"], metrics["prefix_breaks"]) == (0, 0, 0)
    assert {json.dumps(r.sampling_params, sort_keys=True) for r in results} == {
        json.dumps({"max_tokens": 256, "temperature": 1.0, "top_p": 1.0}, sort_keys=True)
    }  # the server echoes what it applied
    assert {r.policy_version for r in results} == {"step-1"}
    assert group_advantages([row.reward for row in rows], 2) == [0.0] * 4  # every sample right: no signal


def test_a_failed_rollout_is_a_masked_row_left_out_of_its_group(live_server):
    with socket.socket() as probe:  # a policy nobody listens at: the rollout fails (policy_error)
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    requests = _requests(live_server, repeat_prompts(PROMPTS[:1], 2), tag="fail")
    requests[1] = attrs.evolve(requests[1], chat_completions_url=dead)

    async def step():
        async with RolloutClient(live_server.url, token=live_server.token) as client:  # its own pool
            return [result async for result in client.run_many(requests)]

    good, failed = order_results(requests, asyncio.run(step()))
    assert good.ok
    assert not failed.ok
    assert failed.error is not None
    assert failed.error.category == "policy_error"
    [row] = rollout_rows(failed, sequences="last")
    assert row.mask_reason == "failed"
    assert "policy_error" in (row.mask_detail or "")
    assert not any(row.completion_mask)
    [good_row] = rollout_rows(good, sequences="last")
    rewards = [good_row.reward, row.reward]
    assert group_advantages(rewards, 2, mask=[not good_row.masked, not row.masked]) == [0.0, None]


def _silent_policy():
    """A policy on 127.0.0.1 that accepts connections and never answers: its URL and its close."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join(5)
        listener.close()
        for connection in accepted:
            connection.close()

    return f"http://127.0.0.1:{listener.getsockname()[1]}/v1", close


def test_a_run_many_the_loops_shutdown_closes_still_cancels_what_it_had_in_flight(live_server):
    """A loop shut down by hand (``shutdown_asyncgens`` with the workers still running): the
    abandoned ``run_many`` cancels its rollout in flight on the server before the loop's shared
    session closes."""
    silent, close_policy = _silent_policy()
    quick, stuck = _requests(live_server, repeat_prompts(PROMPTS[:1], 2), tag="shutdown")
    stuck = attrs.evolve(stuck, chat_completions_url=silent)
    loop = asyncio.new_event_loop()

    async def take_the_first():
        results = RolloutClient(live_server.url, token=live_server.token).run_many([quick, stuck], concurrency=2)
        first = await results.__anext__()  # then the generator is left suspended, unclosed
        await asyncio.sleep(0.5)  # the stuck rollout is admitted, waiting on its policy
        return results, first

    gc.collect()  # (what earlier tests left for the collector is not this test's)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            results, first = loop.run_until_complete(take_the_first())
            assert first.rollout_id == quick.rollout_id
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
            close_policy()
        del results
        gc.collect()
    # the session was still open for the cancel (not a new one made after the shutdown, never closed)
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not [m for m in unclosed if "client session" in m or "connector" in m or "transport" in m], unclosed
    deadline = time.monotonic() + 10
    lines: dict[str, str] = {}
    while time.monotonic() < deadline and stuck.rollout_id not in lines:
        path = live_server.run_dir / "results.jsonl"
        lines = {line["rollout_id"]: line["status"] for line in map(json.loads, path.read_text().splitlines())}
        time.sleep(0.05)
    assert lines.get(stuck.rollout_id) == "cancelled"


SCRIPT = r"""
import asyncio, gc, sys
from osmosis_trainer import RolloutClient, RolloutRequest

url, token, policy = sys.argv[1:4]


def request(rollout_id):
    prompt = [{"role": "user", "content": "val1 = 3\nval2 = 4"}]
    return RolloutRequest(rollout_id=rollout_id, initial_messages=prompt, chat_completions_url=policy, label="12")


async def plain(rollout_id):
    result = await RolloutClient(url, token=token).run(request(rollout_id))
    print(rollout_id, result.status.value)


async def many(rollout_id):
    results = [r async for r in RolloutClient(url, token=token).run_many([request(rollout_id)])]
    print(rollout_id, results[0].status.value)


async def entered(rollout_id):
    async with RolloutClient(url, token=token) as client:
        results = [r async for r in client.run_many([request(rollout_id)])]
    print(rollout_id, results[0].status.value)


asyncio.run(plain("plain"))
asyncio.run(many("many"))
asyncio.run(entered("entered"))
try:
    import uvloop
except ImportError:
    print("uvloop.run success")
else:
    uvloop.run(plain("uvloop.run"))
gc.collect()
"""


def test_a_script_with_the_client_under_asyncio_run_ends_without_unclosed_sessions(live_server, tmp_path):
    """``asyncio.run`` of a client nobody closes: the loop's shared session closes with the loop (after
    a ``run_many`` that was using it); ``async with`` closes the client's own pool. No osmosis-core."""
    script = tmp_path / "client.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env["PYTHONDEVMODE"] = "1"  # ResourceWarnings shown, asyncio's debug checks on
    args = [sys.executable, str(script), live_server.url, live_server.token, live_server.policy_url]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    expected = ["plain success", "many success", "entered success", "uvloop.run success"]
    assert proc.stdout.splitlines() == expected, proc.stderr
    for unwanted in ("Unclosed", "unclosed", "Traceback"):
        assert unwanted not in proc.stderr, proc.stderr


def test_a_server_that_never_answers_is_unavailable_after_the_retries_on_every_python():
    """A request's time running out is retried like a lost connection, then ``ServerUnavailable``
    (on Python 3.10 aiohttp raises ``asyncio.TimeoutError``, which is not the builtin there)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:  # accepts, reads nothing, answers nothing
        listener.settimeout(5)
        try:
            while len(accepted) < 3:
                accepted.append(listener.accept()[0])
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"

    async def ask():
        async with RolloutClient(url, request_timeout_sec=0.2, retry_delays=(0.01, 0.01)) as client:
            await client.health()

    started = time.monotonic()
    try:
        with pytest.raises(ServerUnavailable, match="failed after 3 attempts"):
            asyncio.run(ask())
    finally:
        listener.close()
        thread.join(10)
        for connection in accepted:
            connection.close()
    assert len(accepted) == 3
    assert time.monotonic() - started < 5


def test_a_server_that_ignores_the_trainers_sampling_is_warned_about_once(caplog):
    """A server older than osmosis-server 0.2 (or another one) admits a request with sampling_params and
    runs it with the agent's own settings: the result echoes none, and the trainer is told, once."""
    from aiohttp import web

    async def submit(request: web.Request) -> web.Response:
        body = await request.json()
        rollout_id = body["rollout_id"]
        result = {"rollout_id": rollout_id, "status": "success", "reward": 1.0}  # no sampling_params echoed
        admission = {"rollout_id": rollout_id, "polling_lease_token": "t", "status": "success", "result": result}
        return web.json_response(admission, status=202)

    async def main():
        app = web.Application()
        app.router.add_post("/rollout", submit)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with RolloutClient(url) as client:
                asked = SamplingParams(temperature=1.0)
                for i in range(2):
                    request = RolloutRequest(
                        rollout_id=f"r{i}",
                        initial_messages=[],
                        chat_completions_url="http://p/v1",
                        sampling_params=asked,
                    )
                    assert (await client.run(request)).ok
                await client.run(
                    RolloutRequest(rollout_id="r9", initial_messages=[], chat_completions_url="http://p/v1")
                )  # none asked: nothing to warn about
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.WARNING, logger="osmosis_trainer.client"):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if "did not echo sampling_params" in r.getMessage()]
    assert len(warnings) == 1
    assert "with the agent's own settings, not the trainer's" in warnings[0]


async def step(url: str, rollouts: int = 2) -> list[RolloutResult]:
    """``rollouts`` rollouts run by ``run_many`` against the server at ``url`` (fast retries), as a
    trainer adapter runs a step."""
    async with RolloutClient(url, retry_delays=(0.01,)) as client:
        requests = [
            RolloutRequest(rollout_id=f"r{i}", initial_messages=PROMPTS[0], chat_completions_url="")
            for i in range(rollouts)
        ]
        return [result async for result in client.run_many(requests, concurrency=2)]


async def step_answered(status: int, body: object) -> list[RolloutResult]:
    """:func:`step` against a stand-in server answering every request ``status`` with ``body``."""
    async with answering(status, body) as url:
        return await step(url)


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_run_many_yields_a_per_rollout_client_error_as_a_failed_result(case):
    """What the TRL and SkyRL adapters run a step with: one rollout's 500, 409, broken answer or 413 is
    its failed result (masked, ``infra_error`` naming the error), never the step's end (SkyRL #1613)."""
    status, body = REFUSALS[case]
    results = asyncio.run(step_answered(status, body))
    assert sorted(r.rollout_id for r in results) == ["r0", "r1"]
    for result in results:
        assert not result.ok
        assert result.error.category == "infra_error"
        assert result.error.message.startswith("Rollout"), result.error  # the error's class, then its message
        assert f"(HTTP {status})" in result.error.message


def test_an_unreachable_server_is_each_rollouts_failed_result():
    """No server at all (a closed port): every rollout of the step is a failed result naming it."""
    results = asyncio.run(step("http://127.0.0.1:9"))
    assert sorted(r.rollout_id for r in results) == ["r0", "r1"]
    assert {r.error.category for r in results} == {"infra_error"}
    assert all(r.error.message.startswith("ServerUnavailable") for r in results), results


@pytest.mark.parametrize("case", sorted(SETUP_REFUSALS))
def test_run_many_raises_a_setup_refusal(case):
    status, body = SETUP_REFUSALS[case]
    with pytest.raises(RolloutProtocolError, match=str(status)) as raised:
        asyncio.run(step_answered(status, body))
    assert is_setup_refusal(raised.value)
