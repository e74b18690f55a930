"""The backend contract: what every :class:`~osmosis_core.plugin.ExecutionBackend` must do, as a test suite.

A backend author runs it against their backend in a few lines: subclass :class:`BackendContract`
in a test module and name the backend; the suite builds it the way ``osmosis run`` does, through
the factory of its registered :class:`~osmosis_core.plugin.BackendSpec`, from a
:class:`~osmosis_core.plugin.BackendSetup` (the example backend of the README,
:mod:`osmosis_core.testing.example_backend`)::

    from osmosis_core.testing import BackendContract
    from osmosis_core.testing import example_backend

    class TestInlineBackend(BackendContract):
        backend = "inline"
        plugin = example_backend  # registered for the test; an installed plugin needs no line here

pytest then runs every ``test_*`` method below on it, with real HTTP to a scripted policy server.
A backend that needs more than that says so with class attributes: ``backend_table`` (its
``[backend.<name>]`` settings), ``workers``, ``fixtures`` (pytest fixtures each check needs, such as
a cluster), and capability flags (``keeps_partial_sample``). Overriding :meth:`make_backend` still
works, for a backend built another way.
The workflow and grader it hands over (:class:`ContractWorkflow`, :class:`ContractGrader`) live in
this module, so a backend that imports them by name in another process, a sandbox or a cluster
node can run them. Each rollout's behaviour is chosen by its row's metadata ``do``:

* ``echo``: ask the policy once, answer with the reply (the default);
* ``sleep:S``: sleep S seconds, recording when it ran (limits and timeouts are checked with it);
* ``raise:NAME``: raise ``ValueError``, ``TypeError``, ``RuntimeError``, ``TimeoutError`` or
  ``PolicyError`` (as an HTTP client's failure would be);
* ``partial``: register a sample source holding the history so far, then fail.

The grader gives 1.0 when the last message equals the label, and raises what the metadata's
``grade`` names (``raise:NAME``) or sleeps (``sleep:S``).

What it checks: both callbacks called once each, in order; every error category mapped as the
local backend maps it; the partial sample of a failed workflow kept; a cancellation reported once
per rollout (and the cancellation passed on); ``max_concurrency`` honoured; an unlabelled row (or
``grade=False``) not graded; ``health()`` JSON-ready with a status; ``aclose()`` idempotent.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any, ClassVar

import anyio
import attrs

from osmosis_core.backend import BackendSetup, ExecutionBackend, RunLimits
from osmosis_core.errors import PolicyError
from osmosis_core.records import (
    ErrorCategory,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    PolicyEndpoint,
    RolloutSample,
)
from osmosis_core.workflow import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderConfig,
    GraderContext,
)

try:
    import pytest
except ImportError:  # a node or a sandbox that only runs the contract's workflow
    pytest = None  # type: ignore[assignment]

__all__ = ["BackendContract", "ContractGrader", "ContractWorkflow", "EchoWorkflow"]

_ERRORS: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "RuntimeError": RuntimeError,
    "TimeoutError": TimeoutError,
    "PolicyError": PolicyError,
}


def _act(spec: str) -> tuple[str, str]:
    kind, _, arg = spec.partition(":")
    return kind, arg


class ContractWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    """Does what the row's metadata ``do`` says (see the module docstring)."""

    async def run(self, ctx: AgentWorkflowContext[Any]) -> RolloutSample:
        from osmosis_core.policy import chat_completion

        kind, arg = _act(str(ctx.metadata.get("do", "echo")))
        started = time.time()
        if kind == "sleep":
            await anyio.sleep(float(arg))
            answer = {"role": "assistant", "content": "slept"}
        elif kind == "raise":
            raise _ERRORS[arg](f"the contract workflow raised {arg}")
        elif kind == "partial":
            history = [*ctx.prompt, {"role": "assistant", "content": "half an answer"}]

            async def so_far() -> RolloutSample:
                return RolloutSample(messages=list(history))

            ctx.rollout.set_sample_source(so_far)
            raise RuntimeError("the contract workflow failed after half an answer")
        else:
            answer = await chat_completion(ctx.prompt)
        return RolloutSample(messages=[*ctx.prompt, answer], metrics={"started": started, "ended": time.time()})


EchoWorkflow = ContractWorkflow
"""The contract workflow under the name its doctests use."""


