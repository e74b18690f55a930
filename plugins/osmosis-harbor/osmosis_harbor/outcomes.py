"""From a finished Harbor trial to osmosis results: which stage failed, in which category, and why.

=====================================  ========================  ===========================
what happened in the trial             stage                     category
=====================================  ========================  ===========================
the workflow failed inside the trial   workflow                  the workflow's own (as local)
Harbor's agent timeout fired           workflow                  ``timeout`` (logs path named)
the verifier wrote no reward           grader                    ``validation_error`` (task named)
the grader failed (template mode)      grader                    the grader's own (as local)
the verifier timed out                 grader                    ``timeout``
anything else (sandbox, Harbor)        the stage it stopped      ``infra_error``
=====================================  ========================  ===========================

>>> pick_reward({"reward": 0.5, "tests_passed": 3})
0.5
>>> pick_reward({"accuracy": 1})
1.0
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from osmosis_core import ErrorCategory, ErrorInfo, ExecutionResult, ExecutionStage, ExecutionStatus

__all__ = ["NO_REWARD_ERRORS", "failure", "grader_file_result", "pick_reward", "trial_error"]

NO_REWARD_ERRORS = frozenset({"RewardFileNotFoundError", "RewardFileEmptyError", "VerifierOutputParseError"})
"""Harbor's exceptions for a verifier that wrote no usable reward."""

_TIMEOUTS = {"AgentTimeoutError": ExecutionStage.WORKFLOW, "VerifierTimeoutError": ExecutionStage.GRADER}


def pick_reward(rewards: dict[str, Any]) -> float:
    """The rollout's reward from Harbor's verifier rewards: ``reward``, else the only value, else the mean.

    :raises ValueError: no finite number among them.
    """
    values = {k: float(v) for k, v in rewards.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    values = {k: v for k, v in values.items() if math.isfinite(v)}
    if "reward" in values:
        return values["reward"]
    if len(values) == 1:
        return next(iter(values.values()))
    if values:
        return sum(values.values()) / len(values)
    raise ValueError(f"the verifier's rewards hold no finite number: {rewards!r}")


def failure(
    rollout_id: str,
    stage: ExecutionStage,
    category: ErrorCategory,
    message: str,
    *,
    sample: Any = None,
    timings: dict[str, float] | None = None,
) -> ExecutionResult:
    """A failed stage result."""
    status = ExecutionStatus.CANCELLED if category is ErrorCategory.CANCELLED else ExecutionStatus.FAILURE
    return ExecutionResult(
        rollout_id, stage, status, sample=sample, error=ErrorInfo(category, message), timings=timings or {}
    )


def grader_file_result(verifier_dir: Path, nonce: str) -> ExecutionResult | None:
    """The grader's own result (``osmosis-grader.json``), if the grader runner of this trial wrote it."""
    from osmosis_core.wire import result_from_json

    path = verifier_dir / "osmosis-grader.json"
    try:
        if path.is_symlink() or not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("nonce") != nonce:
            return None
        return result_from_json(data)
    except (OSError, ValueError):
        return None


def trial_error(
    exception_type: str,
    exception_message: str,
    *,
    task_name: str,
    trial_dir: Path,
    agent_timeout: float | None,
    grader_timeout: float | None,
    workflow_ok: bool,
) -> tuple[ExecutionStage, ErrorInfo]:
    """The stage and error of a trial that recorded ``exception_type`` (see the module's table)."""
    where = f"Harbor trial {trial_dir.name} of task {task_name!r}; logs: {trial_dir}"
    message = " ".join(exception_message.split())[:1500]
    if exception_type in _TIMEOUTS:
        stage = _TIMEOUTS[exception_type]
        what, limit = ("workflow", agent_timeout) if stage is ExecutionStage.WORKFLOW else ("grader", grader_timeout)
        limit_text = f"its {limit:g} s timeout" if limit else "its timeout"
        return stage, ErrorInfo(ErrorCategory.TIMEOUT, f"the {what} ran past {limit_text} ({where})")
    stage = ExecutionStage.GRADER if workflow_ok else ExecutionStage.WORKFLOW
    if exception_type in NO_REWARD_ERRORS:
        return stage, ErrorInfo(
            ErrorCategory.VALIDATION_ERROR,
            f"the verifier of task {task_name!r} wrote no reward ({exception_type}: {message}); "
            f"see {trial_dir / 'verifier' / 'test-stdout.txt'} ({where})",
        )
    if exception_type in ("CancelledError", "TrialCancelledError"):
        return stage, ErrorInfo(ErrorCategory.CANCELLED, f"the trial was cancelled ({where})")
    return stage, ErrorInfo(ErrorCategory.INFRA_ERROR, f"Harbor trial failed: {exception_type}: {message} ({where})")
