"""The local backend over worker processes (`[run] workers`, `--workers`): same results, real processes and signals."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
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
from osmosis_core._engine.workers import WorkerPool
from osmosis_core.errors import BackendUnavailable
from osmosis_core.testing import ScriptedPolicyServer, StubPolicyProcess


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


class Sleeps(AgentWorkflow):
    async def run(self, ctx):
        await anyio.sleep(float(ctx.metadata.get("sleep", 0.2)))
        return [*ctx.prompt, {"role": "assistant", "content": str(os.getpid())}]


def requests(url: str, n: int, **metadata) -> list[ExecutionRequest]:
    policy = PolicyEndpoint(url, "m")
    return [
        ExecutionRequest(
            f"w{i}", [{"role": "user", "content": f"{i} * 3"}], policy, label=str(i * 3), metadata=metadata
        )
        for i in range(n)
    ]


async def run_all(
    pool: WorkerPool,
    reqs: list[ExecutionRequest],
    meanwhile: Callable[[anyio.abc.TaskGroup], Awaitable[None]] | None = None,
) -> list[ExecutionResult]:
    """Every result of ``reqs``, all started at once; ``meanwhile(task_group)`` runs once they are
    started (a test kills workers or cancels the rollouts there)."""
    results: list[ExecutionResult] = []

    async def keep(result: ExecutionResult) -> None:
        results.append(result)

    async with anyio.create_task_group() as tg:
        for r in reqs:
            tg.start_soon(pool.execute, r, keep, keep)
        if meanwhile is not None:
            await meanwhile(tg)
    return results


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def descendants(pid: int) -> list[int]:
    found = children(pid)
    for child in list(found):
        found.extend(descendants(child))
    return found


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
        started = [pool.zygote_pid, *pool.worker_pids]
    finally:
        anyio.run(pool.aclose)
    graded = [r for r in results if r.stage.value == "grader"]
    assert len(results) == 60
    assert len(graded) == 30
    assert all(r.ok and r.reward == 1.0 for r in graded)
    pids = {r.sample.metrics["pid"] for r in graded}
    worker_pids = {w["pid"] for w in health["workers"]}
    assert pids == worker_pids
    assert os.getpid() not in pids
    assert len(pids) == 2
    assert health["status"] == "ok"
    assert health["restarts"] == 0
    assert not any(alive(pid) for pid in started)  # aclose stopped the workers and the zygote


def test_cancelling_reports_cancelled_once_per_rollout(stub):
    pool = WorkerPool(Hangs, workers=2, max_concurrent=4)
    try:

        async def cancel_midway(tg: anyio.abc.TaskGroup) -> None:
            await anyio.sleep(0.5)
            tg.cancel_scope.cancel()

        cancelled = anyio.run(run_all, pool, requests(stub.url, 10), cancel_midway)  # 4 running, 6 waiting
    finally:
        anyio.run(pool.aclose)
    assert sorted(r.rollout_id for r in cancelled) == sorted(f"w{i}" for i in range(10))
    assert all(r.error.category is ErrorCategory.CANCELLED for r in cancelled)


def test_a_cancel_that_arrives_with_its_run_never_hangs(stub):
    """The worker can read "run" and "cancel" of one rollout in one batch: the task never starts."""
    pool = WorkerPool(Sleeps, workers=2, max_concurrent=64)
    try:
        for _attempt in range(30):

            async def cancel_at_once(tg: anyio.abc.TaskGroup) -> None:
                await anyio.lowlevel.checkpoint()
                await anyio.lowlevel.checkpoint()
                tg.cancel_scope.cancel()

            async def run_and_cancel_at_once() -> list[ExecutionResult]:
                with anyio.fail_after(10):  # a hang fails the test instead of stalling it
                    # none can finish before the cancel
                    return await run_all(pool, requests(stub.url, 64, sleep=30), cancel_at_once)

            results = anyio.run(run_and_cancel_at_once)
            assert len(results) == 64
            assert len({r.rollout_id for r in results}) == 64
            assert all(r.error.category is ErrorCategory.CANCELLED for r in results)
    finally:
        anyio.run(pool.aclose)


class HoldsALock(AgentWorkflow):
    async def run(self, ctx):
        import threading

        return [*ctx.prompt, {"role": "assistant", "content": "#### 1", "raw": threading.Lock()}]


def test_a_sample_that_cannot_be_pickled_arrives_as_a_run_without_workers_writes_it(stub):
    """A lock in a message cannot cross a pipe: it is sent as its JSON form (its repr), not lost."""
    pool = WorkerPool(HoldsALock, workers=2, max_concurrent=4)
    try:
        results = anyio.run(run_all, pool, requests(stub.url, 6))
    finally:
        anyio.run(pool.aclose)
    assert sorted(r.rollout_id for r in results) == [f"w{i}" for i in range(6)]
    assert all(r.ok for r in results), [r.error for r in results]
    raw = results[0].sample.messages[-1]["raw"]
    assert isinstance(raw, str)
    assert "lock" in raw


def test_a_dead_worker_fails_only_its_running_rollouts_and_is_replaced(stub):
    pool = WorkerPool(Sleeps, workers=2, max_concurrent=4)
    try:

        async def kill_one(_tg: anyio.abc.TaskGroup) -> None:
            await anyio.sleep(0.2)  # 2 running in each worker, 16 waiting
            os.kill(pool.worker_pids[0], signal.SIGKILL)

        first = pool.worker_pids[0]
        results = anyio.run(run_all, pool, requests(stub.url, 20, sleep=0.4), kill_one)
        health = pool.health()
    finally:
        anyio.run(pool.aclose)
    lost = [r for r in results if not r.ok]
    assert len(results) == 20
    assert len(lost) == 2  # only the two it was running
    assert all(r.error.category is ErrorCategory.INFRA_ERROR for r in lost)
    assert all(f"worker process {first} was killed by SIGKILL" in r.error.message for r in lost)
    assert health["restarts"] == 1
    assert health["status"] == "ok"
    assert first not in [w["pid"] for w in health["workers"] if w["alive"]]


def test_when_no_worker_can_be_replaced_waiting_rollouts_are_not_run_and_say_so(stub):
    pool = WorkerPool(Sleeps, workers=2, max_concurrent=2, max_restarts=0)
    try:

        async def kill_all() -> tuple[list[ExecutionResult], list[BaseException]]:
            results: list[ExecutionResult] = []
            refused: list[BaseException] = []

            async def keep(result: ExecutionResult) -> None:
                results.append(result)

            async def one(request: ExecutionRequest) -> None:
                try:
                    await pool.execute(request, keep, keep)
                except BackendUnavailable as exc:
                    refused.append(exc)

            async with anyio.create_task_group() as tg:
                for r in requests(stub.url, 6, sleep=1.0):
                    tg.start_soon(one, r)
                await anyio.sleep(0.3)
                for pid in pool.worker_pids:
                    os.kill(pid, signal.SIGKILL)
            return results, refused

        results, refused = anyio.run(kill_all)
    finally:
        anyio.run(pool.aclose)
    assert len(results) == 2
    assert all(r.error.category is ErrorCategory.INFRA_ERROR for r in results)
    assert len(refused) == 4
    assert "every worker process is gone" in str(refused[0])


def test_workers_that_die_together_never_block_the_event_loop(stub):
    """Both workers are killed while the loop is busy, so their ends and the zygote's exit reports
    are all ready in one turn of the loop: the first loss reads the reports, and the control
    socket's own callback, ready in the same turn, finds nothing left to read. It must return, not
    wait in ``recv`` for a report that never comes (no worker is replaced: ``max_restarts=0``)."""
    pool = WorkerPool(Sleeps, workers=2, max_concurrent=2, max_restarts=0)

    def stalled(_signum: int, _frame: object) -> None:
        raise TimeoutError("the event loop was blocked")

    async def kill_together(_tg: anyio.abc.TaskGroup) -> None:
        await anyio.sleep(0.3)
        for pid in pool.worker_pids:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)  # noqa: ASYNC251 (on purpose: all the kills cause is ready at the next turn)

    previous = signal.signal(signal.SIGALRM, stalled)
    signal.alarm(20)  # ends a blocked recv (asyncio logs the error of the callback it ended)
    try:
        started = time.monotonic()
        results = anyio.run(run_all, pool, requests(stub.url, 2, sleep=5.0), kill_together)
        took = time.monotonic() - started
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        anyio.run(pool.aclose)
    assert took < 10, f"the pool blocked the event loop for {took:.1f} s"
    assert len(results) == 2
    assert all(r.error.category is ErrorCategory.INFRA_ERROR for r in results)


# -- osmosis run with workers, as a user runs it ---------------------------------------------------


def _dataset(path: Path, rows: int) -> Path:
    with path.open("w") as handle:
        for i in range(rows):
            handle.write(json.dumps({"user_prompt": f"val1 = {i}\nval2 = 3", "ground_truth": str(3 * i)}) + "\n")
    return path


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _run_args(osmosis_exe: str, policy_url: str, data: Path, *, concurrency: int) -> list[str]:
    """`osmosis run` of the multiply example over `data` with two workers, into ./out."""
    return [
        osmosis_exe,
        "run",
        "configs/eval/multiply-plain.toml",
        "--policy-url",
        policy_url,
        "--dataset",
        str(data),
        "--workers",
        "2",
        "--concurrency",
        str(concurrency),
        "--output",
        "out",
    ]


def _wait_for_lines(path: Path, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never reached {n} lines")


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
    lines = _lines(workspace / "out" / "results.jsonl")
    assert len(lines) == 20
    assert all(x["reward"] == 1.0 for x in lines)


def test_killing_every_worker_writes_off_only_what_they_were_running(workspace, osmosis_exe, clean_env):
    """kill -9 of both workers mid-run: at most their in-flight rollouts fail; the run goes on and finishes."""
    data = _dataset(workspace / "big.jsonl", 300)
    with ScriptedPolicyServer(latency=0.3) as server:
        args = _run_args(osmosis_exe, server.url, data, concurrency=16)
        proc = subprocess.Popen(
            args, cwd=workspace, env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        results = workspace / "out" / "results.jsonl"
        _wait_for_lines(results, 20)
        [zygote] = [p for p in children(proc.pid)]
        workers = children(zygote)
        assert len(workers) == 2
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    lines = _lines(results)
    failed = [x for x in lines if x["status"] != "success"]
    pairs = {(x["row"], x["sample_index"]) for x in lines}
    print(f"\nrollouts written off by 2 worker deaths: {len(failed)} (concurrency 16, 300 rows)")
    assert proc.returncode == 0, err
    assert len(lines) == 300
    assert len(pairs) == 300
    assert 1 <= len(failed) <= 16
    assert all(
        x["error"]["category"] == "infra_error" and "was killed by SIGKILL" in x["error"]["message"] for x in failed
    )


def test_a_killed_run_leaves_no_worker_calling_the_policy(workspace, osmosis_exe, clean_env):
    """kill -9 of `osmosis run --workers 2`: its zygote and workers see the lifeline break and exit."""
    data = _dataset(workspace / "big.jsonl", 500)
    with ScriptedPolicyServer(latency=0.2) as server:
        args = _run_args(osmosis_exe, server.url, data, concurrency=8)
        proc = subprocess.Popen(
            args, cwd=workspace, env=clean_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _wait_for_lines(workspace / "out" / "results.jsonl", 5)
        started = descendants(proc.pid)
        assert len(started) == 3  # the zygote and two workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(p) for p in started):
            time.sleep(0.05)
        assert not [p for p in started if alive(p)]
        time.sleep(0.5)  # calls already in flight are logged when their 0.2 s latency ends
        calls = len(server.requests)
        time.sleep(1.0)
        assert len(server.requests) == calls  # nobody calls the policy for a dead run


BLOCKING_ROLLOUT = """
import asyncio
import time
from collections.abc import Awaitable, Callable
from osmosis_core import AgentWorkflow