class ContractGrader(Grader[GraderConfig]):
    """1.0 when the last message's text equals the label; fails as the metadata's ``grade`` says."""

    async def grade(self, ctx: GraderContext[Any]) -> float:
        kind, arg = _act(str(ctx.metadata.get("grade", "compare")))
        if kind == "raise":
            raise _ERRORS[arg](f"the contract grader raised {arg}")
        if kind == "sleep":
            await anyio.sleep(float(arg))
        return 1.0 if ctx.sample.last_text().strip() == str(ctx.label).strip() else 0.0


class BackendContract:
    """The contract, as pytest test methods; subclass it (as ``Test...``) and name the :attr:`backend`."""

    backend: str = "local"
    """The registered name of the backend under test (``--backend NAME``)."""
    backend_table: ClassVar[dict[str, Any]] = {}
    """Its ``[backend.<name>]`` table, read into its spec's config type as a run config's is."""
    plugin: object | None = None
    """A plugin object or module to register for the checks (one that is not installed)."""
    workers: int = 1
    """``[run] workers`` handed to the factory."""
    fixtures: tuple[str, ...] = ()
    """pytest fixtures every check needs (a cluster the backend attaches to, a service)."""
    keeps_partial_sample: bool = True
    """Capability: a failed workflow's partial sample comes back (the check is skipped when False)."""
    stage_timeout_sec: float = 1.0
    """The agent and grader timeouts of the timeout checks (raise it for a backend with a slow start)."""
    rollout_timeout_sec: float = 120.0
    """How long one check may take before it fails."""

    if pytest is not None:

        @pytest.fixture(autouse=True)
        def _contract_fixtures(self, request: Any) -> None:
            for name in self.fixtures:
                request.getfixturevalue(name)

    def make_backend(
        self,
        workflow: type[AgentWorkflow[Any]],
        grader: type[Grader[Any]] | None = None,
        *,
        max_concurrent: int = 4,
        require_labels: bool = False,
    ) -> ExecutionBackend:
        """Build the backend under test for ``workflow`` and ``grader``, at most ``max_concurrent`` at once.

        As ``osmosis run`` builds it: its spec's factory, called with a :class:`BackendSetup` whose
        limits are ``max_concurrent`` (and so is the workflow config's own ``concurrency``, as an
        author who sets both would have it: a backend that reads either keeps the limit).
        """
        from osmosis_core._engine.registry import PluginRegistry, get_registry
        from osmosis_core._engine.runner import _make_backend, backend_config_of
        from osmosis_core.workflow import ConcurrencyConfig

        registry = get_registry() if self.plugin is None else PluginRegistry()
        if self.plugin is not None:
            registry.register(self.plugin, f"contract-{self.backend}")
        spec = registry.backend(self.backend)
        workflow_config = attrs.evolve(
            workflow.config_type(), concurrency=ConcurrencyConfig(max_concurrent=max_concurrent)
        )
        setup = BackendSetup(
            workflow_class=workflow,
            workflow_config=workflow_config,
            grader_class=grader,
            grader_config=grader.config_type() if grader is not None else None,
            backend_config=backend_config_of(spec, dict(self.backend_table), f"[backend.{self.backend}]"),
            workers=self.workers,
            require_labels=require_labels,
            limits=RunLimits(concurrency=max_concurrent),
        )
        return _make_backend(spec, setup, registry)

    # -- helpers ---------------------------------------------------------------------------------------

    def _request(self, url: str, rollout_id: str, *, label: Any = "6 * 7", **metadata: Any) -> ExecutionRequest:
        timeouts = {"agent_timeout_sec": metadata.pop("agent_timeout_sec", 60), "grader_timeout_sec": 60}
        grade = metadata.pop("grade_stage", True)
        return ExecutionRequest(
            rollout_id,
            [{"role": "user", "content": "6 * 7"}],
            PolicyEndpoint(url, "contract"),
            label=label,
            metadata=metadata,
            grade=grade,
            **timeouts,
        )

    def _run(
        self,
        backend_args: dict[str, Any],
        requests: list[ExecutionRequest],
        *,
        cancel_after: float | None = None,
        finals: dict[str, ExecutionResult] | None = None,
    ) -> dict[str, list[ExecutionResult]]:
        """Execute ``requests`` concurrently on a fresh backend; each rollout's results in callback order.

        With ``finals``, each runs through :func:`~osmosis_core.lifecycle.run_one`, as a caller
        does, and ``finals`` gets its final result."""
        from osmosis_core.http.client import aclose_http
        from osmosis_core.lifecycle import RolloutReports, run_one
        from osmosis_core.testing.scripts import echo

        seen: dict[str, list[ExecutionResult]] = defaultdict(list)
        backend = self.make_backend(**backend_args)
        raised: list[str] = []

        async def one(request: ExecutionRequest) -> None:
            async def on_workflow(result: ExecutionResult) -> None:
                assert result.stage is ExecutionStage.WORKFLOW, f"{result} reached on_workflow_complete"
                seen[request.rollout_id].append(result)

            async def on_grader(result: ExecutionResult) -> None:
                assert result.stage is ExecutionStage.GRADER, f"{result} reached on_grader_complete"
                seen[request.rollout_id].append(result)

            try:
                if finals is None:
                    await backend.execute(request, on_workflow, on_grader)
                    return
                reports = RolloutReports(request)
                final = await run_one(backend, request, reports, on_workflow_complete=on_workflow)
                if reports.grader is not None:
                    await on_grader(reports.grader)
                finals[request.rollout_id] = final
            except anyio.get_cancelled_exc_class():
                raised.append(request.rollout_id)
                raise

        async def main() -> None:
            from osmosis_core.testing.policy_server import ScriptedPolicyServer

            async with ScriptedPolicyServer(echo) as server:
                url = server.url
                ready = [_with_url(r, url) for r in requests]
                try:
                    with anyio.fail_after(self.rollout_timeout_sec):
                        async with anyio.create_task_group() as tg:
                            for request in ready:
                                tg.start_soon(one, request)
                            if cancel_after is not None:
                                await anyio.sleep(cancel_after)
                                tg.cancel_scope.cancel()
                finally:
                    with anyio.CancelScope(shield=True):
                        await backend.aclose()
                        await backend.aclose()  # idempotent
                        await aclose_http()

        anyio.run(main)
        if cancel_after is not None:
            seen["__raised__"] = [
                ExecutionResult(rid, ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS) for rid in raised
            ]
        return seen

    # -- the contract ----------------------------------------------------------------------------------

    def test_a_rollout_reports_its_workflow_then_its_grader_once_each(self) -> None:
        seen = self._run(
            {"workflow": ContractWorkflow, "grader": ContractGrader},
            [self._request("", "ok", label="6 * 7"), self._request("", "wrong", label="nope")],
        )
        for rollout_id, reward in (("ok", 1.0), ("wrong", 0.0)):
            stages = [(r.stage, r.status) for r in seen[rollout_id]]
            assert stages == [
                (ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS),
                (ExecutionStage.GRADER, ExecutionStatus.SUCCESS),
            ], seen[rollout_id]
            first, last = seen[rollout_id][0], seen[rollout_id][-1]
            assert last.reward == reward
            assert last.sample is not None
            assert first.sample is not None
            assert first.sample.messages[-1]["content"]

    def test_every_failure_is_a_result_with_the_local_category(self) -> None:
        cases: dict[str, tuple[dict[str, Any], ExecutionStage, ErrorCategory]] = {
            "value": ({"do": "raise:ValueError"}, ExecutionStage.WORKFLOW, ErrorCategory.VALIDATION_ERROR),
            "type": ({"do": "raise:TypeError"}, ExecutionStage.WORKFLOW, ErrorCategory.VALIDATION_ERROR),
            "runtime": ({"do": "raise:RuntimeError"}, ExecutionStage.WORKFLOW, ErrorCategory.AGENT_ERROR),
            "policy": ({"do": "raise:PolicyError"}, ExecutionStage.WORKFLOW, ErrorCategory.POLICY_ERROR),
            "slow": (
                {"do": "sleep:30", "agent_timeout_sec": self.stage_timeout_sec},
                ExecutionStage.WORKFLOW,
                ErrorCategory.TIMEOUT,
            ),
            "grader": ({"grade": "raise:RuntimeError"}, ExecutionStage.GRADER, ErrorCategory.AGENT_ERROR),
            "grader-value": ({"grade": "raise:ValueError"}, ExecutionStage.GRADER, ErrorCategory.VALIDATION_ERROR),
        }
        seen = self._run(
            {"workflow": ContractWorkflow, "grader": ContractGrader},
            [self._request("", name, **metadata) for name, (metadata, _, _) in cases.items()],
        )
        for name, (_metadata, stage, category) in cases.items():
            final = seen[name][-1]
            assert (final.stage, final.status) == (stage, ExecutionStatus.FAILURE), (name, seen[name])
            assert final.error is not None, (name, final.error)
            assert final.error.category is category, (name, final.error)
            assert final.error.message, name
            assert len([r for r in seen[name] if r.stage is ExecutionStage.WORKFLOW]) == 1, (name, seen[name])

    def test_a_failed_workflow_keeps_its_partial_sample(self) -> None:
        if not self.keeps_partial_sample and pytest is not None:
            pytest.skip(f"the {self.backend!r} backend declares keeps_partial_sample = False")
        seen = self._run({"workflow": ContractWorkflow}, [self._request("", "partial", do="partial")])
        [failed] = seen["partial"]
        assert failed.error is not None
        assert failed.error.category is ErrorCategory.AGENT_ERROR
        assert failed.sample is not None
        assert failed.sample.messages[-1]["content"] == "half an answer"

    def test_a_cancelled_rollout_is_reported_once_and_the_cancellation_passed_on(self) -> None:
        requests = [self._request("", f"hang-{i}", do="sleep:60") for i in range(3)]
        seen = self._run({"workflow": ContractWorkflow, "grader": ContractGrader}, requests, cancel_after=1.0)
        for request in requests:
            results = seen[request.rollout_id]
            assert [r.status for r in results] == [ExecutionStatus.CANCELLED], results
            assert results[0].error is not None
            assert results[0].error.category is ErrorCategory.CANCELLED
        assert sorted(r.rollout_id for r in seen["__raised__"]) == sorted(r.rollout_id for r in requests)

    def test_run_one_gives_each_rollout_its_last_stage_and_passes_a_cancellation_on(self) -> None:
        finals: dict[str, ExecutionResult] = {}
        requests = [
            self._request("", "ok"),
            self._request("", "failed", do="raise:RuntimeError"),
            self._request("", "grader", grade="raise:RuntimeError"),
            self._request("", "ungraded", grade_stage=False),
        ]
        seen = self._run({"workflow": ContractWorkflow, "grader": ContractGrader}, requests, finals=finals)
        for request in requests:
            assert finals[request.rollout_id] is seen[request.rollout_id][-1], (finals, seen[request.rollout_id])
        assert finals["ok"].reward == 1.0
        assert (finals["grader"].stage, finals["grader"].status) == (ExecutionStage.GRADER, ExecutionStatus.FAILURE)
        hanging = [self._request("", "hang", do="sleep:60")]
        cancelled: dict[str, ExecutionResult] = {}
        seen = self._run({"workflow": ContractWorkflow}, hanging, cancel_after=1.0, finals=cancelled)
        assert cancelled == {}, cancelled  # passed on, not returned
        assert [r.status for r in seen["hang"]] == [ExecutionStatus.CANCELLED], seen["hang"]
        assert [r.rollout_id for r in seen["__raised__"]] == ["hang"]

    def test_max_concurrency_is_honoured(self) -> None:
        requests = [self._request("", f"slot-{i}", do="sleep:0.4") for i in range(6)]
        seen = self._run({"workflow": ContractWorkflow, "max_concurrent": 2}, requests)
        spans = []
        for request in requests:
            [result] = seen[request.rollout_id]
            assert result.ok, result
            assert result.sample is not None
            spans.append((result.sample.metrics["started"], result.sample.metrics["ended"]))
        overlap = max(sum(1 for s, e in spans if s <= at < e) for at, _ in spans)
        assert overlap <= 2, spans

    def test_a_row_without_a_label_or_asking_for_none_is_not_graded(self) -> None:
        seen = self._run(
            {"workflow": ContractWorkflow, "grader": ContractGrader},
            [self._request("", "unlabelled", label=None), self._request("", "ungraded", grade_stage=False)],
        )
        for rollout_id in ("unlabelled", "ungraded"):
            assert [(r.stage, r.status, r.reward) for r in seen[rollout_id]] == [
                (ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS, None)
            ], seen[rollout_id]
        strict = self._run(
            {"workflow": ContractWorkflow, "grader": ContractGrader, "require_labels": True},
            [self._request("", "strict", label=None)],
        )
        final = strict["strict"][-1]
        assert final.stage is ExecutionStage.GRADER
        assert final.error is not None
        assert final.error.category is ErrorCategory.VALIDATION_ERROR

    def test_health_is_json_with_a_status(self) -> None:
        backend = self.make_backend(workflow=ContractWorkflow)

        async def check() -> dict[str, Any]:
            try:
                return backend.health()
            finally:
                await backend.aclose()

        report = anyio.run(check)
        assert isinstance(report, dict), report
        assert report.get("status") in ("ok", "degraded", "failed"), report
        json.dumps(report)
        assert isinstance(backend.max_concurrency, int)
        assert backend.max_concurrency >= 0


def _with_url(request: ExecutionRequest, url: str) -> ExecutionRequest:
    import attrs

    return attrs.evolve(request, policy=attrs.evolve(request.policy, base_url=url))
