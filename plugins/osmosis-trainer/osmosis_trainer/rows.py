"""Training rows: a rollout's result (with its trace) as the per-sequence rows trainers consume.

Every trainer adapter (TRL's ``rollout_func``, SkyRL's ``GeneratorOutput``, verl's
``AgentLoopOutput``, slime's ``Sample``) needs the same split of each stitched token sequence:

* ``prompt_ids``: the prompt of the sequence's first call, as the inference server saw it;
* ``completion_ids``: everything after it (the generated turns, and the tool / user tokens between
  them), with ``completion_mask`` 1 on generated tokens and 0 on the rest, and
  ``completion_logprobs`` the sampling logprob of each generated token (0.0 where the mask is 0);
* the rollout's reward, and what a trainer must know before it trusts the row: ``complete``,
  ``prefix_breaks``, ``delivered_fraction``, and ``mask_reason``.

**Masked rows.** A row that must not be trained on has a ``mask_reason`` and an all-zero
``completion_mask`` (and logprobs), so forgetting to check the flag trains on nothing rather than
on a broken sample; its ids are kept (a trainer that needs a placeholder row has its real shape,
possibly empty). The reasons, in the order they are checked:

``failed``
    the rollout did not succeed (``mask_detail`` is its error);
``removed``
    the server asked that the sample be left out of training (``remove_sample``);
``no_trace``
    the result carries no trace (is ``osmosis serve`` running with ``--traces``?);
``incomplete_trace``
    a model call failed or was not captured (``mask_detail`` says which): the trace is not the whole
    rollout; or the trace is malformed (not one a gateway writes);
``prefix_break``
    with ``sequences="last"`` (one row per rollout), a call's prompt did not extend the earlier
    calls' tokens (a chat template that re-renders history), so no single sequence holds the
    rollout; with ``sequences="all"`` each piece is a row of its own and nothing is masked for it;
``no_tokens``
    the sequence has no generated token (no model call, a text-only trace, an empty generation);
``no_reward``
    asked for (``mask_no_reward=True``): the rollout succeeded without a finite reward (not graded,
    or NaN), so it has nothing to teach and would only dilute its batch's loss;
``truncated``
    asked for (``mask_truncated=True``): the completion was cut to ``max_completion_tokens``, so the
    turns that earned the reward may be gone from the row.

The function is pure (nothing is fetched or re-tokenized). It reads the trace's JSON form straight
(:func:`osmosis_trainer.view_of_json`: lists checked by msgspec, no records built): about 20 ns per
token id the trace holds, each call's prompt counted whole (measured on Python 3.12: 35 us for a
2-call rollout of 560 tokens, 0.6 ms for 10 calls and 5,000 tokens).

``reward`` is the rollout's, on every row of it, masked or not: the group helpers
(:func:`osmosis_trainer.group_advantages`) leave masked rows out of their group's statistics.

>>> from osmosis_trainer import RolloutResult
>>> result = RolloutResult.from_json({
...     "rollout_id": "row0-s0", "status": "success", "reward": 1.0,
...     "trace": {"rollout_id": "row0-s0", "capture": "tokens", "calls": [
...         {"call_id": "c0", "index": 0, "prompt_token_ids": [1, 2], "completion_token_ids": [3, 4],
...          "logprobs": [-0.5, -0.25]},
...         {"call_id": "c1", "index": 1, "prompt_token_ids": [1, 2, 3, 4, 9], "completion_token_ids": [5],
...          "logprobs": [-0.1]}]}})
>>> [row] = rollout_rows(result)
>>> row.prompt_ids, row.completion_ids, row.completion_mask, row.completion_logprobs
([1, 2], [3, 4, 9, 5], [1, 1, 0, 1], [-0.5, -0.25, 0.0, -0.1])
>>> row.reward, row.masked, row.complete, row.prefix_breaks, row.delivered_fraction
(1.0, False, True, 0, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from osmosis_trainer.trace import view_of_json

if TYPE_CHECKING:
    from osmosis_trainer.client import RolloutResult

__all__ = ["MASK_REASONS", "MaskReason", "SequenceRow", "rollout_rows", "rows_metrics"]

MaskReason = Literal[
    "failed", "removed", "no_trace", "incomplete_trace", "prefix_break", "no_tokens", "no_reward", "truncated"
]
"""Why a row is masked (see the module docstring)."""

MASK_REASONS: Final[tuple[MaskReason, ...]] = (
    "failed",
    "removed",
    "no_trace",
    "incomplete_trace",
    "prefix_break",
    "no_tokens",
    "no_reward",
    "truncated",
)


@attrs.frozen
class SequenceRow:
    """One token sequence of one rollout, split the way trainers take it (see the module docstring)."""

    rollout_id: str
    sequence_index: int
    """0 for the rollout's first sequence (the order :func:`osmosis_trainer.trainer_view` gives)."""
    sequence_count: int
    """How many rows the rollout gave."""
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    """1 on generated tokens, 0 on tool / user tokens between turns; all 0 on a masked row."""
    completion_logprobs: list[float]
    """The sampling logprob of each completion token; 0.0 where the mask is 0."""
    reward: float | None
    """The rollout's reward (None: failed, or not graded)."""
    complete: bool
    """The rollout's trace holds every model call it made, captured (False without a trace)."""
    prefix_breaks: int
    """The rollout's prefix breaks (calls whose prompt extends no earlier call, not counting the first)."""
    delivered_fraction: float
    """The share of the rollout's generated tokens its rows train on (:attr:`TrainerView.delivered_fraction
    <osmosis_trainer.TrainerView.delivered_fraction>`, less what ``max_completion_tokens`` cut; 0.0 when
    the rollout is masked)."""
    mask_reason: MaskReason | None = None
    mask_detail: str | None = None
    """For people: the error, the incomplete trace's reason."""
    truncated: bool = False
    """The completion was cut to ``max_completion_tokens``."""
    call_ids: tuple[str, ...] = ()
    """The model calls this sequence is made of, first first."""
    policy_versions: tuple[str | None, ...] = ()
    """The policy version each of those calls was served by (for off-policy correction)."""

    @property
    def masked(self) -> bool:
        """True when a trainer must not learn from this row (``mask_reason`` says why)."""
        return self.mask_reason is not None

    @property
    def is_last(self) -> bool:
        """The rollout's last row (where a trainer that wants one reward per rollout puts it)."""
        return self.sequence_index == self.sequence_count - 1

    @property
    def trained_tokens(self) -> int:
        """Completion tokens with mask 1."""
        return sum(self.completion_mask)


