"""LocalBackend: results, categories, timeouts, limits, fresh instances, cancellation, health."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import attrs
import pytest

from osmosis_core import (
    AgentWorkflow,
    AgentWorkflowConfig,
    ConcurrencyConfig,
    ErrorCategory,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    Grader,
    GraderConfig,
    LocalBackend,
    PolicyEndpoint,
    RolloutSample,
    get_rollout_context,
)
from osmosis_core.testing import Fault, run_rollout_sync

POLICY = PolicyEndpoint("http://127.0.0.1:9/v1", "m", api_key="sk-secret-value-123")


def request(i: int = 0, label: Any = "42", **kw: Any) -> ExecutionRequest:
    return ExecutionRequest(f"r{i}", [{"role": "user", "content": f"q{i}"}], POLICY, label=label, **kw)


async def execute(backend: LocalBackend, req: ExecutionRequest) -> list[ExecutionResult]:
    results: list[ExecutionResult] = []

    async def keep(result: ExecutionResult) -> None:
        results.append(result)

    await backend.execute(req, keep, keep)
    return results


def run_one(backend: LocalBackend, req: ExecutionRequest | None = None) -> list[ExecutionResult]:
    return anyio.run(execute, backend, req or request())


class Echo(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": "#### 42"}]


class Exact(Grader):
    async def grade(self, ctx):
        return 1.0 if ctx.sample.last_text().endswith(str(ctx.label)) else 0.0


def test_success_reports_both_stages_with_timings():
    results = run_one(LocalBackend(Echo, grader=Exact))
    assert [r.stage.value for r in results] == ["workflow", "grader"]
    assert all(r.ok for r in results)
    assert results[1].reward == 1.0
    assert results[1].sample.messages[-1]["content"] == "#### 42"
    assert {"queued", "workflow", "grader"} <= set(results[1].timings)


def test_workflow_may_return_sample_or_register_a_source():
    class ReturnsSample(AgentWorkflow):
        async def run(self, ctx):
            return RolloutSample(messages=[{"role": "assistant", "content": "x"}], metrics={"turns": 3})

    class Registers(AgentWorkflow):
        async def run(self, ctx):
            async def source() -> RolloutSample:
                return RolloutSample(messages=[{"role": "assistant", "content": ctx.rollout_id}])

            get_rollout_context().set_sample_source(source)

    [r] = run_one(LocalBackend(ReturnsSample))
    assert r.sample.metrics == {"turns": 3}
    [r] = run_one(LocalBackend(Registers))
    assert r.ok
    assert r.sample.messages[0]["content"] == "r0"


class Raises(AgentWorkflow):
    exc: BaseException = RuntimeError("boom")

    async def run(self, ctx):
        raise type(self).exc


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (TimeoutError("slow"), "timeout"),
        (ValueError("bad"), "validation_error"),
        (TypeError("bad type"), "validation_error"),
        (AssertionError("nope"), "validation_error"),
        (KeyError("k"), "agent_error"),
        (ZeroDivisionError("div"), "agent_error"),
    ],
)
@pytest.mark.parametrize("stage", ["workflow", "grader"])
def test_each_exception_type_maps_to_its_category(exc, category, stage):
    cls = type("W", (Raises,), {"exc": exc})
    grader_cls = type("G", (Grader,), {"grade": lambda self, ctx: _raise(exc)})
    backend = LocalBackend(Echo, grader=grader_cls) if stage == "grader" else LocalBackend(cls, grader=Exact)
    results = run_one(backend)
    last = results[-1]
    assert last.stage.value == stage
    assert last.status is ExecutionStatus.FAILURE
    assert last.error.category.value == category
    assert type(exc).__name__ in last.error.message
    assert "test_local_backend.py" in last.error.message  # names where it was raised
    if stage == "workflow":
        assert len(results) == 1  # no grading after a failed workflow


async def _raise(exc: BaseException) -> None:
    raise exc


def test_workflow_and_grader_timeouts_are_separate():
    class Slow(AgentWorkflow):
        async def run(self, ctx):
            await anyio.sleep(5)

    class SlowGrader(Grader):
        async def grade(self, ctx):
            await anyio.sleep(5)

    [r] = run_one(LocalBackend(Slow, grader=Exact), request(agent_timeout_sec=0.05))
    assert r.error.category is ErrorCategory.TIMEOUT
    assert "workflow ran past its 0.05 s timeout" in r.error.message
    results = run_one(LocalBackend(Echo, grader=SlowGrader), request(agent_timeout_sec=0.05, grader_timeout_sec=0.05))
    assert results[0].ok
    assert results[1].error.category is ErrorCategory.TIMEOUT
    assert "grader" in results[1].error.message


def test_a_row_without_a_label_runs_ungraded_unless_labels_are_required():
    """As the reference SDK documents it: the grader runs when a grader and a label are available."""
    [only] = run_one(LocalBackend(Echo, grader=Exact), request(label=None))
    assert (only.stage, only.status, only.reward) == (ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS, None)
    results = run_one(LocalBackend(Echo, grader=Exact, require_labels=True), request(label=None))
    assert results[-1].status is ExecutionStatus.FAILURE
    assert results[-1].error.category is ErrorCategory.VALIDATION_ERROR
    assert "no label" in results[-1].error.message
    [skipped] = run_one(LocalBackend(Echo, grader=Exact), attrs.evolve(request(), grade=False))
    assert (skipped.stage, skipped.reward) == (ExecutionStage.WORKFLOW, None)


NAMED_CONFIG = AgentWorkflowConfig(name="reached by its import path")


def test_classes_and_configs_may_be_import_paths():
    """osmosis-ai's documented constructor: LocalBackend(workflow="pkg.mod:Class", grader="pkg.mod:Class")."""
    backend = LocalBackend(
        workflow="osmosis_core.testing.contract:ContractWorkflow",
        grader="osmosis_core.testing.contract:ContractGrader",
        workflow_config=f"{__name__}:NAMED_CONFIG",
    )
    assert backend.workflow_class.__name__ == "ContractWorkflow"
    assert backend.grader_class.__name__ == "ContractGrader"
    assert backend.workflow_config is NAMED_CONFIG
    with pytest.raises(TypeError, match=r"cannot import the workflow 'osmosis_nowhere:X': ModuleNotFoundError"):
        LocalBackend(workflow="osmosis_nowhere:X")
    with pytest.raises(TypeError, match=r"the grader must be a Grader subclass or an import path to one"):
        LocalBackend(Echo, grader="osmosis_core.testing.contract:ContractWorkflow")
    with pytest.raises(TypeError, match=r"the workflow_config must be a AgentWorkflowConfig"):
        LocalBackend(Echo, workflow_config="osmosis_core.testing.contract:ContractWorkflow")


