"""``LocalBackend``: runs rollouts in-process on the running event loop (the ``local`` backend).

It keeps the hot path lean: no filesystem work, no threads, one semaphore per stage, one timeout
scope per stage, and a fresh workflow and grader instance (with a config copy) per rollout.

>>> import anyio
import attrs
>>> from osmosis_core import AgentWorkflow, ExecutionRequest, PolicyEndpoint
>>> class Echo(AgentWorkflow):
...     async def run(self, ctx):
...         return [*ctx.prompt, {"role": "assistant", "content": "hi"}]
>>> results = []
>>> async def collect(result):
...     results.append(result)
>>> request = ExecutionRequest("r1", [{"role": "user", "content": "hello"}],
...                            PolicyEndpoint("http://127.0.0.1:1/v1", "m"))
>>> anyio.run(LocalBackend(Echo).execute, request, collect)
>>> results[0].status.value, len(results[0].sample.messages)
('success', 2)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import attrs

from osmosis_core.backend import BackendSetup, ExecutionBackend, ResultCallback, load_object, report_cancelled
from osmosis_core.context import RolloutContext
from osmosis_core.errors import RolloutLoadError, error_info
from osmosis_core.records import (
    ErrorCategory,
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    RolloutSample,
)
from osmosis_core.workflow import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderConfig,
    GraderContext,
    copy_config,
)

__all__ = ["LocalBackend", "LocalBackendConfig"]


@attrs.define
class LocalBackendConfig:
    """Deprecated since 0.2.0 (the ``local`` backend takes no ``[backend.local]`` table): set the
    limit with ``[run] concurrency``, ``--concurrency`` or ``LocalBackend(max_concurrent=...)``."""

    max_concurrent: int | None = None

    def __attrs_post_init__(self) -> None:
        from osmosis_core.deprecation import warn_deprecated

        replacement = "[run] concurrency or LocalBackend(max_concurrent=...)"
        warn_deprecated("LocalBackendConfig", replacement, "0.2.0", stacklevel=4)


_WF = ExecutionStage.WORKFLOW
_GR = ExecutionStage.GRADER


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


async def _within[**P, R](timeout: float | None, fn: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs) -> R:
    """Await ``fn`` within ``timeout`` seconds (TimeoutError past it).

    On asyncio it uses asyncio's own timeout, which costs a fraction of a cancel scope.
    """
    if timeout is None:
        return await fn(*args, **kwargs)
    if asyncio._get_running_loop() is not None:  # on asyncio (not trio)
        async with asyncio.timeout(timeout):
            return await fn(*args, **kwargs)
    with anyio.fail_after(timeout):
        return await fn(*args, **kwargs)


class LocalBackend(ExecutionBackend):
    """Runs each rollout in-process with separate workflow and grader limits and timeouts.

    :param workflow: the :class:`AgentWorkflow` subclass; a new instance per rollout.
    :param workflow_config: its config (copied per rollout); default ``workflow.config_type()``.
    :param grader: the :class:`Grader` subclass, or None for no grading.
    :param grader_config: its config (copied per rollout).
    :param max_concurrent: overrides ``workflow_config.concurrency.max_concurrent`` (default 4).
    :param require_labels: fail a rollout whose row has no label (``validation_error``) instead of
        running it ungraded (``[run] require_labels``).

    Each class may be given as an import path and each config as an object or an import path,
    as in osmosis-ai: ``LocalBackend(workflow="rollouts.my_rollout.main:MyWorkflow",
    grader="rollouts.my_rollout.main:MyGrader")``.

    When grading runs: a grader is configured, the request asks for it (``grade``, true by
    default) and the row has a label. A row without a label is run and reported ungraded (the
    workflow's result is the last one: success, no reward), as the reference SDK does, unless
    ``require_labels``.
    """

    def __init__(
        self,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader[Any]] | str | None = None,
        grader_config: GraderConfig | str | None = None,
        *,
        max_concurrent: int | None = None,
        require_labels: bool = False,
    ) -> None:
        from osmosis_core.loader import resolve_config_object, resolve_object

        try:
            workflow_class = resolve_object(workflow, AgentWorkflow, what="workflow")
            grader_class = None if grader is None else resolve_object(grader, Grader, what="grader")
            if workflow_config is not None:
                workflow_config = resolve_config_object(workflow_config, AgentWorkflowConfig, what="workflow_config")
            if grader_config is not None:
                grader_config = resolve_config_object(grader_config, GraderConfig, what="grader_config")
        except RolloutLoadError as exc:
            raise TypeError(str(exc)) from None
        self.workflow_class: type[AgentWorkflow[Any]] = workflow_class
        self.workflow_config: AgentWorkflowConfig = (
            workflow_config if isinstance(workflow_config, AgentWorkflowConfig) else workflow_class.config_type()
        )
        self.grader_class: type[Grader[Any]] | None = grader_class
        self.grader_config: GraderConfig | None = (
            grader_config
            if isinstance(grader_config, GraderConfig)
            else (grader_class.config_type() if grader_class else None)
        )
        self.require_labels = require_labels
        self._limit = max_concurrent or self.workflow_config.concurrency.limit
        grader_limit = self._limit
        if self.grader_config is not None and self.grader_config.concurrency.max_concurrent is not None:
            grader_limit = self.grader_config.concurrency.max_concurrent
        self._workflow_slots = anyio.Semaphore(self._limit, fast_acquire=True)
        self._grader_slots = anyio.Semaphore(grader_limit, fast_acquire=True)
        self._queued = 0
        self._running = 0
        self._grading = 0
        self._done = 0

    @classmethod
    def from_setup(cls, setup: BackendSetup) -> ExecutionBackend:
        """Deprecated since 0.2.0: register ``osmosis_core.plugins.builtin:local_backend`` (or a
        factory of your own) instead. Kept for plugins written against 0.1's documented API
        (``BackendSpec(name, factory="my_plugin:MyLocalBackend.from_setup")``); it builds ``cls``,
        or a worker pool of ``cls``'s workflow and grader when ``setup.workers`` > 1, as before."""
        from osmosis_core.deprecation import warn_deprecated

        warn_deprecated(f"{cls.__name__}.from_setup", "osmosis_core.plugins.builtin:local_backend", "0.2.0")
        if setup.workers > 1:
            # the worker pool sits above this module (it hosts LocalBackends), so the deprecated
            # shim reaches the registered factory at run time rather than importing up a layer
            local_backend = load_object("osmosis_core.plugins.builtin:local_backend")
            backend: ExecutionBackend = local_backend(setup)
            return backend
        return cls(
            setup.workflow_class,
            setup.workflow_config,
            setup.grader_class,
            setup.grader_config,
            require_labels=setup.require_labels,
        )

    @property
    def max_concurrency(self) -> int:
        return self._limit

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "max_concurrency": self._limit,
            "queued": self._queued,
            "running": self._running,
            "grading": self._grading,
            "finished": self._done,
        }

    def grades(self, request: ExecutionRequest) -> bool:
        """Whether ``request`` gets a grader stage (see the class docstring)."""
        return self.grader_class is not None and request.grade and (request.label is not None or self.require_labels)

    async def aclose(self) -> None:
        """Close the running loop's HTTP clients (the rollouts' connections to their policies)."""
        from osmosis_core.http_session import aclose_http

        await aclose_http()

    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback,
        on_grader_complete: ResultCallback | None = None,
    ) -> None:
        submitted = time.perf_counter()
        timings: dict[str, float] = {}
        stage = _WF
        # a rollout's own copy of the row's metadata: the n samples of a row must not see each other's edits
        rollout = RolloutContext(request.rollout_id, request.policy, dict(request.metadata))
        self._queued += 1
        queued = True
        try:
            async with self._workflow_slots:
                self._queued -= 1
                queued = False
                started = time.perf_counter()
                timings["queued"] = started - submitted
                self._running += 1
                try:
                    result = await self._run_workflow(request, rollout, timings, started)
                finally:
                    self._running -= 1
            await on_workflow_complete(result)
            stage = _GR  # the workflow is reported: a cancellation from here on is the grader's
            if not result.ok or not self.grades(request):
                return
            assert result.sample is not None
            async with self._grader_slots:
                self._grading += 1
                try:
                    graded = await self._run_grader(request, rollout, result.sample, timings)
                finally:
                    self._grading -= 1
            if on_grader_complete is not None:
                await on_grader_complete(graded)
        except anyio.get_cancelled_exc_class():
            if queued:
                self._queued -= 1
            await report_cancelled(request.rollout_id, stage, on_workflow_complete, on_grader_complete, timings=timings)
            raise
        finally:
            self._done += 1

    async def _run_workflow(
        self, request: ExecutionRequest, rollout: RolloutContext, timings: dict[str, float], started: float
    ) -> ExecutionResult:
        timeout = _positive(request.agent_timeout_sec)
        try:
            workflow = self.workflow_class(copy_config(self.workflow_config))
            prompt = [dict(message) for message in request.prompt]  # the workflow may edit its messages
            ctx = AgentWorkflowContext(prompt, workflow.config, rollout.metadata, rollout)
            with rollout:
                output = await (workflow.run(ctx) if timeout is None else _within(timeout, workflow.run, ctx))
                sample = await _collect_sample(output, rollout)
        except BaseException as exc:
            if not _own_failure(exc):
                raise  # the run cancels this rollout (or the process is going down)
            timings["workflow"] = time.perf_counter() - started
            return self._failure(request, _WF, exc, timings, timeout, "workflow", await _partial_sample(rollout))
        timings["workflow"] = time.perf_counter() - started
        return ExecutionResult(request.rollout_id, _WF, ExecutionStatus.SUCCESS, sample=sample, timings=timings)

    async def _run_grader(
        self,
        request: ExecutionRequest,
        rollout: RolloutContext,
        sample: RolloutSample,
        timings: dict[str, float],
    ) -> ExecutionResult:
        assert self.grader_class is not None
        started = time.perf_counter()
        timeout = _positive(request.grader_timeout_sec)
        try:
            if request.label is None:
                raise ValueError(
                    "the row has no label (ground_truth) but a grader is configured; "
                    "add ground_truth to the row or remove the grader"
                )
            grader = self.grader_class(copy_config(self.grader_config))
            ctx = GraderContext(sample, request.label, request.prompt, rollout.metadata, grader.config)
            with rollout:
                reward = await (grader.grade(ctx) if timeout is None else _within(timeout, grader.grade, ctx))
            if reward is not None:
                sample.reward = reward
            if sample.reward is None:
                raise ValueError(f"{self.grader_class.__name__}.grade returned no reward and set none")
        except BaseException as exc:
            if not _own_failure(exc):
                raise
            timings["grader"] = time.perf_counter() - started
            return self._failure(request, _GR, exc, timings, timeout, "grader", sample)
        timings["grader"] = time.perf_counter() - started
        return ExecutionResult(request.rollout_id, _GR, ExecutionStatus.SUCCESS, sample=sample, timings=timings)

    def _failure(
        self,
        request: ExecutionRequest,
        stage: ExecutionStage,
        exc: BaseException,
        timings: dict[str, float],
        timeout: float | None,
        what: str,
        sample: RolloutSample | None = None,
    ) -> ExecutionResult:
        info = error_info(exc, secrets=request.policy.secrets())
        if isinstance(exc, asyncio.CancelledError):
            info = ErrorInfo(
                ErrorCategory.AGENT_ERROR, f"the {what} raised CancelledError while nobody cancelled the rollout"
            )
        if isinstance(exc, TimeoutError) and timeout is not None and timings.get(what, 0.0) >= timeout * 0.99:
            info = ErrorInfo(ErrorCategory.TIMEOUT, f"the {what} ran past its {timeout:g} s timeout{_doing(exc)}")
        return ExecutionResult(
            request.rollout_id, stage, ExecutionStatus.FAILURE, sample=sample, error=info, timings=timings
        )