def _empty(result: RolloutResult, reason: MaskReason, detail: str | None, *, complete: bool = False) -> SequenceRow:
    return SequenceRow(
        rollout_id=result.rollout_id,
        sequence_index=0,
        sequence_count=1,
        prompt_ids=[],
        completion_ids=[],
        completion_mask=[],
        completion_logprobs=[],
        reward=result.reward,
        complete=complete,
        prefix_breaks=0,
        delivered_fraction=0.0,
        mask_reason=reason,
        mask_detail=detail,
    )


def _rollout_reason(result: RolloutResult) -> tuple[MaskReason | None, str | None]:
    if not result.ok:
        return "failed", str(result.error) if result.error is not None else f"status {result.status}"
    if result.remove_sample:
        return "removed", "the server marked the sample remove_sample"
    return None, None


def rollout_rows(
    result: RolloutResult,
    *,
    sequences: Literal["all", "last"] = "all",
    max_completion_tokens: int | None = None,
    mask_truncated: bool = False,
    mask_no_reward: bool = False,
) -> list[SequenceRow]:
    """The training rows of one rollout (see the module docstring for the fields and the masks).

    :param sequences: ``"all"``: one row per stitched sequence (a prefix break or a fork gives
        several; a token shared by two is trained in the first only), for trainers that take
        step-wise rows (SkyRL, slime, verl's v1 path). ``"last"``: exactly one row per rollout, the
        branch of its last call, masked ``prefix_break`` when the rollout broke its prefix (TRL's
        ``rollout_func``, verl's classic path: one sample per prompt row).
    :param max_completion_tokens: cut each completion to this many tokens (``truncated`` says so),
        as a trainer's response length demands.
    :param mask_truncated: mask a row so cut (``truncated``) instead of training on what is left.
    :param mask_no_reward: mask the rows of a rollout that succeeded without a finite reward
        (``no_reward``).
    :raises ValueError: ``sequences`` or ``max_completion_tokens`` out of range. A trace that is not
        one (lists of different lengths, a field of the wrong type) is a masked ``incomplete_trace``
        row that says why, not an error: one bad rollout never aborts a step.
    """
    if sequences not in ("all", "last"):
        raise ValueError(f"sequences must be 'all' or 'last', got {sequences!r}")
    if max_completion_tokens is not None and max_completion_tokens < 0:
        raise ValueError(f"max_completion_tokens must be >= 0, got {max_completion_tokens}")
    reason, detail = _rollout_reason(result)
    if reason is None and mask_no_reward and (result.reward is None or not math.isfinite(result.reward)):
        reason = "no_reward"
        detail = "the rollout succeeded without a reward (is it graded?)" if result.reward is None else "reward NaN"
    if result.trace is None:
        if reason is None:
            reason, detail = "no_trace", "the result carries no trace: is the server running with --traces?"
        return [_empty(result, reason, detail)]
    capture = result.trace.get("capture", "tokens")
    if capture != "tokens":
        detail = detail or f"the trace holds text only (capture={capture!r}): no token ids to train on"
        return [_empty(result, reason or "no_tokens", detail, complete=bool(result.trace.get("complete")))]
    try:
        view = view_of_json(result.trace, branches=sequences)
    except ValueError as exc:  # one malformed trace must not abort a trainer's step (SkyRL #1613)
        return [_empty(result, reason or "incomplete_trace", detail or f"the trace is not one: {exc}"[:500])]
    if reason is None and not view.complete:
        reason, detail = "incomplete_trace", view.incomplete_reason
    if reason is None and sequences == "last" and view.prefix_breaks:
        reason = "prefix_break"
        detail = f"{view.prefix_breaks} prefix break(s): no single token sequence holds the rollout"
    if not view.sequences:
        detail = detail or "the rollout made no model call"
        return [_empty(result, reason or "no_tokens", detail, complete=view.complete)]
    pieces = []
    cut = 0  # generated tokens the truncation leaves out
    for sequence in view.sequences:
        start = sequence.root_prompt_length
        completion = sequence.token_ids[start:]
        mask = sequence.loss_mask[start:]
        logprobs = sequence.logprobs[start:]
        truncated = max_completion_tokens is not None and len(completion) > max_completion_tokens
        if truncated:
            cut += sum(mask[max_completion_tokens:])
            completion = completion[:max_completion_tokens]
            mask = mask[:max_completion_tokens]
            logprobs = logprobs[:max_completion_tokens]
        pieces.append((sequence, start, completion, mask, logprobs, truncated))
    if reason is not None:
        delivered = 0.0
    elif cut:
        delivered = view.delivered_fraction * (view.delivered_tokens - cut) / view.delivered_tokens
    else:
        delivered = view.delivered_fraction
    rows: list[SequenceRow] = []
    for index, (sequence, start, completion, mask, logprobs, truncated) in enumerate(pieces):
        row_reason, row_detail = reason, detail
        if row_reason is None and 1 not in mask:
            row_reason, row_detail = "no_tokens", "no generated token in this sequence"
        if row_reason is None and truncated and mask_truncated:
            total = len(sequence.token_ids) - start
            row_reason, row_detail = "truncated", f"cut to {len(completion)} of its {total} completion tokens"
        if row_reason is not None:
            mask = [0] * len(completion)
            logprobs = [0.0] * len(completion)
        rows.append(
            SequenceRow(
                rollout_id=result.rollout_id,
                sequence_index=index,
                sequence_count=len(pieces),
                prompt_ids=sequence.token_ids[:start],
                completion_ids=completion,
                completion_mask=mask,
                completion_logprobs=logprobs,
                reward=result.reward,
                complete=view.complete,
                prefix_breaks=view.prefix_breaks,
                delivered_fraction=delivered,
                mask_reason=row_reason,
                mask_detail=row_detail,
                truncated=truncated,
                call_ids=sequence.call_ids,
                policy_versions=sequence.policy_versions,
            )
        )
    return rows


