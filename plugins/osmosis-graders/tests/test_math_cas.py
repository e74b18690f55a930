"""The `math` grader's CAS: math-verify in worker processes, killable, never blocking the loop."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from osmosis_core import (
    AgentWorkflow,
    ErrorCategory,
    ExecutionRequest,
    ExecutionResult,
    GraderContext,
    LocalBackend,
    PolicyEndpoint,
    RolloutSample,
)
from osmosis_graders import MathConfig, MathGrader
from osmosis_graders.cas_pool import GRACE_SEC, CasPool, CasUnavailable, cas_check, cas_pool

pytestmark = pytest.mark.timeout(180)

HOSTILE = r"9^{9^{9^{9}}}"  # one C-level bignum power: neither math-verify's alarm nor ours can stop it


@pytest.fixture(scope="module", autouse=True)
def warm_pool():
    """Two ready workers for the module (sympy takes seconds to import; it is not what is tested)."""
    asyncio.run(cas_pool().warm_up(2))
    yield
    cas_pool().shutdown()


EQUIVALENT = [
    # (answer, label, reward): none of these is decided by the fast path (checked below)
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 1.0),
    (r"\boxed{\{2, 1\}}", r"\{1,2\}", 1.0),  # sets
    (r"\boxed{[0, 1)}", "[0,1/2+1/2)", 1.0),  # intervals
    (r"\boxed{(0, 1]}", "[0,1]", 0.0),
    (r"\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
    (r"\boxed{x = 3}", "3", 1.0),
    (r"\boxed{50\%}", "0.5", 1.0),
    (r"\boxed{2\pi}", r"\frac{4\pi}{2}", 1.0),
    (r"\boxed{\frac{1}{2}, \frac{1}{3}}", r"\frac{1}{3}, \frac{1}{2}", 1.0),
    (r"\boxed{3x}", "3y", 0.0),
]


def _grade_all(grader: MathGrader, cases: list[tuple[str, str]]) -> list[tuple[float | None, RolloutSample]]:
    async def main() -> list[tuple[float | None, RolloutSample]]:
        out = []
        for reply, label in cases:
            sample = RolloutSample(messages=[{"role": "assistant", "content": reply}])
            ctx = GraderContext(sample, label, [], {}, grader.config)
            out.append((await grader.grade(ctx), sample))
        return out

    return asyncio.run(main())


def test_equivalence_by_math_verify():
    results = _grade_all(MathGrader(), [(a, b) for a, b, _ in EQUIVALENT])
    for (reply, label, reward), (got, sample) in zip(EQUIVALENT, results, strict=True):
        assert got == reward, (reply, label, sample.metrics)
        assert sample.metrics["math.path"] == "cas"
    assert results[3][1].metrics["math.reason"] == "not equivalent"


def test_a_hostile_expression_ends_within_its_time_limit_and_the_pool_recovers():
    limit = 1.0
    grader = MathGrader(MathConfig(cas_timeout_sec=limit))
    killed = cas_pool().stats()["killed"]

    async def main() -> tuple[float, float, float | None, RolloutSample]:
        gaps: list[float] = []

        async def ticker() -> None:  # the loop must stay free while the CAS spins
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        sample = RolloutSample(messages=[{"role": "assistant", "content": rf"\boxed{{{HOSTILE}}}"}])
        started = time.perf_counter()
        reward = await grader.grade(GraderContext(sample, "1", [], {}, grader.config))
        elapsed = time.perf_counter() - started
        tick.cancel()
        return elapsed, max(gaps), reward, sample

    elapsed, worst_gap, reward, sample = asyncio.run(main())
    assert reward == 0.0
    assert sample.metrics["math.reason"].startswith("computing: the CAS ran past its 1 s per-comparison limit (after ")
    assert elapsed < limit + GRACE_SEC + 0.5, elapsed
    assert worst_gap < 0.2, worst_gap
    # the worker stopped itself (its alarm) or was killed: either way the next comparison works
    assert cas_pool().stats()["killed"] in (killed, killed + 1)
    [(again, _)] = _grade_all(grader, [(r"\boxed{\frac{2}{4}\cdot 2}", "1")])
    assert again == 1.0


def test_a_worker_that_does_not_answer_is_killed_at_the_limit_plus_grace_and_replaced():
    """What a C-level spin looks like from outside (the worker's alarm cannot run): a stopped process."""
    pool = cas_pool()
    asyncio.run(pool.warm_up(2))
    stuck = pool.pids()[-1]  # the idle worker the next job takes
    os.kill(stuck, signal.SIGSTOP)
    before = pool.stats()

    async def main() -> tuple[float, object]:
        started = time.perf_counter()
        result = await cas_check("1", r"\sqrt{1}", limit=0.5, workers=1)
        return time.perf_counter() - started, result

    elapsed, result = asyncio.run(main())
    assert result.outcome == "timeout"
    assert result.detail == f"killed after {0.5 + GRACE_SEC:g} s"
    assert 0.5 + GRACE_SEC <= elapsed < 0.5 + GRACE_SEC + 0.5
    assert pool.stats()["killed"] == before["killed"] + 1
    assert stuck not in pool.pids()
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{stuck}") and _state(stuck) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{stuck}") or _state(stuck) == "Z"  # SIGKILL ends a stopped process too
    assert asyncio.run(cas_check("4", r"\sqrt{16}", limit=5.0)).outcome == "equal"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_soft_timeout_keeps_the_worker():
    """Pure-Python work is stopped by the worker's own alarm: it answers `timeout` and is reused."""

    async def main():
        before = cas_pool().stats()
        result = await cas_check("1", r"\sum_{k=1}^{50000000} k", limit=0.5)
        return before, result, cas_pool().stats()

    before, result, after = asyncio.run(main())
    if result.outcome == "timeout" and after["killed"] == before["killed"]:
        assert after["started"] == before["started"]  # no respawn
    else:  # math-verify answered in time on a fast machine: the limit was not needed
        assert result.outcome in ("different", "equal", "timeout")