def test_grader_that_sets_no_reward_fails():
    class Silent(Grader):
        async def grade(self, ctx):
            return None

    class Bad(Grader):
        async def grade(self, ctx):
            return "high"

    [_, r] = run_one(LocalBackend(Echo, grader=Silent))
    assert r.error.category is ErrorCategory.VALIDATION_ERROR
    assert "no reward" in r.error.message
    [_, r] = run_one(LocalBackend(Echo, grader=Bad))
    assert r.error.category is ErrorCategory.VALIDATION_ERROR
    assert "reward must be a number" in r.error.message


def test_bad_return_and_no_sample_are_validation_errors():
    class ReturnsInt(AgentWorkflow):
        async def run(self, ctx):
            return 3

    class ReturnsNothing(AgentWorkflow):
        async def run(self, ctx):
            return None

    [r] = run_one(LocalBackend(ReturnsInt))
    assert r.error.category is ErrorCategory.VALIDATION_ERROR
    assert "returned int" in r.error.message
    [r] = run_one(LocalBackend(ReturnsNothing))
    assert r.error.category is ErrorCategory.VALIDATION_ERROR
    assert "no sample source" in r.error.message


def test_secret_never_appears_in_an_error_message():
    class Leaky(AgentWorkflow):
        async def run(self, ctx):
            raise RuntimeError(f"auth failed with key {ctx.policy.api_key}")

    [r] = run_one(LocalBackend(Leaky))
    assert "sk-secret-value-123" not in r.error.message
    assert "***" in r.error.message