def rows_metrics(rows: Iterable[SequenceRow]) -> dict[str, Any]:
    """What a training step should log about its rows: counts per rollout and per row.

    ``rollouts``, ``rows``, ``masked_rows``, ``masked_<reason>`` (rows, one key per reason),
    ``incomplete_rollouts``, ``prefix_breaks`` (summed over rollouts), ``trained_tokens``,
    ``truncated_rows`` and ``delivered_fraction`` (the mean over rollouts; 1.0 when there are none).

    >>> rows_metrics([])["rows"]
    0
    """
    metrics: dict[str, Any] = {
        "rollouts": 0,
        "rows": 0,
        "masked_rows": 0,
        **{f"masked_{reason}": 0 for reason in MASK_REASONS},
        "incomplete_rollouts": 0,
        "prefix_breaks": 0,
        "trained_tokens": 0,
        "truncated_rows": 0,
    }
    delivered = 0.0
    for row in rows:
        metrics["rows"] += 1
        metrics["trained_tokens"] += row.trained_tokens
        metrics["truncated_rows"] += row.truncated
        if row.mask_reason is not None:
            metrics["masked_rows"] += 1
            metrics[f"masked_{row.mask_reason}"] += 1
        if row.sequence_index == 0:  # once per rollout
            metrics["rollouts"] += 1
            metrics["incomplete_rollouts"] += not row.complete
            metrics["prefix_breaks"] += row.prefix_breaks
            delivered += row.delivered_fraction
    metrics["delivered_fraction"] = delivered / metrics["rollouts"] if metrics["rollouts"] else 1.0
    return metrics
