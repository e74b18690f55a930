"""verl's side of a rollout, both ways, as pure functions (no verl, no torch): its agent loop's
sampling dict as a rollout's :class:`~osmosis_trainer.SamplingParams`, a dataset row's label, and a
rollout result as the fields of its ``AgentLoopOutput``.

**One output per sample** (verl's classic ``ray_trainer`` path takes exactly one sequence per
prompt row): the rollout's calls stitched by exact token prefix into one sequence
(:func:`osmosis_trainer.rollout_rows`): ``prompt_ids`` the first call's prompt, ``response_ids``
everything after it (the generated turns and the tool / user tokens between them, never
re-tokenized), ``response_mask`` 1 on generated tokens, ``response_logprobs`` each generated token's
sampling logprob (0.0 under mask 0), all cut to ``response_length``; ``reward_score`` the grader's
reward (verl then skips its own reward function and puts it on the last response token).

**A rollout that is not one clean sequence is reported, never silently merged or trained on**: it
is *masked* (``response_mask`` all 0, so its tokens carry no loss) and ``extra_fields`` says why
(``osmosis_mask_reason``): one of :data:`osmosis_trainer.rows.MASK_REASONS` (failed, no trace, an
incomplete trace, a broken prefix, no tokens, ...), ``forked`` (two calls continued the same
prefix: two sequences, which verl's classic path cannot take), or ``prompt_too_long`` (the first
prompt is longer than ``prompt_length``: verl would cut its left end, so the logprobs were not
sampled from the context it trains on). A masked output keeps its ids (at least one response
token: verl puts the reward on the last one), and its ``reward_score`` is the rollout's reward when
it has a finite one, else 0.0: verl's GRPO statistics count every sample of a prompt, so the
placeholder's score enters its group's mean (verl has no per-sample opt-out; the
``osmosis_masked`` count in the metrics says how often).

>>> from osmosis_trainer import RolloutResult
>>> trace = {"rollout_id": "a", "calls": [
...     {"call_id": "c0", "index": 0, "prompt_token_ids": [1, 2], "completion_token_ids": [3], "logprobs": [-0.5]},
...     {"call_id": "c1", "index": 1, "prompt_token_ids": [1, 2, 3, 9], "completion_token_ids": [4],
...      "logprobs": [-0.25]}]}
>>> result = RolloutResult.from_json({"rollout_id": "a", "status": "success", "reward": 1.0, "trace": trace})
>>> fields = agent_loop_fields(result, prompt_length=8, response_length=8)
>>> fields["prompt_ids"], fields["response_ids"], fields["response_mask"], fields["response_logprobs"]
([1, 2], [3, 9, 4], [1, 0, 1], [-0.5, 0.0, -0.25])
>>> fields["reward_score"], fields["extra_fields"]["osmosis_mask_reason"]
(1.0, None)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from osmosis_trainer.rows import MASK_REASONS, rollout_rows
from osmosis_trainer.sampling import SamplingParams, sampling_from_trainer

if TYPE_CHECKING:
    from osmosis_trainer.client import RolloutResult

__all__ = ["EXTRA_FIELDS", "VERL_MASK_REASONS", "agent_loop_fields", "row_label", "sampling_from_verl"]

VERL_MASK_REASONS: Final = (*MASK_REASONS, "forked", "prompt_too_long")
"""Why an output is masked: a row's reason, ``forked`` or ``prompt_too_long`` (see the module docstring)."""

EXTRA_FIELDS: Final = (
    "osmosis_rollout_id",
    "osmosis_masked",
    "osmosis_mask_reason",
    "osmosis_mask_detail",
    "osmosis_reward",
    "osmosis_complete",
    "osmosis_prefix_breaks",
    "osmosis_sequences",
    "osmosis_truncated",
    "osmosis_delivered_fraction",
    "osmosis_calls",
)
"""The keys every output's ``extra_fields`` carries (the same on every sample, so verl's batch of
them stays one schema)."""

_SILENT: Final = frozenset({"logprobs"})
"""verl's flag asking its engine for logprobs: the bridge always asks."""


def sampling_from_verl(params: Mapping[str, Any] | None) -> tuple[SamplingParams | None, tuple[str, ...]]:
    """verl's agent-loop ``sampling_params`` (``temperature``, ``top_p``, ``top_k``,
    ``repetition_penalty``, ``logprobs``; validation's ``val_kwargs``) as the rollouts'
    :class:`~osmosis_trainer.SamplingParams`, and the keys left out (for the caller to warn about).

    >>> sampling_from_verl({"temperature": 1.0, "top_p": 0.9, "top_k": -1, "repetition_penalty": 1.0, "logprobs": 0})
    (SamplingParams(temperature=1.0, top_p=0.9, top_k=-1, repetition_penalty=1.0), ())

    :raises ValueError, TypeError: a value out of range or of the wrong type (the message names it).
    """
    return sampling_from_trainer(params, renames={"max_new_tokens": "max_tokens"}, silent=_SILENT)


