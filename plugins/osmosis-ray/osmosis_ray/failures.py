"""Which failures are Ray's own (retried on another actor), and the results the backend reports itself.

A workflow's or grader's failure never reaches this module: the actor's inner backend turns it
into a result with its category, exactly as ``local`` does, and that result is final. What
arrives on the driver as an exception is Ray's: the actor died or is restarting, its node was
lost, its result object was lost. Those are *infra* failures: the rollout is retried elsewhere.
Anything else raised by a call to an actor (a bug in this plugin, a runtime environment that
cannot be set up) is reported as ``infra_error`` at once, not retried.

>>> is_retriable(ConnectionError("gone"))
False
"""

from __future__ import annotations

from osmosis_core import ErrorCategory, ErrorInfo, ExecutionRequest, ExecutionResult, ExecutionStage, ExecutionStatus
from osmosis_core.plugin import clip

__all__ = ["describe", "failure_result", "is_retriable", "prompt_excerpt"]


def is_retriable(exc: BaseException) -> bool:
    """True for Ray's own failures of a call: actor died or unavailable, worker crashed, node or object lost."""
    try:
        import ray.exceptions as rex
    except ImportError:  # pragma: no cover - the backend imported Ray already
        return False
    retriable = (
        rex.RayActorError,  # ActorDiedError, ActorUnavailableError
        rex.WorkerCrashedError,
        rex.NodeDiedError,
        rex.ObjectLostError,  # OwnerDiedError, ObjectFetchTimedOutError, ObjectReconstructionFailedError
        rex.LocalRayletDiedError,
        rex.OutOfMemoryError,
        rex.ObjectStoreFullError,
        rex.ActorPlacementGroupRemoved,
        rex.TaskPlacementGroupRemoved,
    )
    return isinstance(exc, retriable)


def describe(exc: BaseException) -> str:
    """One line for a Ray exception: its type and the first line of its message."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    return clip(f"{type(exc).__name__}: {first}" if first else type(exc).__name__, limit=240)


def failure_result(
    request: ExecutionRequest, category: ErrorCategory, message: str, stage: ExecutionStage = ExecutionStage.WORKFLOW
) -> ExecutionResult:
    """A failed result the backend itself reports (the rollout's own results never arrived)."""
    info = ErrorInfo(category, clip(message, request.policy.secrets(), limit=1000))
    return ExecutionResult(request.rollout_id, stage, ExecutionStatus.FAILURE, error=info)


def prompt_excerpt(request: ExecutionRequest, limit: int = 80) -> str:
    """The row's last user message, shortened: how a person recognises the row in a message."""
    for message in reversed(request.prompt):
        if message.get("role") == "user":
            content = message.get("content")
            text = content if isinstance(content, str) else str(content)
            return clip(text, request.policy.secrets(), limit=limit)
    return ""
