"""The rollout lifecycle, written once: what every backend keeps, wherever it runs a rollout.

A backend decides *where* a rollout runs (this event loop, a worker process, a Harbor trial, a
Ray actor); what happens around it is the same everywhere and lives here:

* :class:`Rollout` reports one rollout through the seam's callbacks: each callback at most once,
  the workflow's before the grader's; it knows the stage a failure or a cancellation belongs to,
  delivers the ``cancelled`` report exactly once (shielded from the cancellation under way), and
  turns an exception escaping a backend's own machinery into an ``infra_error`` result.
* :func:`run_workflow` and :func:`run_grader` run one stage as the ``local`` backend runs it:
  a fresh instance with a config copy, the stage's timeout, the error category of what it raised,
  a failed workflow's partial sample, the grader's label and reward checks.

A whole backend built on them is the example in :mod:`osmosis_core.backend` (the README's, and
``osmosis_core.testing.example_backend``, which the contract suite runs).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import anyio

from osmosis_core.context import RolloutContext
from osmosis_core.errors import BackendUnavailable, error_info
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

__all__ = ["Rollout", "cancelled_result", "run_grader", "run_workflow"]

ResultCallback = Callable[[ExecutionResult], Awaitable[None]]

_WF = ExecutionStage.WORKFLOW
_GR = ExecutionStage.GRADER
_SUCCESS = ExecutionStatus.SUCCESS
_FAILURE = ExecutionStatus.FAILURE


def cancelled_result(
    rollout_id: str, stage: ExecutionStage, *, timings: dict[str, float] | None = None, detail: str = ""
) -> ExecutionResult:
    """The ``cancelled`` result of a rollout cancelled during ``stage`` (``detail`` ends its message)."""
    return ExecutionResult(
        rollout_id,
        stage,
        ExecutionStatus.CANCELLED,
        error=ErrorInfo(ErrorCategory.CANCELLED, f"rollout cancelled during the {stage} stage{detail}"),
        timings=dict(timings or {}),
    )


class Rollout:
    """One rollout's reports through the seam's callbacks; an async context manager around its run.

    :param grades: whether a successful workflow is followed by a grader stage (when False, the
        workflow's result is the last one, and a cancellation after it is not reported).

    :meth:`report` delivers a stage's result to its callback: a workflow result once, then a
    grader result once; a result for a stage already reported, or after the last one, is dropped,
    and a grader result before the workflow's is an error (``RuntimeError``).
    Leaving the ``async with`` block:

    * cancelled (the run stops, a server cancels): the current stage is reported ``cancelled``
      through its callback, shielded, unless the rollout's last result is already out; the
      cancellation is passed on;
    * by an exception of the backend's machinery: the current stage is reported as an
      ``infra_error`` with the exception's message (secrets redacted) and the exception is not
      passed on; :class:`~osmosis_core.BackendUnavailable` (the rollout never started) and an
      exception raised by a callback are passed on.
    """

    __slots__ = (
        "_callback_raised",
        "_on_grader",
        "_on_workflow",
        "detail",
        "ended",
        "grades",
        "request",
        "stage",
        "timings",
    )

    def __init__(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback,
        on_grader_complete: ResultCallback | None = None,
        *,
        grades: bool = True,
    ) -> None:
        self.request = request
        self._on_workflow = on_workflow_complete
        self._on_grader = on_grader_complete
        self.grades = grades
        self.stage = _WF
        """The stage a failure or a cancellation now belongs to (the grader's once the workflow is reported)."""
        self.ended = False
        """The rollout's last result is reported: nothing more will be."""
        self.timings: dict[str, float] = {}
        """Timings a cancellation report carries (a backend may fill it as stages end)."""
        self.detail = ""
        """Appended to a cancellation's message, e.g. ``" (trial kept: /runs/x/trials/y)"``."""
        self._callback_raised = False

    async def report(self, result: ExecutionResult) -> None:
        """Deliver ``result`` to its stage's callback (once per stage, the workflow's first)."""
        if result.stage is _WF:
            if self.stage is not _WF:
                return
            self.stage = _GR
            self.ended = result.status is not _SUCCESS or not self.grades
            callback: ResultCallback | None = self._on_workflow
        else:
            if self.ended:
                return
            if self.stage is _WF:
                raise RuntimeError(f"the backend reported the grader stage of {result.rollout_id} before its workflow")
            self.ended = True
            callback = self._on_grader
        if callback is not None:
            try:
                await callback(result)
            except BaseException:
                self._callback_raised = True
                raise

    async def fail(self, error: BaseException | ErrorInfo, *, sample: RolloutSample | None = None) -> None:
        """Report the current stage failed: an exception as ``infra_error`` (its message redacted), or ``error``."""
        if self.ended:
            return
        if isinstance(error, BaseException):
            error = error_info(error, secrets=self.request.policy.secrets(), category=ErrorCategory.INFRA_ERROR)
        await self.report(
            ExecutionResult(
                self.request.rollout_id, self.stage, _FAILURE, sample=sample, error=error, timings=self.timings
            )
        )

    async def cancelled(self) -> None:
        """Report the current stage ``cancelled``, once, shielded from the cancellation under way."""
        if self.ended:
            return
        result = cancelled_result(self.request.rollout_id, self.stage, timings=self.timings, detail=self.detail)
        with anyio.CancelScope(shield=True):
            await self.report(result)

    async def __aenter__(self) -> Rollout:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None:
            return False
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            await self.cancelled()
            return False
        if self._callback_raised or isinstance(exc, BackendUnavailable) or not isinstance(exc, Exception):
            return False
        await self.fail(exc)
        return True


# -- the stages, as the local backend runs them -------------------------------------------------------


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


def _context(request: ExecutionRequest) -> RolloutContext:
    # a rollout's own copy of the row's metadata: the n samples of a row must not see each other's edits
    return RolloutContext(request.rollout_id, request.policy, dict(request.metadata))


async def run_workflow(
    workflow_class: type[AgentWorkflow[Any]],
    workflow_config: AgentWorkflowConfig,
    request: ExecutionRequest,
    rollout: RolloutContext | None = None,
    timings: dict[str, float] | None = None,
) -> ExecutionResult:
    """The workflow stage of ``request``: its result, success or failure (never raised).

    A new ``workflow_class`` instance gets a copy of ``workflow_config`` and a copy of the prompt,
    and runs inside ``rollout`` (default: a new :class:`~osmosis_core.RolloutContext`) within the
    request's ``agent_timeout_sec``. What it raises becomes a failure with that exception's
    category (``timeout`` past the limit) and the partial sample its sample source still holds.
    A cancellation of the rollout is passed on. ``timings`` gets ``workflow`` (seconds).
    """
    started = time.perf_counter()
    rollout, timings = rollout or _context(request), timings if timings is not None else {}
    timeout = _positive(request.agent_timeout_sec)
    try:
        workflow = workflow_class(copy_config(workflow_config))
        prompt = [dict(message) for message in request.prompt]  # the workflow may edit its messages
        ctx = AgentWorkflowContext(prompt, workflow.config, rollout.metadata, rollout)
        with rollout:
            output = await (workflow.run(ctx) if timeout is None else _within(timeout, workflow.run, ctx))
            sample = _returned_sample(output)
            if sample is None:  # only a sample source is awaited (a returned history needs no coroutine)
                sample = await _source_sample(rollout)
    except BaseException as exc:
        if not _own_failure(exc):
            raise  # the run cancels this rollout (or the process is going down)
        timings["workflow"] = time.perf_counter() - started
        return _failure(request, _WF, exc, timings, timeout, "workflow", await _partial_sample(rollout))
    timings["workflow"] = time.perf_counter() - started
    return ExecutionResult(request.rollout_id, _WF, _SUCCESS, sample=sample, timings=timings)


async def run_grader(
    grader_class: type[Grader[Any]],
    grader_config: GraderConfig | None,
    request: ExecutionRequest,
    sample: RolloutSample,
    rollout: RolloutContext | None = None,
    timings: dict[str, float] | None = None,
) -> ExecutionResult:
    """The grader stage of ``request`` for the workflow's ``sample``: its result (never raised).

    A row without a label is a ``validation_error`` (whether to grade it is the backend's call); a
    grader that returns no reward and sets none is one too. The reward lands on ``sample``.
    ``timings`` gets ``grader`` (seconds).
    """
    started = time.perf_counter()
    rollout, timings = rollout or _context(request), timings if timings is not None else {}
    timeout = _positive(request.grader_timeout_sec)
    try:
        if request.label is None:
            raise ValueError(
                "the row has no label (ground_truth) but a grader is configured; "
                "add ground_truth to the row or remove the grader"
            )
        grader = grader_class(copy_config(grader_config if grader_config is not None else grader_class.config_type()))
        ctx = GraderContext(sample, request.label, request.prompt, rollout.metadata, grader.config)
        with rollout:
            reward = await (grader.grade(ctx) if timeout is None else _within(timeout, grader.grade, ctx))
        if reward is not None:
            sample.reward = reward
        if sample.reward is None:
            raise ValueError(f"{grader_class.__name__}.grade returned no reward and set none")
    except BaseException as exc:
        if not _own_failure(exc):
            raise
        timings["grader"] = time.perf_counter() - started
        return _failure(request, _GR, exc, timings, timeout, "grader", sample)
    timings["grader"] = time.perf_counter() - started
    return ExecutionResult(request.rollout_id, _GR, _SUCCESS, sample=sample, timings=timings)


def _doing(timeout: BaseException) -> str:
    """`` (what it was doing)`` when the cancellation the timeout caused carries notes (``add_note``):
    a grader waiting for a worker can say so, apart from one computing."""
    cancelled = timeout.__cause__ or timeout.__context__
    notes = getattr(cancelled, "__notes__", None) if isinstance(cancelled, asyncio.CancelledError) else None
    return f" ({'; '.join(str(n) for n in notes)})" if notes else ""


def _failure(
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
    return ExecutionResult(request.rollout_id, stage, _FAILURE, sample=sample, error=info, timings=timings)


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


def _returned_sample(output: object) -> RolloutSample | None:
    """The sample a workflow returned (its history, or a RolloutSample); None when it returned None
    (its sample source has the sample)."""
    if isinstance(output, RolloutSample):
        return output
    if isinstance(output, list):
        return RolloutSample(messages=output)
    if output is None:
        return None
    raise TypeError(
        f"AgentWorkflow.run returned {type(output).__name__}; return a list of messages, "
        "a RolloutSample, or None after registering a sample source"
    )


async def _source_sample(rollout: RolloutContext) -> RolloutSample:
    sample = await rollout.get_sample()
    if sample is None:
        raise ValueError(
            "the workflow returned None and registered no sample source; return the message "
            "history (a list), a RolloutSample, or use an agent integration that registers one"
        )
    if not isinstance(sample, RolloutSample):
        raise TypeError(f"the sample source returned {type(sample).__name__}, not a RolloutSample")
    return sample
