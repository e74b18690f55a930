"""SkyRL's side of a batch, both ways: its sampling parameters as :class:`~osmosis_trainer.SamplingParams`,
and a batch of rollout results as its ``GeneratorOutput``. Pure functions: nothing here imports
SkyRL or torch (a ``GeneratorOutput`` is a plain dict at run time), so they are tested and timed
without them.

**The rows** (:func:`generator_output`), one list entry per row, in the batch's order:

* *one row per trajectory* (SkyRL's default, ``generator.step_wise_trajectories=false``): the
  rollout's token sequence stitched by exact prefix (:func:`osmosis_trainer.rollout_rows` with
  ``sequences="last"``): ``prompt_token_ids`` the first call's prompt, ``response_ids`` the rest
  (the generated turns and the tool tokens between them), ``loss_masks`` 1 on generated tokens,
  ``rollout_logprobs`` the sampling logprob of each (0.0 elsewhere), ``rewards`` the rollout's
  reward (one float per row). A rollout whose prefix broke cannot be one row: it is masked
  (``prefix_break``), never trained on as if it were whole;
* *step-wise* (``step_wise=True``, SkyRL's ``generator.step_wise_trajectories=true``): one row per
  stitched sequence, so a rollout that forked or broke its prefix gives several rows, contiguous,
  as SkyRL's Harbor integration emits them: ``is_last_step`` True on the trajectory's last row, the
  reward on that row and 0.0 on the others (SkyRL computes a step-wise trajectory's advantage from
  its last step and gives it to every step). Calls that extend each other are one row already
  (what SkyRL's ``merge_stepwise_output`` would make of one row per call), so nothing costs
  O(turns^2) tokens.

**A failed rollout is masked, never raised** (SkyRL #1613 aborted the whole step for one): failed,
removed, no trace, an incomplete trace, a broken prefix (one row per trajectory), no generated
token, or no reward. Its trajectory becomes one placeholder row as Harbor's integration writes it:
``[0]`` prompt and response, loss mask ``[0]``, logprob ``[0.0]``, stop reason ``"error"``.
SkyRL's group-relative estimators (GRPO, RLOO) count every row of a prompt, masked or not, so a
placeholder's reward would enter its group's statistics. ``failed_groups`` says what happens to
the other rollouts of that prompt:

``"mask_group"`` (the default, Harbor's rule)
    every rollout of the prompt is masked: nothing is learnt from a group whose statistics a
    failure of the machinery would distort;
``"mask"``
    only the failed rollout is masked, its placeholder reward the mean of its group's other
    rewards: the group's mean is unchanged (a reward of 0 would hand every other member a positive
    advantage for a failure), its sample standard deviation slightly lower (GRPO's advantages a
    little larger), and RLOO's leave-one-out baselines shift a little. What a large group with rare
    failures trades for keeping its samples.

``rollout_metrics`` says what happened: ``generate/num_masked_trajectories``,
``generate/num_masked_instances``, ``generate/num_error_trajectories`` and
``generate/num_timeout_trajectories`` (Harbor's names), ``osmosis/masked_<reason>`` per
trajectory reason, ``osmosis/rows``, ``osmosis/trained_tokens``, ``osmosis/truncated_rows``, and per
rollout ``osmosis/prefix_breaks``, ``osmosis/incomplete_rollouts`` and ``osmosis/delivered_fraction``
(the mean share of its generated tokens the rows train on: 0.0 for a masked one).

>>> from osmosis_trainer import RolloutResult
>>> trace = {"rollout_id": "a", "calls": [
...     {"call_id": "c0", "index": 0, "prompt_token_ids": [1, 2], "completion_token_ids": [3],
...      "logprobs": [-0.5], "finish_reason": "tool_calls"},
...     {"call_id": "c1", "index": 1, "prompt_token_ids": [1, 2, 3, 9], "completion_token_ids": [4],
...      "logprobs": [-0.25], "finish_reason": "stop"}]}
>>> good = RolloutResult.from_json({"rollout_id": "a", "status": "success", "reward": 1.0, "trace": trace})
>>> failed = RolloutResult.from_json({"rollout_id": "b", "status": "failure",
...     "error": {"category": "policy_error", "message": "HTTP 500"}})
>>> out = generator_output([good, failed], [("p0", 0), ("p1", 0)])
>>> out["prompt_token_ids"], out["response_ids"], out["loss_masks"], out["rollout_logprobs"]
([[1, 2], [0]], [[3, 9, 4], [0]], [[1, 0, 1], [0]], [[-0.5, 0.0, -0.25], [0.0]])
>>> out["rewards"], out["stop_reasons"], out["rollout_metrics"]["generate/num_error_trajectories"]
([1.0, 0.0], ['stop', 'error'], 1)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from osmosis_trainer.rows import MASK_REASONS, SequenceRow, rollout_rows
from osmosis_trainer.sampling import SamplingParams, sampling_from_trainer

if TYPE_CHECKING:
    from osmosis_trainer.client import RolloutResult

__all__ = [
    "FAILED_GROUPS",
    "TRAJECTORY_MASK_REASONS",
    "FailedGroups",
    "default_label",
    "generator_output",
    "instance_of",
    "sampling_from_skyrl",
    "step_version",
]

logger = logging.getLogger("osmosis_trainer.skyrl")

FailedGroups = Literal["mask_group", "mask"]
"""What a masked rollout does to the other rollouts of its prompt (see the module docstring)."""
FAILED_GROUPS: Final[tuple[FailedGroups, ...]] = ("mask_group", "mask")

TRAJECTORY_MASK_REASONS: Final = (*MASK_REASONS, "group_masked")
"""Why a trajectory is a placeholder: a row's reason (:data:`osmosis_trainer.rows.MASK_REASONS`;
``no_reward``: it succeeded without a finite reward, not graded, or NaN), or ``group_masked`` (it
was fine, but another rollout of its prompt was masked and ``failed_groups="mask_group"``)."""

PLACEHOLDER_STOP: Final = "error"
"""The stop reason of a placeholder row (Harbor's)."""

_STOPPED: Final = frozenset({"stop", "tool_calls", "function_call"})
"""Finish reasons that mean the model ended its answer itself (OpenAI calls an answer that ends
in tool calls ``tool_calls``): SkyRL's ``"stop"``."""

_SILENT: Final = frozenset({"logprobs", "skip_special_tokens", "include_stop_str_in_output"})
"""SkyRL's vLLM settings that are not sampling settings of a rollout: the gateway asks for the
logprobs itself, and the other two shape the text only (the trace keeps token ids)."""


def instance_of(trajectory_id: Any) -> str:
    """The prompt a SkyRL trajectory id belongs to: ``TrajectoryID.instance_id``, or the first item
    of an ``(instance_id, repetition_id)`` pair. :raises TypeError: neither."""
    instance = getattr(trajectory_id, "instance_id", None)
    if instance is None and isinstance(trajectory_id, tuple) and len(trajectory_id) == 2:
        instance = trajectory_id[0]
    if instance is None:
        raise TypeError(f"not a trajectory id (no instance_id): {trajectory_id!r}")
    return str(instance)


def default_label(extras: Mapping[str, Any] | None) -> Any:
    """The label a trajectory's rollout is graded against, from its ``env_extras`` (the dataset
    row's other columns): ``label``, else ``reward_spec.ground_truth`` (SkyRL's dataset convention),
    else None (not graded).

    >>> default_label({"reward_spec": {"method": "rule", "ground_truth": "42"}}), default_label({"label": 7})
    ('42', 7)
    """
    if not extras:
        return None
    if "label" in extras:
        return extras["label"]
    spec = extras.get("reward_spec")
    return spec.get("ground_truth") if isinstance(spec, Mapping) else None


def step_version(input_batch: Mapping[str, Any]) -> str | None:
    """The policy version a batch's rollouts record: ``step-<global_step>`` from its
    ``batch_metadata`` (the weights SkyRL synced for that step), else None."""
    metadata = input_batch.get("batch_metadata")
    step = getattr(metadata, "global_step", None)
    return None if step is None else f"step-{step}"


def _neutral_min_tokens(key: str, value: Any) -> bool:
    """SkyRL's default ``min_tokens`` of 1 only forbids an empty answer (0 is off)."""
    return key == "min_tokens" and not isinstance(value, bool) and value in (0, 1)


def sampling_from_skyrl(params: Mapping[str, Any] | None) -> tuple[SamplingParams | None, tuple[str, ...]]:
    """SkyRL's ``GeneratorInput["sampling_params"]`` (vLLM's names, as SkyRL's
    ``get_sampling_params_for_backend`` writes them, or its config's ``max_generate_length``) as the
    rollouts' :class:`~osmosis_trainer.SamplingParams`, and the keys left out.

    Left out without a word: ``logprobs``, ``skip_special_tokens``, ``include_stop_str_in_output``
    (not sampling settings of a rollout) and ``min_tokens`` of 0 or 1 (SkyRL's default 1 only
    forbids an empty answer). Every other key osmosis serve cannot apply (``min_tokens`` > 1,
    ``stop_token_ids``, an ``additional_kwargs`` entry) is returned, for the caller to warn about.

    >>> sampling_from_skyrl({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "max_tokens": 512,
    ...                      "logprobs": 1, "min_tokens": 1, "stop": None, "stop_token_ids": [7]})
    (SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, max_tokens=512), ('stop_token_ids',))

    :raises ValueError, TypeError: a value out of range or of the wrong type (the message names it).
    """
    return sampling_from_trainer(
        params, renames={"max_generate_length": "max_tokens"}, silent=_SILENT, neutral=_neutral_min_tokens
    )


def _stop_reason(finish: Any) -> str:
    if finish is None:
        return "unknown"
    text = str(finish)
    return "stop" if text in _STOPPED else text


@attrs.define
class _Trajectory:
    """One rollout on its way to rows: what to emit, or why it is a placeholder."""

    result: RolloutResult
    instance: str
    rows: list[SequenceRow]
    all_rows: list[SequenceRow]
    stops: list[str]
    reward: float
    reason: str | None = None
    detail: str | None = None


def _trajectory(
    result: RolloutResult, instance: str, *, step_wise: bool, max_response_tokens: int | None
) -> _Trajectory:
    rows = rollout_rows(result, sequences="all" if step_wise else "last", max_completion_tokens=max_response_tokens)
    finish: dict[str, Any] = {}
    if result.trace is not None:
        for call in result.trace.get("calls") or ():
            if isinstance(call, dict):
                finish[str(call.get("call_id"))] = call.get("finish_reason")
    kept = [row for row in rows if not row.masked]
    stops = ["length" if row.truncated else _stop_reason(finish.get(row.call_ids[-1])) for row in kept]
    whole = next((row for row in rows if row.masked and row.mask_reason != "no_tokens"), None)
    trajectory = _Trajectory(result, instance, kept, rows, stops, 0.0)
    if whole is not None:  # the rollout's own reason (failed, no trace, ...): every row has it
        trajectory.reason, trajectory.detail = whole.mask_reason, whole.mask_detail
    elif not kept:
        trajectory.reason, trajectory.detail = "no_tokens", rows[0].mask_detail
    elif result.reward is None or not math.isfinite(result.reward):
        trajectory.reason = "no_reward"
        trajectory.detail = "the rollout succeeded without a reward (graded?)" if result.reward is None else "NaN"
    else:
        trajectory.reward = float(result.reward)
    return trajectory


def generator_output(
    results: Sequence[RolloutResult],
    trajectory_ids: Sequence[Any],
    *,
    step_wise: bool = False,
    failed_groups: FailedGroups = "mask_group",
    overlong_filtering: bool = False,
    zero_reward_on_non_stop: bool = False,
    max_response_tokens: int | None = None,
) -> dict[str, Any]:
    """SkyRL's ``GeneratorOutput`` of ``results`` (see the module docstring for the rows and masks).

    :param results: one final result per trajectory, in the batch's order (``order_results``).
    :param trajectory_ids: SkyRL's ``TrajectoryID`` of each (or ``(instance_id, repetition_id)``
        pairs); a prompt's rollouts share an ``instance_id``.
    :param step_wise: one row per stitched sequence with ``is_last_step`` (SkyRL's
        ``generator.step_wise_trajectories``); else one row per trajectory.
    :param failed_groups: ``"mask_group"`` or ``"mask"`` (the module docstring).
    :param overlong_filtering: SkyRL's ``generator.apply_overlong_filtering``: a trajectory whose last
        answer was cut at the length cap (stop reason ``"length"``) keeps its reward and rows, with
        loss masks of zeros (DAPO).
    :param zero_reward_on_non_stop: SkyRL's ``generator.zero_reward_on_non_stop``: reward 0.0 for a
        trajectory whose last answer did not stop of itself.
    :param max_response_tokens: cut each response to this many tokens (stop reason ``"length"``).
    :raises ValueError: the lengths differ, or ``failed_groups`` is unknown (a malformed trace is a
        masked ``incomplete_trace`` placeholder, never an error).
    """
    if len(results) != len(trajectory_ids):
        raise ValueError(f"{len(results)} results for {len(trajectory_ids)} trajectory ids")
    if failed_groups not in FAILED_GROUPS:
        raise ValueError(f"failed_groups must be one of {', '.join(FAILED_GROUPS)}, got {failed_groups!r}")
    trajectories = [
        _trajectory(result, instance_of(tid), step_wise=step_wise, max_response_tokens=max_response_tokens)
        for result, tid in zip(results, trajectory_ids, strict=True)
    ]
    for trajectory in trajectories:
        if trajectory.reason is None:
            stop = trajectory.stops[-1]
            if zero_reward_on_non_stop and stop != "stop":
                trajectory.reward = 0.0
            if overlong_filtering and stop == "length":
                trajectory.rows = [
                    attrs.evolve(row, completion_mask=[0] * len(row.completion_mask)) for row in trajectory.rows
                ]
    masked_instances = _mask_groups(trajectories, failed_groups)
    out: dict[str, list[Any]] = {
        key: []
        for key in ("prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons", "rollout_logprobs")
    }
    out_ids: list[Any] = []
    last_step: list[bool] = []
    for trajectory, tid in zip(trajectories, trajectory_ids, strict=True):
        if trajectory.reason is not None:
            _emit(out, [0], [0], trajectory.reward, [0], PLACEHOLDER_STOP, [0.0])
            out_ids.append(tid)
            last_step.append(True)
            continue
        for index, (row, stop) in enumerate(zip(trajectory.rows, trajectory.stops, strict=True)):
            last = index == len(trajectory.rows) - 1
            reward = trajectory.reward if last else 0.0
            _emit(out, row.prompt_ids, row.completion_ids, reward, row.completion_mask, stop, row.completion_logprobs)
            out_ids.append(tid)
            last_step.append(last)
    return {
        **out,
        "rollout_metrics": _metrics(trajectories, masked_instances, out),
        "trajectory_ids": out_ids if step_wise else list(trajectory_ids),
        "is_last_step": last_step if step_wise else None,
    }


def _emit(
    out: dict[str, list[Any]],
    prompt: list[int],
    response: list[int],
    reward: float,
    mask: list[int],
    stop: str,
    logprobs: list[float],
) -> None:
    out["prompt_token_ids"].append(prompt)
    out["response_ids"].append(response)
    out["rewards"].append(reward)
    out["loss_masks"].append(mask)
    out["stop_reasons"].append(stop)
    out["rollout_logprobs"].append(logprobs)


def _mask_groups(trajectories: list[_Trajectory], failed_groups: FailedGroups) -> set[str]:
    """Apply ``failed_groups`` to the prompts with a masked rollout (returned), and log each masked one."""
    groups: dict[str, list[_Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.instance, []).append(trajectory)
    masked_instances = {instance for instance, group in groups.items() if any(t.reason for t in group)}
    for instance in sorted(masked_instances):
        group = groups[instance]
        culprits = [t for t in group if t.reason is not None]
        for trajectory in culprits:
            logger.warning(
                "rollout %s (prompt %s) masked: %s%s",
                trajectory.result.rollout_id,
                instance,
                trajectory.reason,
                f" ({trajectory.detail})" if trajectory.detail else "",
            )
        if failed_groups == "mask_group":
            first = culprits[0]
            for trajectory in group:
                if trajectory.reason is None:
                    trajectory.reason = "group_masked"
                    trajectory.detail = f"rollout {first.result.rollout_id} of its prompt was masked ({first.reason})"
                trajectory.reward = 0.0
        else:
            kept = [t.reward for t in group if t.reason is None]
            mean = math.fsum(kept) / len(kept) if kept else 0.0
            for trajectory in culprits:
                trajectory.reward = mean
    return masked_instances


def _metrics(trajectories: list[_Trajectory], masked_instances: set[str], out: dict[str, list[Any]]) -> dict[str, Any]:
    reasons = dict.fromkeys(TRAJECTORY_MASK_REASONS, 0)
    errors = timeouts = 0
    for trajectory in trajectories:
        if trajectory.reason is not None:
            reasons[trajectory.reason] += 1
        error = trajectory.result.error
        if trajectory.reason == "failed" and error is not None and error.category == "timeout":
            timeouts += 1
        elif trajectory.reason == "failed":
            errors += 1
    firsts = [trajectory.all_rows[0] for trajectory in trajectories]
    delivered = [0.0 if t.reason is not None else t.rows[0].delivered_fraction for t in trajectories]
    return {
        "generate/num_masked_trajectories": sum(reasons.values()),
        "generate/num_masked_instances": len(masked_instances),
        "generate/num_error_trajectories": errors,
        "generate/num_timeout_trajectories": timeouts,
        **{f"osmosis/masked_{reason}": count for reason, count in reasons.items()},
        "osmosis/rows": len(out["response_ids"]),
        "osmosis/trained_tokens": sum(sum(mask) for mask in out["loss_masks"]),
        "osmosis/truncated_rows": sum(row.truncated for t in trajectories if t.reason is None for row in t.rows),
        "osmosis/prefix_breaks": sum(row.prefix_breaks for row in firsts),
        "osmosis/incomplete_rollouts": sum(not row.complete for row in firsts),
        "osmosis/delivered_fraction": math.fsum(delivered) / len(delivered) if delivered else 1.0,
    }
