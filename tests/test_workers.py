"""The local backend over worker processes (`[run] workers`, `--workers`): same results, real processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import time
from pathlib import Path

import anyio
import pytest

from osmosis_core import (
    AgentWorkflow,
    ErrorCategory,
    ExecutionRequest,
    ExecutionResult,
    Grader,
    PolicyEndpoint,
    RolloutSample,
)
from osmosis_core.testing import StubPolicyProcess
from osmosis_core.workers import WorkerPool


class WhoRuns(AgentWorkflow):
    async def run(self, ctx):
        from osmosis_core import chat_completion

        reply = await chat_completion(ctx.prompt)
        return RolloutSample(messages=[*ctx.prompt, reply], metrics={"pid": os.getpid()})


class Exact(Grader):
    async def grade(self, ctx):
        return 1.0 if ctx.sample.last_text().rstrip().endswith(str(ctx.label)) else 0.0


class Hangs(AgentWorkflow):
    async def run(self, ctx):
        await anyio.sleep(60)


def requests(url: str, n: int) -> list[ExecutionRequest]:
    policy = PolicyEndpoint(url, "m")
    return [
        ExecutionRequest(f"w{i}", [{"role": "user", "content": f"{i} * 3"}], policy, label=str(i * 3)) for i in range(n)
    ]


async def run_all(pool: WorkerPool, reqs: list[ExecutionRequest]) -> list[ExecutionResult]:
    results: list[ExecutionResult] = []

    async def keep(result: ExecutionResult) -> None:
        results.append(result)

    async with anyio.create_task_group() as tg:
        for r in reqs:
            tg.start_soon(pool.execute, r, keep, keep)
    return results


@pytest.fixture(scope="module")
def stub():
    with StubPolicyProcess(latency=0.05) as server:
        yield server


def test_rollouts_run_in_the_workers_with_the_same_results(stub):
    pool = WorkerPool(WhoRuns, grader=Exact, workers=2, max_concurrent=8)
    try:
        assert pool.max_concurrency == 8
        results = anyio.run(run_all, pool, requests(stub.url, 30))
        health = pool.health()
    finally:
        anyio.run(pool.aclose)
    graded = [r for r in results if r.stage.value == "grader"]
    assert len(results) == 60 and len(graded) == 30
    assert all(r.ok and r.reward == 1.0 for r in graded)
    pids = {r.sample.metrics["pid"] for r in graded}
    worker_pids = {w["pid"] for w in health["workers"]}
    assert pids == worker_pids and os.getpid() not in pids and len(pids) == 2
    assert not any(p.is_alive() for p in pool._procs)  # aclose stopped them


def test_cancelling_reports_cancelled_and_a_dead_worker_fails_its_rollouts_as_infra_errors(stub):
    pool = WorkerPool(Hangs, workers=2, max_concurrent=4)
    try:

        async def cancel_midway() -> list[ExecutionResult]:
            results: list[ExecutionResult] = []

            async def keep(result: ExecutionResult) -> None:
                results.append(result)

            async with anyio.create_task_group() as tg:
                for r in requests(stub.url, 4):
                    tg.start_soon(pool.execute, r, keep, keep)
                await anyio.sleep(0.5)
                tg.cancel_scope.cancel()
            return results

        cancelled = anyio.run(cancel_midway)
        assert sorted(r.status.value for r in cancelled) == ["cancelled"] * 4
        assert all(r.error.category is ErrorCategory.CANCELLED for r in cancelled)

        async def kill_one() -> list[ExecutionResult]:
            results: list[ExecutionResult] = []

            async def keep(result: ExecutionResult) -> None:
                results.append(result)

            async with anyio.create_task_group() as tg:
                for r in requests(stub.url, 2):
                    tg.start_soon(pool.execute, r, keep, keep)
                await anyio.sleep(0.5)
                os.kill(pool._procs[0].pid, signal.SIGKILL)
                await anyio.sleep(0.5)
                tg.cancel_scope.cancel()
            return results

        after = anyio.run(kill_one)
        lost = [r for r in after if r.error is not None and r.error.category is ErrorCategory.INFRA_ERROR]
        assert len(lost) == 1 and "worker process" in lost[0].error.message
    finally:
        anyio.run(pool.aclose)
    assert not any(p.is_alive() for p in pool._procs)


def test_osmosis_run_with_workers_end_to_end(workspace, osmosis_exe, clean_env):
    r = subprocess.run(
        [osmosis_exe, "run", "configs/eval/multiply-plain.toml", "--stub-policy", "--workers", "2", "--output", "out"],
        cwd=workspace,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (workspace / "out" / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 20 and all(x["reward"] == 1.0 for x in lines)


def test_interrupting_a_run_with_workers_leaves_no_worker_behind(workspace, osmosis_exe, clean_env):
    proc = subprocess.Popen(
        [
            osmosis_exe,
            "run",
            "configs/eval/multiply-plain.toml",
            "--stub-policy",
            "--stub-latency",
            "0.3",
            "--workers",
            "2",
            "--concurrency",
            "2",
            "--output",
            "out",
        ],
        cwd=workspace,
        env=clean_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    results = workspace / "out" / "results.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (results.exists() and results.read_text().count("\n") >= 2):
        time.sleep(0.05)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    time.sleep(0.2)
    alive = [
        pid
        for pid in children
        if Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()
    ]
    assert children and not alive
    kept = [json.loads(x) for x in results.read_text().splitlines()]
    assert kept and all(x["status"] == "success" for x in kept)


GRADING = multiprocessing.Value("i", 0)  # shared with the forked workers
PEAK = multiprocessing.Value("i", 0)


class Instant(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": str(ctx.metadata["answer"])}]


class CountingGrader(Grader):
    async def grade(self, ctx):
        with GRADING.get_lock():
            GRADING.value += 1
            PEAK.value = max(PEAK.value, GRADING.value)
        await anyio.sleep(0.05)
        with GRADING.get_lock():
            GRADING.value -= 1
        return 1.0


def test_a_grader_limit_is_split_between_workers_like_the_workflow_limit():
    from osmosis_core import ConcurrencyConfig, GraderConfig

    grader_config = GraderConfig(concurrency=ConcurrencyConfig(max_concurrent=4))
    pool = WorkerPool(Instant, grader=CountingGrader, grader_config=grader_config, workers=2, max_concurrent=16)
    policy = PolicyEndpoint("http://127.0.0.1:9/v1", "m")
    reqs = [
        ExecutionRequest(f"g{i}", [{"role": "user", "content": "x"}], policy, label="1", metadata={"answer": i})
        for i in range(32)
    ]
    try:
        results = anyio.run(run_all, pool, reqs)
    finally:
        anyio.run(pool.aclose)
    assert sum(r.stage.value == "grader" and r.ok for r in results) == 32
    assert 2 <= PEAK.value <= 4  # 2 per worker; without the split each worker would grade up to 4 at once