def _doing(timeout: BaseException) -> str:
    """`` (what it was doing)`` when the cancellation the timeout caused carries notes (``add_note``):
    a grader waiting for a worker can say so, apart from one computing."""
    cancelled = timeout.__cause__ or timeout.__context__
    notes = getattr(cancelled, "__notes__", None) if isinstance(cancelled, asyncio.CancelledError) else None
    return f" ({'; '.join(str(n) for n in notes)})" if notes else ""


def _own_failure(exc: BaseException) -> bool:
    """True when ``exc`` is the stage's own failure, to report as a result, not to pass on.

    Any ``Exception``; and what a workflow or grader raises that would otherwise stop the whole
    run: ``sys.exit()`` (``SystemExit``), a ``KeyboardInterrupt`` it raised itself, and a
    ``CancelledError`` raised while nobody cancelled the rollout (the run's own cancellation is
    passed on and reported as ``cancelled``).
    """
    if isinstance(exc, Exception):
        return True
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return True
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task() if asyncio._get_running_loop() is not None else None
        return task is not None and task.cancelling() == 0
    return False


async def _partial_sample(rollout: RolloutContext) -> RolloutSample | None:
    """What a failed workflow's registered source still holds (the history up to the failure)."""
    if rollout.sample_source is None:
        return None
    try:
        sample = await rollout.get_sample()
    except Exception:
        return None
    return sample if isinstance(sample, RolloutSample) else None


async def _collect_sample(output: object, rollout: RolloutContext) -> RolloutSample:
    if isinstance(output, RolloutSample):
        return output
    if isinstance(output, list):
        return RolloutSample(messages=output)
    if output is None:
        sample = await rollout.get_sample()
        if sample is None:
            raise ValueError(
                "the workflow returned None and registered no sample source; return the message "
                "history (a list), a RolloutSample, or use an agent integration that registers one"
            )
        if not isinstance(sample, RolloutSample):
            raise TypeError(f"the sample source returned {type(sample).__name__}, not a RolloutSample")
        return sample
    raise TypeError(
        f"AgentWorkflow.run returned {type(output).__name__}; return a list of messages, "
        "a RolloutSample, or None after registering a sample source"
    )
