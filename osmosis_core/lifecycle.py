"""The rollout lifecycle, written once on each side of the seam.

A backend decides *where* a rollout runs (this event loop, a worker process, a Harbor trial, a
Ray actor); what happens around it is the same everywhere and lives here. The backend's side:
:class:`RolloutReporter` reports one rollout through the seam's callbacks, and :func:`run_workflow`
and :func:`run_grader` run one stage as the ``local`` backend runs it. A whole backend built on
them is the example in :mod:`osmosis_core.backend`.

The caller's side (``osmosis run``'s runner, ``osmosis serve``, the Ray actor, a trainer's harness):
:func:`run_one` runs one request on a backend and returns its one final result;
:class:`RolloutReports` holds what was reported on the way.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from osmosis_core.context import RolloutContext
from osmosis_core.errors import BackendUnavailable, clip, error_info
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

if TYPE_CHECKING:
    from osmosis_core.backend import ExecutionBackend

__all__ = [
    "RolloutReporter",
    "RolloutReports",
    "cancelled_result",
    "report_problem",
    "run_grader",
    "run_one",
    "run_workflow",
]

ResultCallback = Callable[[ExecutionResult], Awaitable[None]]

_WF = ExecutionStage.WORKFLOW
_GR = ExecutionStage.GRADER
_SUCCESS = ExecutionStatus.SUCCESS
_FAILURE = ExecutionStatus.FAILURE


def cancelled_result(
    rollout_id: str, stage: ExecutionStage, *, timings: dict[str, float] | None = None, detail: str = ""
) -> ExecutionResult:
    """The ``cancelled`` result of a rollout cancelled during ``stage`` (``detail`` ends its message)."""
    error = ErrorInfo(ErrorCategory.CANCELLED, f"rollout cancelled during the {stage} stage{detail}")
    return ExecutionResult(rollout_id, stage, ExecutionStatus.CANCELLED, error=error, timings=dict(timings or {}))


class RolloutReporter:
    """One rollout's reports through the seam's callbacks; an async context manager around its run.

    :param grades: whether a successful workflow is followed by a grader stage (when False, the
        workflow's result is the last one, and a cancellation after it is not reported).

    Leaving the ``async with`` block:

    * cancelled (the run stops, a server cancels): the current stage is reported ``cancelled``
      through its callback, shielded, unless the rollout's last result is already out; the
      cancellation is passed on;
    * by an exception of the backend's machinery: the current stage is reported as an
      ``infra_error`` with the exception's message (secrets redacted) and the exception is not
      passed on; :class:`~osmosis_core.plugin.BackendUnavailable` (the rollout never started) and an
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
        """Deliver ``result`` to its stage's callback: a workflow result once, then a grader result
        once; a result for a stage already reported, or after the last one, is dropped, and a grader
        result before the workflow's is an error (``RuntimeError``)."""
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
        result = ExecutionResult(
            self.request.rollout_id, self.stage, _FAILURE, sample=sample, error=error, timings=self.timings
        )
        await self.report(result)

    async def cancelled(self) -> None:
        """Report the current stage ``cancelled``, once, shielded from the cancellation under way."""
        if self.ended:
            return
        result = cancelled_result(self.request.rollout_id, self.stage, timings=self.timings, detail=self.detail)
        with anyio.CancelScope(shield=True):
            await self.report(result)

    async def __aenter__(self) -> RolloutReporter:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            await self.cancelled()
        elif isinstance(exc, Exception) and not isinstance(exc, BackendUnavailable) and not self._callback_raised:
            await self.fail(exc)
            return True
        return False


# -- the caller's side ---------------------------------------------------------------------------------


def report_problem(result: object) -> str | None:
    """What is wrong with a backend's report, None when it is a well-formed :class:`ExecutionResult`."""
    if not isinstance(result, ExecutionResult):
        return f"the backend reported {type(result).__name__}, not an ExecutionResult"
    if not isinstance(result.stage, ExecutionStage) or not isinstance(result.status, ExecutionStatus):
        return f"the backend reported a result whose stage or status is not one ({result.stage!r}, {result.status!r})"
    if result.sample is not None and not isinstance(result.sample, RolloutSample):
        return f"the backend reported a sample that is not a RolloutSample: {type(result.sample).__name__}"
    if result.error is not None and not isinstance(result.error, ErrorInfo):
        return f"the backend reported an error that is not an ErrorInfo: {type(result.error).__name__}"
    timings = result.timings
    if not isinstance(timings, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in timings.values()
    ):
        return f"the backend reported timings that are not numbers of seconds: {str(timings)[:200]}"
    return None


@attrs.define(eq=False)
class RolloutReports:
    """What a backend has reported for one rollout so far: the caller's side of :class:`RolloutReporter`.

    :func:`run_one` fills it (each callback's result at most once, the first report wins); a caller
    that is cancelled reads it to build its own ``cancelled`` result (:meth:`cancelled`).
    """

    request: ExecutionRequest
    workflow: ExecutionResult | None = None
    """The workflow stage's result, as reported."""
    grader: ExecutionResult | None = None
    """The grader stage's result, as reported."""
    workflow_metrics: dict[str, Any] | None = None
    """A copy of the workflow's sample metrics when it was reported (a grader may add to the same dict)."""
    unavailable: str | None = None
    """Why the backend cannot run rollouts, when it raised :class:`~osmosis_core.plugin.BackendUnavailable`
    (the rollout never started; the message clipped, secrets redacted)."""

    problem = staticmethod(report_problem)

    @property
    def last(self) -> ExecutionResult | None:
        """The last result reported."""
        return self.grader or self.workflow

    @property
    def stage(self) -> ExecutionStage:
        """The stage a failure or a cancellation now belongs to (the grader's after a workflow success)."""
        return _GR if self.workflow is not None and self.workflow.ok else _WF

    def results(self) -> list[ExecutionResult]:
        """The results reported, in stage order."""
        return [result for result in (self.workflow, self.grader) if result is not None]

    def failure(self, category: ErrorCategory, message: str) -> ExecutionResult:
        """A failed result of the current stage, carrying the sample and timings reported so far."""
        return self._result(_FAILURE, ErrorInfo(category, message), self.last)

    def cancelled(self, message: str) -> ExecutionResult:
        """The ``cancelled`` result of the current stage (``message`` says why), with what it reported."""
        carried = self.grader if self.stage is _GR else self.workflow
        return self._result(ExecutionStatus.CANCELLED, ErrorInfo(ErrorCategory.CANCELLED, message), carried)

    def _result(self, status: ExecutionStatus, error: ErrorInfo, carried: ExecutionResult | None) -> ExecutionResult:
        """A result of the current stage with ``carried``'s sample and timings (none of a malformed report)."""
        rollout_id, stage = self.request.rollout_id, self.stage
        if carried is None or report_problem(carried) is not None:
            return ExecutionResult(rollout_id, stage, status, error=error)
        return ExecutionResult(
            rollout_id, stage, status, sample=carried.sample, error=error, timings=dict(carried.timings)
        )

    def keep(self, result: ExecutionResult, stage: ExecutionStage) -> bool:
        """Keep a result reported through ``stage``'s callback; False when that stage was reported
        already (the report is ignored). A malformed report is kept as it came (see :meth:`problem`)."""
        if not isinstance(result, ExecutionResult):
            raise TypeError(f"a backend reports an ExecutionResult, got {type(result).__name__}")
        if stage is _WF:
            if self.workflow is not None:
                return False
            if isinstance(result.sample, RolloutSample) and isinstance(result.sample.metrics, dict):
                self.workflow_metrics = dict(result.sample.metrics)
            self.workflow = result
        elif self.grader is None:
            self.grader = result
        else:
            return False
        return True


def _on_asyncio() -> bool:
    """Whether the running event loop is asyncio's (not trio's, through anyio)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _cancel_requested() -> bool:
    """True when the running task was asked to cancel (by its caller), not hit by a stray CancelledError."""
    task = asyncio.current_task() if _on_asyncio() else None
    return task is None or task.cancelling() > 0


async def run_one(
    backend: ExecutionBackend,
    request: ExecutionRequest,
    reports: RolloutReports | None = None,
    *,
    on_workflow_complete: ResultCallback | None = None,
    secrets: Sequence[str | None] = (),
) -> ExecutionResult:
    """Run ``request`` on ``backend``; its one final result (never raised, except a cancellation).

    The final result is the last stage the backend reported: the grader's, or the workflow's when
    the rollout is not graded or its workflow failed. What goes wrong around the backend becomes an
    ``infra_error`` failure of the stage under way, carrying the sample reported so far:

    * it returned without reporting a result;
    * it raised (the message's secrets redacted: ``secrets`` and the request's policy's);
    * it raised ``CancelledError`` while nobody cancelled the calling task;
    * it raised :class:`~osmosis_core.plugin.BackendUnavailable`: ``reports.unavailable`` says why (a run
      stops there, a server answers 503), and the failure says the backend is unavailable.

    A cancellation of the calling task is passed on: ``reports`` (give your own to read it) holds
    what was reported, for :meth:`RolloutReports.cancelled`. ``on_workflow_complete`` hears the
    workflow's result as soon as it is reported (once), before the grader runs.

    >>> import asyncio
    >>> from osmosis_core import ExecutionRequest, PolicyEndpoint, RolloutSample
    >>> class Echo:  # a backend that reports a workflow stage and nothing more
    ...     async def execute(self, request, on_workflow_complete, on_grader_complete):
    ...         sample = RolloutSample(messages=[*request.prompt, {"role": "assistant", "content": "hi"}])
    ...         await on_workflow_complete(ExecutionResult(request.rollout_id, _WF, _SUCCESS, sample=sample))
    >>> request = ExecutionRequest("r-1", [{"role": "user", "content": "hello"}], PolicyEndpoint("http://x/v1", "m"))
    >>> result = asyncio.run(run_one(Echo(), request))
    >>> result.status.value, result.sample.messages[-1]["content"]
    ('success', 'hi')
    >>> class Silent:
    ...     async def execute(self, request, on_workflow_complete, on_grader_complete):
    ...         return None
    >>> asyncio.run(run_one(Silent(), request)).error.message
    'the backend (Silent) returned without reporting a result'
    """
    reports = reports if reports is not None else RolloutReports(request)

    async def on_workflow(result: ExecutionResult) -> None:
        if reports.keep(result, _WF) and on_workflow_complete is not None:
            await on_workflow_complete(result)

    async def on_grader(result: ExecutionResult) -> None:
        reports.keep(result, _GR)

    try:
        await backend.execute(request, on_workflow, on_grader)
    except anyio.get_cancelled_exc_class():
        if _cancel_requested():
            raise
        return reports.failure(
            ErrorCategory.INFRA_ERROR, "the backend raised CancelledError while nobody cancelled the rollout"
        )
    except BackendUnavailable as exc:
        reports.unavailable = clip(str(exc), [*secrets, *request.policy.secrets()], 1000)
        return reports.failure(ErrorCategory.INFRA_ERROR, f"the backend is unavailable: {reports.unavailable}")
    except Exception as exc:
        info = error_info(exc, secrets=[*secrets, *request.policy.secrets()], category=ErrorCategory.INFRA_ERROR)
        return reports.failure(info.category, info.message)
    last = reports.last
    if last is None:  # a result must not vanish
        return reports.failure(
            ErrorCategory.INFRA_ERROR, f"the backend ({type(backend).__name__}) returned without reporting a result"
        )
    return last


# -- the stages, as the local backend runs them -------------------------------------------------------


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


async def _within[**P, R](timeout: float, fn: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs) -> R:
    """Await ``fn`` within ``timeout`` seconds (TimeoutError past it).

    On asyncio it uses asyncio's own timeout, which costs a fraction of a cancel scope.
    """
    if _on_asyncio():
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
        return _failure(request, _WF, exc, timings, timeout, await _partial_sample(rollout))
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
        return _failure(request, _GR, exc, timings, timeout, sample)
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
    sample: RolloutSample | None = None,
) -> ExecutionResult:
    info = error_info(exc, secrets=request.policy.secrets())
    if isinstance(exc, asyncio.CancelledError):
        info = ErrorInfo(
            ErrorCategory.AGENT_ERROR, f"the {stage} raised CancelledError while nobody cancelled the rollout"
        )
    if isinstance(exc, TimeoutError) and timeout is not None and timings.get(stage, 0.0) >= timeout * 0.99:
        info = ErrorInfo(ErrorCategory.TIMEOUT, f"the {stage} ran past its {timeout:g} s timeout{_doing(exc)}")
    return ExecutionResult(request.rollout_id, stage, _FAILURE, sample=sample, error=info, timings=timings)


def _own_failure(exc: BaseException) -> bool:
    """True when ``exc`` is the stage's own failure, to report as a result, not to pass on.

    Any ``Exception``; and what a workflow or grader raises that would otherwise stop the whole
    run: ``sys.exit()`` (``SystemExit``), a ``KeyboardInterrupt`` it raised itself, and a
    ``CancelledError`` raised while nobody cancelled the rollout (the run's own cancellation is
    passed on and reported as ``cancelled``).
    """
    if isinstance(exc, asyncio.CancelledError):
        return not _cancel_requested()
    return isinstance(exc, (Exception, SystemExit, KeyboardInterrupt))


async def _partial_sample(rollout: RolloutContext) -> RolloutSample | None:
    """What a failed workflow's registered source still holds (the history up to the failure)."""
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


def __getattr__(name: str) -> Any:
    if name == "Rollout":  # renamed for its role (CHANGELOG 0.2.0)
        from osmosis_core.deprecation import warn_deprecated

        warn_deprecated("osmosis_core.lifecycle.Rollout", "osmosis_core.lifecycle.RolloutReporter", "0.2.0")
        return RolloutReporter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
