"""The rollout lifecycle written once (osmosis_core.lifecycle): what every backend's reports obey,
and the run's limits (RunLimits) as the worker pool and Ray split them."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from osmosis_core import (
    AgentWorkflowConfig,
    ConcurrencyConfig,
    ErrorCategory,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    GraderConfig,
    PolicyEndpoint,
)
from osmosis_core.plugin import BackendUnavailable, RolloutReporter, RunLimits

WF, GR = ExecutionStage.WORKFLOW, ExecutionStage.GRADER
OK, FAILED, CANCELLED = ExecutionStatus.SUCCESS, ExecutionStatus.FAILURE, ExecutionStatus.CANCELLED
REQUEST = ExecutionRequest("r1", [], PolicyEndpoint("http://127.0.0.1:9/v1", "m", api_key="sk-secret-key"))


def _seen() -> tuple[list[tuple[str, ExecutionStage, ExecutionStatus]], object, object]:
    seen: list[tuple[str, ExecutionStage, ExecutionStatus]] = []

    async def on_workflow(result: ExecutionResult) -> None:
        seen.append(("workflow", result.stage, result.status))

    async def on_grader(result: ExecutionResult) -> None:
        seen.append(("grader", result.stage, result.status))

    return seen, on_workflow, on_grader


def test_each_callback_once_and_in_order():
    seen, on_workflow, on_grader = _seen()

    async def main() -> None:
        async with RolloutReporter(REQUEST, on_workflow, on_grader) as rollout:
            await rollout.report(ExecutionResult("r1", WF, OK))
            await rollout.report(ExecutionResult("r1", WF, OK))  # a second workflow result is dropped
            await rollout.report(ExecutionResult("r1", GR, OK))
            await rollout.report(ExecutionResult("r1", GR, OK))  # and a second grader result
            assert rollout.ended

    anyio.run(main)
    assert seen == [("workflow", WF, OK), ("grader", GR, OK)]


def test_a_grader_result_before_the_workflows_is_the_backends_infra_error():
    seen: list[ExecutionResult] = []

    async def keep(result: ExecutionResult) -> None:
        seen.append(result)

    async def main() -> None:
        async with RolloutReporter(REQUEST, keep, keep) as rollout:
            await rollout.report(ExecutionResult("r1", GR, OK))

    anyio.run(main)
    [only] = seen
    assert (only.stage, only.status) == (WF, FAILED)
    assert only.error is not None
    assert only.error.category is ErrorCategory.INFRA_ERROR
    assert "before its workflow" in only.error.message


def test_a_failed_or_ungraded_workflow_is_the_last_report():
    for grades, status in ((True, FAILED), (False, OK)):
        seen, on_workflow, on_grader = _seen()

        async def main(grades=grades, status=status, on_workflow=on_workflow, on_grader=on_grader) -> None:
            with anyio.CancelScope() as scope:
                async with RolloutReporter(REQUEST, on_workflow, on_grader, grades=grades) as rollout:
                    result = ExecutionResult("r1", WF, status, error=None if status is OK else _error())
                    await rollout.report(result)
                    assert rollout.ended
                    scope.cancel()
                    await anyio.sleep(1)  # cancelled after its last report: nothing more is said

        anyio.run(main)
        assert [s[2] for s in seen] == [status], seen


def _error():  # type: ignore[no-untyped-def]
    from osmosis_core import ErrorInfo

    return ErrorInfo(ErrorCategory.AGENT_ERROR, "it broke")


def test_a_cancellation_is_reported_once_for_the_stage_it_hit_and_passed_on():
    for reported, stage in (([], WF), ([ExecutionResult("r1", WF, OK)], GR)):
        seen, on_workflow, on_grader = _seen()
        passed_on = []

        async def main(reported=reported, on_workflow=on_workflow, on_grader=on_grader, passed_on=passed_on) -> None:
            with anyio.CancelScope() as scope:
                try:
                    async with RolloutReporter(REQUEST, on_workflow, on_grader) as rollout:
                        for result in reported:
                            await rollout.report(result)
                        scope.cancel()
                        await anyio.sleep(1)
                except anyio.get_cancelled_exc_class():
                    passed_on.append(True)
                    await rollout.cancelled()  # a second report is not made
                    raise

        anyio.run(main)
        assert seen[-1] == ("workflow" if stage is WF else "grader", stage, CANCELLED), seen
        assert len(seen) == len(reported) + 1
        assert passed_on == [True]


def test_an_exception_of_the_machinery_is_an_infra_error_without_secrets():
    seen: list[ExecutionResult] = []

    async def keep(result: ExecutionResult) -> None:
        seen.append(result)

    async def main() -> None:
        async with RolloutReporter(REQUEST, keep, keep) as rollout:
            await rollout.report(ExecutionResult("r1", WF, OK))
            raise RuntimeError("the sandbox vanished (key sk-secret-key)")

    anyio.run(main)
    [_, last] = seen
    assert (last.stage, last.status) == (GR, FAILED)
    assert last.error is not None
    assert last.error.category is ErrorCategory.INFRA_ERROR
    assert "the sandbox vanished" in last.error.message
    assert "sk-secret-key" not in last.error.message


def test_a_callbacks_own_exception_and_backend_unavailable_are_passed_on():
    async def broken(result: ExecutionResult) -> None:
        raise ValueError("the caller's bug")

    async def main() -> None:
        async with RolloutReporter(REQUEST, broken) as rollout:
            await rollout.report(ExecutionResult("r1", WF, OK))

    with pytest.raises(ValueError, match="the caller's bug"):
        anyio.run(main)

    seen, on_workflow, on_grader = _seen()

    async def unavailable() -> None:
        async with RolloutReporter(REQUEST, on_workflow, on_grader):
            raise BackendUnavailable("no worker left")

    with pytest.raises(BackendUnavailable):
        anyio.run(unavailable)
    assert seen == []


def test_run_limits_resolve_from_the_authors_configs_and_split_evenly():
    authors = AgentWorkflowConfig(concurrency=ConcurrencyConfig(max_concurrent=6))
    grading = GraderConfig(concurrency=ConcurrencyConfig(max_concurrent=3))
    assert RunLimits().resolve(authors, None) == RunLimits(6, 6)
    assert RunLimits().resolve(authors, grading) == RunLimits(6, 3)
    assert RunLimits(concurrency=10).resolve(authors, grading) == RunLimits(10, 3)
    assert RunLimits(10, 3).split(4) == RunLimits(3, 1)
    assert RunLimits(1, 1).split(8) == RunLimits(1, 1)
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        RunLimits(concurrency=0)


# -- the caller's side: run_one ---------------------------------------------------------------------


class _Scripted:
    """A backend that reports ``results`` through the callbacks, then does ``then``."""

    def __init__(self, *results: ExecutionResult, then: BaseException | None = None) -> None:
        self.results, self.then = results, then

    async def execute(self, request, on_workflow_complete, on_grader_complete) -> None:  # type: ignore[no-untyped-def]
        for result in self.results:
            await (on_workflow_complete if result.stage is WF else on_grader_complete)(result)
        if self.then is not None:
            raise self.then


def _sample_result(stage: ExecutionStage, status: ExecutionStatus = OK) -> ExecutionResult:
    from osmosis_core import RolloutSample

    sample = RolloutSample(messages=[{"role": "assistant", "content": "x"}], reward=1.0 if stage is GR else None)
    return ExecutionResult("r1", stage, status, sample=sample, timings={stage.value: 0.5})


def test_run_one_turns_whatever_goes_wrong_around_a_backend_into_one_failure_of_the_stage_under_way() -> None:
    from osmosis_core.plugin import RolloutReports, run_one

    workflow, grader = _sample_result(WF), _sample_result(GR)
    assert anyio.run(run_one, _Scripted(workflow, grader), REQUEST) is grader
    assert anyio.run(run_one, _Scripted(workflow, workflow, grader, grader), REQUEST) is grader  # once per stage

    cases = {
        "silent": (_Scripted(), WF, "the backend (_Scripted) returned without reporting a result"),
        "raised": (_Scripted(workflow, then=RuntimeError("boom sk-secret-key")), GR, "RuntimeError: boom ***"),
        "stray": (_Scripted(then=asyncio.CancelledError()), WF, "raised CancelledError while nobody"),
    }
    for name, (backend, stage, message) in cases.items():
        final = anyio.run(run_one, backend, REQUEST)
        assert (final.stage, final.status) == (stage, FAILED), name
        assert final.error is not None, name
        assert final.error.category is ErrorCategory.INFRA_ERROR, name
        assert message in final.error.message, (name, final.error)
        assert "sk-secret" not in final.error.message, (name, final.error)
        if stage is GR:  # the workflow's sample and timings are carried into the failure
            assert final.sample is workflow.sample
            assert final.timings == {"workflow": 0.5}

    reports = RolloutReports(REQUEST)
    final = anyio.run(run_one, _Scripted(then=BackendUnavailable("no cluster, key sk-secret-key")), REQUEST, reports)
    assert reports.unavailable == "no cluster, key ***"
    assert final.error is not None
    assert final.error.message == "the backend is unavailable: no cluster, key ***"

    heard: list[ExecutionResult] = []

    async def cancelled_while_grading() -> None:
        async def on_workflow(result: ExecutionResult) -> None:
            heard.append(result)

        class Hangs:
            async def execute(self, request, on_workflow_complete, on_grader_complete) -> None:  # type: ignore[no-untyped-def]
                await on_workflow_complete(workflow)
                await anyio.sleep(60)

        with anyio.move_on_after(0.2):
            await run_one(Hangs(), REQUEST, reports, on_workflow_complete=on_workflow)
            raise AssertionError("the cancellation was not passed on")

    reports = RolloutReports(REQUEST)
    anyio.run(cancelled_while_grading)
    assert heard == [workflow]
    assert reports.stage is GR
    cancelled = reports.cancelled("stopped")
    assert (cancelled.stage, cancelled.status, cancelled.sample) == (GR, CANCELLED, None)

    class Malformed:
        async def execute(self, request, on_workflow_complete, on_grader_complete) -> None:  # type: ignore[no-untyped-def]
            await on_workflow_complete({"stage": "workflow"})

    final = anyio.run(run_one, Malformed(), REQUEST)
    assert final.error is not None
    assert "reports an ExecutionResult, got dict" in final.error.message
