"""A rollout result as slime's ``Sample`` objects: pure (no slime, no torch), on slime's ``Sample``
read by duck typing (its fields are set, its ``Status`` enum is read from the sample's class).

**One sample per stitched sequence** (:func:`osmosis_trainer.rollout_rows` with
``sequences="all"``): a rollout whose calls extend each other is one ``Sample``: ``tokens`` its
first prompt and everything after it, ``response_length`` the tokens after the prompt,
``loss_mask`` (response only) 1 on generated tokens and 0 on the tool / user tokens between them,
``rollout_log_probs`` (response only) each generated token's sampling logprob (0.0 under mask 0),
``reward`` the grader's. A rollout that forked (two calls continued the same prefix) or broke its
prefix (a template that re-renders history) is several samples, a ``list[Sample]`` sharing one
``rollout_id`` (the sample's own, else its ``index``, as slime's ``TrajectoryManager`` sets it), each
carrying the rollout's whole reward: slime counts them as one rollout in its loss.

``status``: ``COMPLETED``; ``TRUNCATED`` when the last call hit its token budget
(``finish_reason: length``) or the sample was cut to ``max_context_tokens``; ``ABORTED`` when the
rollout was cancelled (slime re-queues aborted samples in partial rollouts); ``FAILED`` when it
failed or must not be trained on (no trace, an incomplete trace, no tokens), which also sets
``remove_sample`` (slime then zeroes its loss mask; it still counts in its group's advantage
normalization, with the rollout's reward when it has a finite one, else 0.0). Every sample's
``metadata`` gets the rollout's facts: ``osmosis_rollout_id``, ``osmosis_mask_reason``,
``osmosis_mask_detail``, ``osmosis_complete``, ``osmosis_prefix_breaks``, ``osmosis_sequences``,
``osmosis_truncated``.

>>> import dataclasses, enum
>>> @dataclasses.dataclass
... class Sample:  # the fields of slime's that the conversion sets
...     class Status(enum.Enum):
...         PENDING, COMPLETED, TRUNCATED, ABORTED, FAILED = "pending", "completed", "truncated", "aborted", "failed"
...     index: int | None = 0
...     rollout_id: int | None = None
...     tokens: list = dataclasses.field(default_factory=list)
...     response: str = ""
...     response_length: int = 0
...     reward: float | None = None
...     loss_mask: list | None = None
...     rollout_log_probs: list | None = None
...     remove_sample: bool = False
...     status: Status = Status.PENDING
...     metadata: dict = dataclasses.field(default_factory=dict)
>>> from osmosis_trainer import RolloutResult
>>> trace = {"rollout_id": "a", "calls": [
...     {"call_id": "c0", "index": 0, "prompt_token_ids": [1, 2], "completion_token_ids": [3], "logprobs": [-0.5]},
...     {"call_id": "c1", "index": 1, "prompt_token_ids": [1, 2, 3, 9], "completion_token_ids": [4],
...      "logprobs": [-0.25], "finish_reason": "stop"}]}
>>> result = RolloutResult.from_json({"rollout_id": "a", "status": "success", "reward": 1.0, "trace": trace})
>>> [s] = samples_of(result, Sample())
>>> s.tokens, s.response_length, s.loss_mask, s.rollout_log_probs, s.reward, s.status.name, s.rollout_id
([1, 2, 3, 9, 4], 3, [1, 0, 1], [-0.5, 0.0, -0.25], 1.0, 'COMPLETED', 0)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from osmosis_trainer.rows import SequenceRow, rollout_rows
from osmosis_trainer.wire import RolloutStatus

if TYPE_CHECKING:
    from osmosis_trainer.client import RolloutResult

__all__ = ["samples_of"]


def _last_answer(result: RolloutResult) -> str:
    if result.sample is None:
        return ""
    for message in reversed(result.sample.messages):
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def _finish_reasons(result: RolloutResult) -> dict[str, Any]:
    calls = result.trace.get("calls") if result.trace is not None else None
    return {str(c.get("call_id")): c.get("finish_reason") for c in calls or () if isinstance(c, Mapping)}


def samples_of(
    result: RolloutResult,
    sample: Any,
    *,
    max_context_tokens: int | None = None,
    mask_truncated: bool = False,
) -> list[Any]:
    """``result`` as slime samples (see the module docstring): ``sample`` itself filled when the
    rollout is one sequence, else shallow copies of it, one per sequence, sharing its ``rollout_id``.

    :param max_context_tokens: cut each sample's ``tokens`` to this many (slime's
        ``rollout_max_context_len``; the prompt always stays whole).
    :param mask_truncated: a cut sample is removed from training instead of trained on what is left.

    A malformed trace is a removed sample (``incomplete_trace``, as
    :func:`~osmosis_trainer.rollout_rows` masks it), never an exception.
    """
    rows = rollout_rows(result, sequences="all")
    finish = _finish_reasons(result)
    rollout_id = sample.rollout_id if sample.rollout_id is not None else sample.index
    reward = result.reward if result.reward is not None and math.isfinite(result.reward) else 0.0
    # the copies are made before the sample is filled: each starts from the row slime handed over
    samples = [sample, *(copy.copy(sample) for _ in rows[1:])]
    for target, row in zip(samples, rows, strict=True):
        _fill(target, result, row, len(rows), finish, rollout_id, reward, max_context_tokens, mask_truncated)
    return samples


def _fill(
    target: Any,
    result: RolloutResult,
    row: SequenceRow,
    sequences: int,
    finish: Mapping[str, Any],
    rollout_id: Any,
    reward: float,
    max_context_tokens: int | None,
    mask_truncated: bool,
) -> None:
    status_enum = type(target).Status
    prompt = list(row.prompt_ids) or (list(target.tokens[:1]) or [0])
    response, mask, logprobs = list(row.completion_ids), list(row.completion_mask), list(row.completion_logprobs)
    reason, detail = row.mask_reason, row.mask_detail
    truncated = bool(row.call_ids) and finish.get(row.call_ids[-1]) == "length"
    if max_context_tokens is not None and len(prompt) + len(response) > max_context_tokens:
        keep = max(max_context_tokens - len(prompt), 0)
        response, mask, logprobs = response[:keep], mask[:keep], logprobs[:keep]
        truncated = True
        if reason is None and mask_truncated:
            reason, detail = "truncated", f"cut to {max_context_tokens} tokens (rollout_max_context_len)"
        if reason is None and 1 not in mask:
            reason, detail = "no_tokens", f"no generated token within {max_context_tokens} tokens"
    if reason is not None:
        mask, logprobs = [0] * len(response), [0.0] * len(response)
    if not response:  # slime trains on a response: a masked one gets one token it never learns from
        response, mask, logprobs = [0], [0], [0.0]
    if result.status is RolloutStatus.CANCELLED:
        status = status_enum.ABORTED
    elif reason is not None and reason not in ("removed", "truncated"):
        status = status_enum.FAILED
    elif truncated:
        status = status_enum.TRUNCATED
    else:
        status = status_enum.COMPLETED
    target.rollout_id = rollout_id
    target.tokens = prompt + response
    target.response = _last_answer(result) if row.is_last else ""
    target.response_length = len(response)
    target.loss_mask = mask
    target.rollout_log_probs = logprobs
    target.reward = reward
    target.status = status
    target.remove_sample = bool(getattr(target, "remove_sample", False)) or reason is not None
    target.metadata = {
        **(target.metadata or {}),
        "osmosis_rollout_id": result.rollout_id,
        "osmosis_mask_reason": reason,
        "osmosis_mask_detail": detail,
        "osmosis_complete": row.complete,
        "osmosis_prefix_breaks": row.prefix_breaks,
        "osmosis_sequences": sequences,
        "osmosis_truncated": truncated,
    }