class Gauge:
    def __init__(self) -> None:
        self.now = 0
        self.peak = 0


def _gauged(gauge: Gauge) -> type[AgentWorkflow]:
    class Busy(AgentWorkflow):
        async def run(self, ctx):
            gauge.now += 1
            gauge.peak = max(gauge.peak, gauge.now)
            await anyio.sleep(0.01)
            gauge.now -= 1
            return []

    return Busy


async def _many(backend: LocalBackend, n: int) -> list[ExecutionResult]:
    results: list[ExecutionResult] = []

    async def keep(result: ExecutionResult) -> None:
        results.append(result)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(backend.execute, request(i), keep, keep)
    return results


@pytest.mark.parametrize(
    ("config", "override", "expected"),
    [
        (None, None, 4),
        (AgentWorkflowConfig(), None, 4),  # a config without concurrency keeps the default, never unlimited
        (AgentWorkflowConfig(concurrency=ConcurrencyConfig(max_concurrent=7)), None, 7),
        (AgentWorkflowConfig(concurrency=ConcurrencyConfig(max_concurrent=7)), 2, 2),
    ],
)
def test_concurrency_limit(config, override, expected):
    gauge = Gauge()
    backend = LocalBackend(_gauged(gauge), config, max_concurrent=override)
    assert backend.max_concurrency == expected
    results = anyio.run(_many, backend, 30)
    assert len(results) == 30
    assert all(r.ok for r in results)
    assert gauge.peak == expected


def test_grader_concurrency_is_its_own_limit():
    gauge = Gauge()

    class CountingGrader(Grader):
        async def grade(self, ctx):
            gauge.now += 1
            gauge.peak = max(gauge.peak, gauge.now)
            await anyio.sleep(0.01)
            gauge.now -= 1
            return 1.0

    backend = LocalBackend(
        Echo,
        AgentWorkflowConfig(concurrency=ConcurrencyConfig(max_concurrent=10)),
        CountingGrader,
        GraderConfig(concurrency=ConcurrencyConfig(max_concurrent=2)),
    )
    anyio.run(_many, backend, 20)
    assert gauge.peak == 2


def test_fresh_instances_and_config_copies_per_rollout():
    seen: list[int] = []

    @attrs.define(kw_only=True)
    class Cfg(AgentWorkflowConfig):
        items: list[str] = attrs.field(factory=list)

    class Stateful(AgentWorkflow[Cfg]):
        config_type = Cfg

        async def run(self, ctx):
            assert not hasattr(self, "used"), "instance reused across rollouts"
            self.used = True
            ctx.config.items.append("x")  # must not leak into the next rollout
            seen.append(len(ctx.config.items))
            return []

    config = Cfg()
    anyio.run(_many, LocalBackend(Stateful, config), 10)
    assert seen == [1] * 10
    assert config.items == []


def test_cancellation_leaves_no_task_and_reports_cancelled():
    started = anyio.Event()
    finished: list[bool] = []

    class Hangs(AgentWorkflow):
        async def run(self, ctx):
            started.set()
            try:
                await anyio.sleep(30)
            finally:
                finished.append(True)

    async def main() -> tuple[list[ExecutionResult], dict[str, Any], int]:
        backend = LocalBackend(Hangs, max_concurrent=1)
        results: list[ExecutionResult] = []

        async def keep(result: ExecutionResult) -> None:
            results.append(result)

        async with anyio.create_task_group() as tg:
            tg.start_soon(backend.execute, request(1), keep)
            tg.start_soon(backend.execute, request(2), keep)  # queued behind the first
            await started.wait()
            health = backend.health()
            tg.cancel_scope.cancel()
        tasks = len(asyncio.all_tasks()) - 1
        return results, health, tasks

    results, health, tasks = anyio.run(main)
    assert health["running"] == 1
    assert health["queued"] == 1
    assert finished == [True]
    assert tasks == 0
    assert sorted(r.status.value for r in results) == ["cancelled", "cancelled"]
    assert all(r.error.category is ErrorCategory.CANCELLED for r in results)


