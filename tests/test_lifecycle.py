"""The rollout lifecycle written once (osmosis_core.lifecycle): what every backend's reports obey,
and the run's limits (RunLimits) as the worker pool and Ray split them."""

from __future__ import annotations

import anyio
import pytest

from osmosis_core import (
    AgentWorkflowConfig,
    BackendUnavailable,
    ConcurrencyConfig,
    ErrorCategory,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    GraderConfig,
    PolicyEndpoint,
    RunLimits,
)
from osmosis_core.plugin import Rollout

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
        async with Rollout(REQUEST, on_workflow, on_grader) as rollout:
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
        async with Rollout(REQUEST, keep, keep) as rollout:
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
                async with Rollout(REQUEST, on_workflow, on_grader, grades=grades) as rollout:
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
                    async with Rollout(REQUEST, on_workflow, on_grader) as rollout:
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
        async with Rollout(REQUEST, keep, keep) as rollout:
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
        async with Rollout(REQUEST, broken) as rollout:
            await rollout.report(ExecutionResult("r1", WF, OK))

    with pytest.raises(ValueError, match="the caller's bug"):
        anyio.run(main)

    seen, on_workflow, on_grader = _seen()

    async def unavailable() -> None:
        async with Rollout(REQUEST, on_workflow, on_grader):
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