def test_a_label_math_verify_cannot_read_fails_the_grading():
    with pytest.raises(ValueError, match="math-verify cannot read the label"):
        _grade_all(MathGrader(), [(r"\boxed{x+1}", "} \\frac{1")])


def test_an_answer_math_verify_cannot_read_scores_zero():
    [(reward, sample)] = _grade_all(MathGrader(), [(r"\boxed{} \frac{1}", "x+1")])
    assert reward == 0.0
    assert sample.metrics["math.reason"]


def test_workers_serve_many_loops_and_gradings_run_in_parallel():
    grader = MathGrader(MathConfig(cas_workers=2))
    asyncio.run(MathGrader.warm_up(2))
    started = cas_pool().stats()["started"]
    for _ in range(2):  # two event loops, one after the other: the same idle workers serve both
        results = _grade_all(grader, [(r"\boxed{\sqrt{4}}", "2"), (r"\boxed{\sqrt{9}}", "3")])
        assert [r for r, _ in results] == [1.0, 1.0]

    async def parallel() -> list[float | None]:
        samples = [
            RolloutSample(messages=[{"role": "assistant", "content": rf"\boxed{{\sqrt{{{n * n}}}}}"}])
            for n in range(2, 8)
        ]
        return await asyncio.gather(
            *(
                MathGrader(grader.config).grade(GraderContext(s, str(n), [], {}, grader.config))
                for s, n in zip(samples, range(2, 8), strict=True)
            )
        )

    assert asyncio.run(parallel()) == [1.0] * 6
    assert cas_pool().stats()["started"] == started  # no new process: two slots for this loop, two idle workers


