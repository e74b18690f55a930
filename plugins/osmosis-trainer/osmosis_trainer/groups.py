"""Groups: the ``n`` rollouts of one prompt that a GRPO-style trainer compares with each other.

Trainers hand prompts over already repeated: TRL's ``RepeatSampler`` gives each prompt
``num_generations`` times in a row (16 rows for 4 prompts x 4), SkyRL's generator input likewise,
and they want one answer per row, in the same order. :func:`prompt_groups` says which group and
sample each row is (checking the repetition), :func:`order_results` puts results that came back in
completion order (``RolloutClient.run_many``) into the rows' order, and :func:`group_advantages`
computes group-relative advantages ``(r - mean) / (std + eps)``.

**Failed and masked rollouts.** A rollout that failed, whose reward is missing, or whose row is
masked (an incomplete trace, a broken prefix: see :mod:`osmosis_trainer.rows`) is *excluded* from
its group: it has no advantage (``None``), and the group's mean and standard deviation are taken
over the others. It is never counted as a reward of 0, which would pull its group's mean down and
hand every other member a positive advantage for a failure of the machinery, not of the policy. A
group with one included rollout gives it advantage 0.0 (nothing to compare with); a group with none
gives no advantage at all. The standard deviation is the sample one (``n - 1``, as TRL and verl
compute it with ``torch.std``); with fewer than two included rollouts it is 0.

>>> prompt_groups(["a", "a", "b", "b"], 2)
[(0, 0), (0, 1), (1, 0), (1, 1)]
>>> group_advantages([1.0, 0.0, None, 1.0], 2)       # the second group: one failed, one included
[0.7070..., -0.7070..., None, 0.0]
>>> group_advantages([1.0, 0.0, 1.0, 1.0], 2, mask=[True, True, False, True], scale="none")
[0.5, -0.5, None, 0.0]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol, TypeVar

import attrs

__all__ = ["GroupStats", "group_advantages", "group_stats", "order_results", "prompt_groups", "repeat_prompts"]

T = TypeVar("T")
Scale = Literal["group", "batch", "none"]
"""What the advantage is divided by: its group's standard deviation (GRPO), the whole batch's
(as TRL's ``scale_rewards="batch"``), or nothing (Dr. GRPO: ``r - mean``)."""


class _HasRolloutId(Protocol):
    @property
    def rollout_id(self) -> str: ...


R = TypeVar("R", bound=_HasRolloutId)


def repeat_prompts(prompts: Iterable[T], num_generations: int) -> list[T]:
    """Each prompt ``num_generations`` times in a row, as trainers hand them over.

    >>> repeat_prompts(["a", "b"], 3)
    ['a', 'a', 'a', 'b', 'b', 'b']
    """
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    return [prompt for prompt in prompts for _ in range(num_generations)]


def prompt_groups(
    rows: Sequence[Any], num_generations: int, *, check: bool = True, offset: int = 0
) -> list[tuple[int, int]]:
    """``(group, sample)`` of each row of rows repeated per prompt (``num_generations`` in a row).

    :param check: also check that the rows of each group are equal (the same prompt), which catches
        a ``num_generations`` that is not the trainer's.
    :param offset: where ``rows`` start in the whole batch, when they are one process's slice of it
        (process ``i`` of a data-parallel trainer holds rows ``i * len(rows)`` onwards): a group may
        then begin or end in another process, and rows are numbered where they stand in the batch.
    :raises ValueError: the row count is not a multiple of ``num_generations`` (without ``offset``),
        or (``check``) a row differs from the first of its group held here (the message names both).

    >>> prompt_groups(["a", "a", "b", "b"], 2)
    [(0, 0), (0, 1), (1, 0), (1, 1)]
    >>> prompt_groups(["a", "b", "b", "b"], 3, offset=2)  # rows 2 to 5 of a batch of two groups of 3
    [(0, 2), (1, 0), (1, 1), (1, 2)]
    """
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if not offset and len(rows) % num_generations:
        raise ValueError(
            f"{len(rows)} rows are not whole groups of num_generations={num_generations} "
            "(trainers hand each prompt num_generations times in a row)"
        )
    slots = [((offset + index) // num_generations, (offset + index) % num_generations) for index in range(len(rows))]
    if check:
        for index, (group, _) in enumerate(slots):
            first = max(group * num_generations - offset, 0)
            if index != first and rows[index] != rows[first]:
                raise ValueError(
                    f"row {index} differs from row {first}, the first of its group: rows are expected as each "
                    f"prompt num_generations={num_generations} times in a row"
                )
    return slots


def order_results(requests: Sequence[_HasRolloutId], results: Iterable[R]) -> list[R]:
    """``results`` (in any order, e.g. completion order) in the order of ``requests``, by rollout id.

    :raises ValueError: a request without its result, a result no request asked for, or two results
        for one rollout id (each named).
    """
    found: dict[str, R] = {}
    for result in results:
        if result.rollout_id in found:
            raise ValueError(f"two results for rollout {result.rollout_id!r}")
        found[result.rollout_id] = result
    ordered: list[R] = []
    for request in requests:
        match = found.pop(request.rollout_id, None)
        if match is None:
            raise ValueError(f"no result for rollout {request.rollout_id!r}")
        ordered.append(match)
    if found:
        raise ValueError(f"results for rollouts no request asked for: {sorted(found)[:5]}")
    return ordered


@attrs.frozen
class GroupStats:
    """One group's rewards: how many were included, their mean and standard deviation."""

    included: int
    """Rollouts with a reward and not masked (the ones the statistics are over)."""
    excluded: int
    """Rollouts left out: failed, no reward, or masked."""
    mean: float | None
    """None when no rollout was included."""
    std: float
    """The sample standard deviation (``n - 1``); 0.0 with fewer than two included."""


def _included(rewards: Sequence[float | None], mask: Sequence[bool] | None) -> list[float | None]:
    if mask is not None and len(mask) != len(rewards):
        raise ValueError(f"mask has {len(mask)} entries for {len(rewards)} rewards")
    kept: list[float | None] = []
    for index, reward in enumerate(rewards):
        if reward is None or (mask is not None and not mask[index]):
            kept.append(None)
        elif isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"reward {index} is not a finite number: {reward!r}")
        else:
            kept.append(float(reward))
    return kept


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _stats(values: Sequence[float | None]) -> GroupStats:
    present = [v for v in values if v is not None]
    mean = math.fsum(present) / len(present) if present else None
    return GroupStats(included=len(present), excluded=len(values) - len(present), mean=mean, std=_std(present))


def group_stats(
    rewards: Sequence[float | None], group_size: int, *, mask: Sequence[bool] | None = None
) -> list[GroupStats]:
    """The statistics of each group of ``group_size`` consecutive rewards (see the module docstring).

    :param mask: False for a row to leave out (a masked row); a None reward is left out too.
    :raises ValueError: the rewards are not whole groups, a reward is not a finite number, or the
        mask's length differs.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards are not whole groups of {group_size}")
    kept = _included(rewards, mask)
    return [_stats(kept[start : start + group_size]) for start in range(0, len(kept), group_size)]


def group_advantages(
    rewards: Sequence[float | None],
    group_size: int,
    *,
    mask: Sequence[bool] | None = None,
    scale: Scale = "group",
    eps: float = 1e-4,
) -> list[float | None]:
    """Group-relative advantages of consecutive groups of ``group_size`` rewards.

    ``(r - mean) / (std + eps)`` with the mean and std of the included rewards of the row's group
    (``scale="group"``), ``/ (batch std + eps)`` (``"batch"``: the std of every included reward), or
    ``r - mean`` (``"none"``). A row left out (a None reward, or False in ``mask``) gets None; the
    rule for failures is in the module docstring.

    :raises ValueError: as :func:`group_stats`.
    """
    stats = group_stats(rewards, group_size, mask=mask)
    kept = _included(rewards, mask)
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    spread = _std([v for v in kept if v is not None]) if scale == "batch" else 0.0
    advantages: list[float | None] = []
    for index, reward in enumerate(kept):
        group = stats[index // group_size]
        if reward is None or group.mean is None:
            advantages.append(None)
        elif group.included < 2:
            advantages.append(0.0)
        elif scale == "none":
            advantages.append(reward - group.mean)
        else:
            advantages.append((reward - group.mean) / ((group.std if scale == "group" else spread) + eps))
    return advantages