def row_label(row: Mapping[str, Any]) -> Any:
    """The label a verl dataset row's rollout is graded against: its ``label`` column, else
    ``reward_model.ground_truth`` (verl's dataset convention), else None (not graded).

    >>> row_label({"reward_model": {"style": "rule", "ground_truth": "42"}}), row_label({"label": 7})
    ('42', 7)
    """
    if row.get("label") is not None:
        return row["label"]
    spec = row.get("reward_model")
    return spec.get("ground_truth") if isinstance(spec, Mapping) else None


def _turns(result: RolloutResult) -> int:
    """The conversation's messages other than system ones (verl's ``num_turns``: user, assistant, tool)."""
    if result.sample is None:
        return 0
    return sum(1 for m in result.sample.messages if not (isinstance(m, Mapping) and m.get("role") == "system"))


def agent_loop_fields(
    result: RolloutResult,
    *,
    prompt_length: int,
    response_length: int,
    mask_truncated: bool = False,
    pad_token_id: int = 0,
) -> dict[str, Any]:
    """The keyword arguments of ``AgentLoopOutput`` for ``result`` but ``metrics`` (see the module
    docstring): ``prompt_ids``, ``response_ids``, ``response_mask``, ``response_logprobs``,
    ``reward_score``, ``num_turns``, ``extra_fields`` (:data:`EXTRA_FIELDS`).

    :param prompt_length: verl's ``rollout.prompt_length``: a longer first prompt is masked.
    :param response_length: verl's ``rollout.response_length``: the response is cut to it.
    :param mask_truncated: mask an output so cut instead of training on what is left.
    :param pad_token_id: the response token of a masked output that has none.
    :raises ValueError: ``prompt_length`` or ``response_length`` below 1. (A malformed trace is a
        masked output, ``incomplete_trace``: :func:`~osmosis_trainer.rollout_rows`.)
    """
    if prompt_length < 1 or response_length < 1:
        raise ValueError(f"prompt_length and response_length must be >= 1, got {prompt_length}, {response_length}")
    every = rollout_rows(result, sequences="all", max_completion_tokens=response_length, mask_truncated=mask_truncated)
    if len(every) == 1:
        row = every[0]
        reason: str | None = row.mask_reason
        detail = row.mask_detail
    else:  # a fork or a broken prefix: the last branch, masked
        row = rollout_rows(result, sequences="last", max_completion_tokens=response_length)[0]
        reason, detail = row.mask_reason, row.mask_detail
        if reason is None:
            reason = "forked"
            detail = f"{len(every)} token sequences (calls that continued the same prefix): verl takes one per sample"
    prompt = row.prompt_ids
    if reason is None and len(prompt) > prompt_length:
        reason = "prompt_too_long"
        detail = f"the first prompt has {len(prompt)} tokens, over rollout.prompt_length={prompt_length}"
    if len(prompt) > prompt_length:
        prompt = prompt[-prompt_length:]  # as verl cuts a prompt (its left end)
    response, mask, logprobs = row.completion_ids, row.completion_mask, row.completion_logprobs
    if reason is not None:
        mask = [0] * len(response)
        logprobs = [0.0] * len(response)
        if not response:
            response, mask, logprobs = [pad_token_id], [0], [0.0]
    reward = result.reward if result.reward is not None and math.isfinite(result.reward) else None
    calls = result.trace.get("calls") if result.trace is not None else None
    extra = {
        "osmosis_rollout_id": result.rollout_id,
        "osmosis_masked": reason is not None,
        "osmosis_mask_reason": reason,
        "osmosis_mask_detail": detail,
        "osmosis_reward": reward,
        "osmosis_complete": row.complete,
        "osmosis_prefix_breaks": row.prefix_breaks,
        "osmosis_sequences": len(every),
        "osmosis_truncated": row.truncated,
        "osmosis_delivered_fraction": 0.0 if reason is not None else row.delivered_fraction,
        "osmosis_calls": len(calls) if isinstance(calls, list) else 0,
    }
    return {
        "prompt_ids": list(prompt),
        "response_ids": list(response),
        "response_mask": list(mask),
        "response_logprobs": list(logprobs),
        "reward_score": reward if reward is not None else 0.0,
        "num_turns": _turns(result),
        "extra_fields": extra,
    }