class Blocks(AgentWorkflow):
    async def run(self, ctx):
        if not ctx.metadata.get("quick"):
            await asyncio.sleep(0.5)  # the quick rollouts of this worker report first
            time.sleep(60)  # synchronous: the worker's event loop is stuck
        return [*ctx.prompt, {"role": "assistant", "content": "#### 1"}]
"""


def _blocking_run(workspace: Path, osmosis_exe: str) -> list[str]:
    """`osmosis run --workers 2` of six rows: two quick ones, four that block their worker's loop."""
    rollout = workspace / "rollouts" / "blocks"
    rollout.mkdir()
    (rollout / "main.py").write_text(BLOCKING_ROLLOUT)
    data = workspace / "rows.jsonl"
    data.write_text("".join(json.dumps({"user_prompt": f"{i}", "quick": i < 2}) + "\n" for i in range(6)))
    args = [osmosis_exe, "run", "--rollout", str(rollout), "--dataset", str(data), "--stub-policy"]
    return [*args, "--workers", "2", "--concurrency", "4", "--output", "out"]


def test_a_killed_run_leaves_no_blocked_worker_and_no_lock_behind(workspace, osmosis_exe, clean_env):
    """kill -9 of `osmosis run --workers 2` while both workers sit in time.sleep: they cannot read the
    lifeline, so the zygote kills them; the run folder's lock went with the run, --resume is not refused."""
    args = _blocking_run(workspace, osmosis_exe)
    proc = subprocess.Popen(args, cwd=workspace, env=clean_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_lines(workspace / "out" / "results.jsonl", 2)  # the quick rows are in ...
        time.sleep(1.5)  # ... and the rest are stuck in time.sleep
        started = descendants(proc.pid)
        assert len(started) >= 3  # the zygote, two workers (and the --stub-policy server)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(alive(p) for p in started):
            time.sleep(0.1)
        assert not [p for p in started if alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
    from osmosis_core._engine.run_lock import RunLock

    with RunLock(workspace / "out"):  # refused while any process still held the lock
        pass


@pytest.mark.slow
def test_sigterm_to_the_process_group_never_hangs_and_loses_nothing(workspace, osmosis_exe, clean_env):
    """SIGTERM to the whole group (systemd, SLURM, `kill 0`), 20 times: exit 130 each time, then --resume
    finishes exactly the rest; no rollout lost, none run twice."""
    data = _dataset(workspace / "big.jsonl", 400)
    rounds = 0
    with ScriptedPolicyServer(latency=0.05) as server:
        args = _run_args(osmosis_exe, server.url, data, concurrency=16)
        results = workspace / "out" / "results.jsonl"
        for attempt in range(20):
            extra = ["--resume"] if attempt else []
            before = len(_lines(results))
            proc = subprocess.Popen(
                [*args, *extra],
                cwd=workspace,
                env=clean_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            _wait_for_lines(results, before + 3)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                raise AssertionError(f"round {attempt}: SIGTERM did not end the run within 30 s") from None
            assert proc.returncode == 130, err
            rounds += 1
            lines = _lines(results)
            if len(lines) >= 400:
                break
        final = subprocess.run([*args, "--resume"], cwd=workspace, env=clean_env, capture_output=True, text=True)
        assert final.returncode == 0, final.stderr
    lines = _lines(results)
    pairs = [(x["row"], x["sample_index"]) for x in lines]
    print(f"\nSIGTERM to the process group: {rounds} rounds, {len(pairs)} records, {len(set(pairs))} pairs")
    assert len(pairs) == len(set(pairs)) == 400  # nothing lost, nothing twice
    assert all(x["status"] == "success" for x in lines)


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
    _wait_for_lines(results, 2)
    started = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    time.sleep(0.2)
    assert len(started) == 4  # the stand-in server, the zygote and two workers
    assert not [pid for pid in started if alive(pid)]
    kept = _lines(results)
    assert kept
    assert all(x["status"] == "success" for x in kept)


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


def test_a_second_signal_stops_at_once_and_keeps_the_summary(workspace, osmosis_exe, clean_env):
    """Both workers sit in time.sleep, so the first SIGTERM's cancellation must wait out the grace
    period; a second SIGTERM stops at once, and summary.json, the results and no process are left."""
    args = _blocking_run(workspace, osmosis_exe)
    proc = subprocess.Popen(
        args, cwd=workspace, env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for_lines(workspace / "out" / "results.jsonl", 2)
        time.sleep(1.5)  # the other rollouts are stuck in time.sleep
        started = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None  # still waiting for the blocked workers
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)  # (the workers hold the output pipes until the zygote has killed them)
        waited = time.monotonic() - sent
        _, err = proc.communicate(timeout=30)
        assert waited < 2.0, (waited, err)  # not the workers' 10 s grace period
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted again" in err
    assert "2 finished results are kept" in err
    summary = json.loads((workspace / "out" / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["finished"] == 2
    assert [x["status"] for x in _lines(workspace / "out" / "results.jsonl")] == ["success", "success"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in started):
        time.sleep(0.1)
    assert not [p for p in started if alive(p)]
    from osmosis_core._engine.run_lock import RunLock

    with RunLock(workspace / "out"):  # --resume would not be refused
        pass


CLEANS_UP_SLOWLY = """
import asyncio
import time
from collections.abc import Awaitable, Callable
from osmosis_core import AgentWorkflow


class CleansUpSlowly(AgentWorkflow):
    async def run(self, ctx):
        if ctx.metadata.get("quick"):
            return [*ctx.prompt, {"role": "assistant", "content": "#### 1"}]
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            time.sleep(20)  # synchronous clean-up: the run's event loop is stuck
            raise
"""


def test_a_second_signal_stops_at_once_even_while_the_event_loop_is_blocked(workspace, osmosis_exe, clean_env):
    """No workers: the first SIGTERM's cancellation runs a rollout's blocking clean-up in the run's own
    event loop; the second SIGTERM still stops at once (a plain signal handler, not the loop's)."""
    rollout = workspace / "rollouts" / "slow-cleanup"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text(CLEANS_UP_SLOWLY)
    data = workspace / "rows.jsonl"
    data.write_text("".join(json.dumps({"user_prompt": f"{i}", "quick": i < 2}) + "\n" for i in range(4)))
    args = [osmosis_exe, "run", "--rollout", str(rollout), "--dataset", str(data), "--stub-policy"]
    args += ["--concurrency", "4", "--output", "out"]
    proc = subprocess.Popen(
        args, cwd=workspace, env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for_lines(workspace / "out" / "results.jsonl", 2)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None  # inside the blocking clean-up
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        waited = time.monotonic() - sent
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert waited < 2.0, (waited, err)
    assert proc.returncode == 130, err
    assert "interrupted again" in err
    summary = json.loads((workspace / "out" / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["finished"] == 2