def test_health_after_run():
    backend = LocalBackend(Echo)
    anyio.run(_many, backend, 5)
    assert backend.health() == {
        "status": "ok",
        "max_concurrency": 4,
        "queued": 0,
        "running": 0,
        "grading": 0,
        "finished": 5,
    }


def test_constructor_rejects_non_classes():
    with pytest.raises(TypeError, match="AgentWorkflow subclass"):
        LocalBackend(Echo())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Grader subclass"):
        LocalBackend(Echo, grader=object)  # type: ignore[arg-type]


# -- against a real endpoint -------------------------------------------------------------------


def test_endpoint_failures_are_policy_errors_without_the_key(policy_server):
    from rollouts_multiply_plain import MultiplyGrader, MultiplyWorkflow

    policy = PolicyEndpoint(policy_server.url, "m", api_key="sk-live-abcdef")
    policy_server.inject(Fault("status", status=503))
    outcome = run_rollout_sync(MultiplyWorkflow, MultiplyGrader, policy=policy, user_prompt="6 * 7", label="42")
    assert outcome.error.category is ErrorCategory.POLICY_ERROR
    assert "503" in outcome.error.message
    assert policy_server.url in outcome.error.message
    assert "sk-live-abcdef" not in outcome.error.message

    policy_server.inject(Fault("drop"))
    outcome = run_rollout_sync(MultiplyWorkflow, MultiplyGrader, policy=policy, user_prompt="6 * 7", label="42")
    assert outcome.error.category is ErrorCategory.POLICY_ERROR

    unreachable = PolicyEndpoint("http://127.0.0.1:9/v1", "m", api_key="sk-live-abcdef")
    outcome = run_rollout_sync(MultiplyWorkflow, MultiplyGrader, policy=unreachable, user_prompt="6 * 7", label="42")
    assert outcome.error.category is ErrorCategory.POLICY_ERROR
    assert "127.0.0.1:9" in outcome.error.message


def test_example_rollout_end_to_end_with_request_log(policy_server):
    from rollouts_multiply_plain import MultiplyGrader, MultiplyWorkflow

    outcome = run_rollout_sync(
        MultiplyWorkflow,
        MultiplyGrader,
        policy=policy_server,
        user_prompt="val1 = 12\nval2 = 34",
        label="408",
        rollout_id="roll-1",
    )
    assert outcome.reward == 1.0, outcome.error
    roles = [m["role"] for m in outcome.sample.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert outcome.sample.messages[2]["content"] == "408"
    log = policy_server.requests_for("roll-1")
    assert len(log) == 2
    assert all(r.authorized is False for r in log)
    assert log[0].body["tools"][0]["function"]["name"] == "multiply"


def test_a_failed_workflow_keeps_the_partial_history_of_its_sample_source():
    class FailsLate(AgentWorkflow):
        async def run(self, ctx):
            history = [*ctx.prompt, {"role": "assistant", "content": "step 1"}]

            async def source() -> RolloutSample:
                return RolloutSample(messages=list(history))

            get_rollout_context().set_sample_source(source)
            raise RuntimeError("turn limit reached")

    [r] = run_one(LocalBackend(FailsLate, grader=Exact))
    assert r.status is ExecutionStatus.FAILURE
    assert r.error.category is ErrorCategory.AGENT_ERROR
    assert [m["content"] for m in r.sample.messages] == ["q0", "step 1"]
    assert r.reward is None


def test_samples_of_one_row_do_not_share_edits_to_prompt_or_metadata():
    seen = []

    class Editing(AgentWorkflow):
        async def run(self, ctx):
            seen.append((ctx.prompt[0]["content"], ctx.metadata.get("touched")))
            ctx.prompt[0]["content"] = "edited"
            ctx.metadata["touched"] = True
            return []

    backend = LocalBackend(Editing)
    shared = request(0, metadata={"level": 1})
    for _ in range(3):
        run_one(backend, shared)
    assert seen == [("q0", None)] * 3
    assert shared.prompt[0]["content"] == "q0"
    assert shared.metadata == {"level": 1}