def test_a_cancelled_grading_kills_its_worker():
    grader = MathGrader(MathConfig(cas_timeout_sec=30))

    async def main() -> None:
        sample = RolloutSample(messages=[{"role": "assistant", "content": rf"\boxed{{{HOSTILE}}}"}])
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):  # what the backend's grader timeout does
                await grader.grade(GraderContext(sample, "1", [], {}, grader.config))
        # it timed out computing, not waiting for a worker, and says so
        assert sample.metrics["math.reason"].startswith("computing: the CAS ran ")
        assert sample.metrics["math.cas_compute_sec"] >= 0.4

    killed = cas_pool().stats()["killed"]
    live = cas_pool().stats()["live"]
    asyncio.run(main())
    assert cas_pool().stats()["killed"] == killed + 1
    assert cas_pool().stats()["live"] == live - 1  # the stuck process is gone, not left spinning


def test_a_worker_that_cannot_import_math_verify_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "math_verify.py").write_text("raise ImportError('broken on purpose')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the worker inherits it, and finds this module first
    pool = CasPool()
    try:
        with pytest.raises(CasUnavailable, match="math-verify cannot be imported: ImportError: broken on purpose"):
            asyncio.run(pool.check("1", "x", limit=5.0))
        assert pool.stats()["live"] == 0
    finally:
        pool.shutdown()


class _Replies(AgentWorkflow):
    """Answers with the prompt's text (the answer under test)."""

    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": ctx.prompt[-1]["content"]}]


def test_a_saturated_cas_tells_waiting_for_a_worker_from_computing():
    """One CAS worker, held by a hostile expression: a grading whose timeout comes while it waits for the
    worker says so (reason, metrics and the timeout's message), and one that waits it out records its wait
    apart from its compute time; the hostile one ran past the per-comparison compute limit."""
    backend = LocalBackend(_Replies, grader=MathGrader, grader_config=MathConfig(cas_workers=1, cas_timeout_sec=3))
    policy = PolicyEndpoint("http://127.0.0.1:9/v1", "m")

    async def one(i: int, reply: str, label: str, timeout: float, delay: float) -> ExecutionResult:
        await asyncio.sleep(delay)
        results: list[ExecutionResult] = []

        async def keep(result: ExecutionResult) -> None:
            results.append(result)

        prompt = [{"role": "user", "content": reply}]
        request = ExecutionRequest(f"r{i}", prompt, policy, label=label, grader_timeout_sec=timeout)
        await backend.execute(request, keep, keep)
        return results[-1]

    async def main() -> list[ExecutionResult]:
        return await asyncio.gather(
            one(0, rf"\boxed{{{HOSTILE}}}", "1", 120, 0.0),  # holds the only worker for 3 s + grace
            one(1, r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 1.0, 0.3),  # times out in the queue
            one(2, r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 120, 0.5),  # waits, then computes
        )

    hostile, queued, waited = asyncio.run(main())
    assert hostile.reward == 0.0
    assert hostile.sample.metrics["math.reason"].startswith("computing: the CAS ran past its 3 s per-comparison limit")
    assert hostile.sample.metrics["math.cas_compute_sec"] >= 3.0

    assert queued.error is not None
    assert queued.error.category is ErrorCategory.TIMEOUT
    assert queued.error.message.startswith("the grader ran past its 1 s timeout (waiting for a CAS worker: ")
    assert "all 1 busy" in queued.error.message
    assert "its comparison never started" in queued.error.message
    metrics = queued.sample.metrics
    assert metrics["math.reason"].startswith("waiting for a CAS worker: ")
    assert metrics["math.cas_wait_sec"] >= 0.9
    assert metrics["math.cas_compute_sec"] == 0.0

    assert waited.reward == 1.0
    metrics = waited.sample.metrics
    assert metrics["math.path"] == "cas"
    assert metrics["math.cas_wait_sec"] >= 2.0  # behind the hostile one (3 s from t=0; it came at 0.5 s)
    assert 0.0 < metrics["math.cas_compute_sec"] < metrics["math.cas_wait_sec"]
