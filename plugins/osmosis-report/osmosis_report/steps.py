"""Reward by training step: a training run's rollouts grouped by the policy version that made them.

A trainer that drives ``osmosis serve`` tags each rollout with its ``policy_version``, the step of
the weights that sampled it (``"step-12"``, ``"12"``); the rollout's line in ``results.jsonl``
records it, and ``traces.jsonl`` records the version of each model call. Grouped by version, the
report's headline figures become a learning curve: mean reward (every graded rollout, a failure
counting as 0), pass rate, and how many rollouts each step holds, so a reward that rose, stalled or
rose only because failures stopped is told apart.

**Training order.** Numerically when every version is a number or holds one (``"step-2"`` before
``"step-10"``; every number in turn: ``"epoch-1-step-9"`` before ``"epoch-2-step-1"``, ``"v1.5"``
before ``"v2.0"``; versions with the same numbers keep the order they first appeared in), else the
order in which the versions first appear in ``results.jsonl``.

**Off-policy rollouts.** A rollout whose traced calls were served by another policy version than
its own (the weights changed while it ran, as in asynchronous training) is counted with its
off-policy calls: the importance-sampling correction a trainer applies to it is larger, and a step
made of many such rollouts learns from older weights than its number says.

>>> training_order({"step-10": 1, "step-2": 2, "step-1": 3})
['step-1', 'step-2', 'step-10']
>>> training_order({"warmup": 1, "final": 2})
['warmup', 'final']
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from osmosis_report.stats import Interval, mean_interval

if TYPE_CHECKING:
    from osmosis_report.load import RunData

__all__ = ["MAX_POINTS", "StepFigures", "bucketed", "step_figures", "training_order", "version_number"]

MAX_POINTS = 100
"""The most steps a chart draws one by one; past it, consecutive steps are merged into as many
spans (the table keeps every step)."""

_TRAILING = re.compile(r"(\d+)\s*$")


def version_number(version: str) -> float | None:
    """The number a version is or ends in (``"12"``, ``"step-12"``, ``"0.5"``), or None.

    >>> version_number("step-12"), version_number("3.5"), version_number("final")
    (12.0, 3.5, None)
    """
    try:
        value = float(version)
    except ValueError:
        found = _TRAILING.search(version)
        return float(found.group(1)) if found else None
    return value if math.isfinite(value) else None


_DIGITS = re.compile(r"\d+")


def _version_key(version: str) -> tuple[float, ...] | None:
    """What a version sorts by: its value when it is a number (``"0.5"``), else every number in it in
    turn (``"e2-s10"``: 2 then 10; ``"v1.5"``: 1 then 5), or None when it holds none."""
    try:
        value = float(version)
    except ValueError:
        numbers = tuple(float(n) for n in _DIGITS.findall(version))
        return numbers or None
    return (value,) if math.isfinite(value) else None


def training_order(first_seen: Mapping[str, int]) -> list[str]:
    """The versions in training order (see the module), from where each first appeared (a line number).

    >>> training_order({"e2-s1": 1, "e1-s2": 2, "e1-s1": 3, "e1-s10": 4})
    ['e1-s1', 'e1-s2', 'e1-s10', 'e2-s1']
    """
    keys = {version: _version_key(version) for version in first_seen}
    if all(key is not None for key in keys.values()):
        return sorted(first_seen, key=lambda v: (keys[v], first_seen[v]))
    return sorted(first_seen, key=lambda v: first_seen[v])


@attrs.define
class StepFigures:
    """The figures of one policy version (or of a span of consecutive ones: :func:`bucketed`)."""

    version: str | None
    """None: the rollouts that name no version."""
    rollouts: int = 0
    """Finished rollouts (cancelled ones are not counted, as the headline figures do not count them)."""
    failed: int = 0
    graded: int = 0
    """Failures and successes with a reward: what the mean reward and the pass rate count."""
    score_sum: float = 0.0
    """The sum of the graded rollouts' rewards, a failure as 0."""
    passed: int = 0
    rewarded: int = 0
    reward_sum: float = 0.0
    traced: int = 0
    """Rollouts with a trace (the token figures count these)."""
    generated: int = 0
    off_policy: int = 0
    """Rollouts with a traced call served by another policy version than their own."""
    off_policy_calls: int = 0
    interval: Interval | None = None
    """The mean reward's 95% interval over the step's rows (groups); None for a span of steps."""
    last: str | None = None
    """The span's last version (:func:`bucketed`); None for one step."""

    @property
    def label(self) -> str:
        if self.version is None:
            return "(no version)"
        return self.version if self.last is None else f"{self.version} \u2013 {self.last}"

    @property
    def mean_reward(self) -> float | None:
        """Over every graded rollout, a failure counting as 0 (the report's headline definition)."""
        return self.score_sum / self.graded if self.graded else None

    @property
    def mean_reward_graded(self) -> float | None:
        """Over the rollouts with a reward (failures left out)."""
        return self.reward_sum / self.rewarded if self.rewarded else None

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.graded if self.graded else None

    @property
    def mean_generated(self) -> float | None:
        """Generated tokens per traced rollout."""
        return self.generated / self.traced if self.traced else None

    def merged(self, other: StepFigures) -> StepFigures:
        """This span and the next step (or span) as one."""
        sums = {name: getattr(self, name) + getattr(other, name) for name in _SUMS}
        return StepFigures(self.version, **sums, last=other.last or other.version)


_SUMS = (
    "rollouts",
    "failed",
    "graded",
    "score_sum",
    "passed",
    "rewarded",
    "reward_sum",
    "traced",
    "generated",
    "off_policy",
    "off_policy_calls",
)
"""The figures a span adds up."""


def step_figures(run: RunData) -> list[StepFigures]:
    """One :class:`StepFigures` per policy version of ``run``, in training order, then one for the
    rollouts that name none (when some do not); empty when no rollout names a version."""
    if not run.versions:
        return []
    steps: dict[str | None, StepFigures] = {v: StepFigures(v) for v in run.versions}
    groups: dict[str | None, list[list[float]]] = {v: [] for v in run.versions}
    for row in run.rows.values():
        scores = row.scores()
        groups.setdefault(row.version, []).append(scores)
        for r in row.rollouts:
            if r.status == "cancelled":
                continue
            step = steps.get(r.version)
            if step is None:
                step = steps[r.version] = StepFigures(r.version)
            step.rollouts += 1
            step.failed += not r.ok
            if r.graded:
                step.graded += 1
                step.passed += bool(r.passed)
                step.score_sum += r.reward if r.ok and r.reward is not None else 0.0
            if r.ok and r.reward is not None:
                step.rewarded += 1
                step.reward_sum += r.reward
            if r.tokens is not None:
                step.traced += 1
                step.generated += r.tokens.generated
            if r.off_policy:
                step.off_policy += 1
                step.off_policy_calls += r.off_policy_calls
    if not any(step.rewarded for step in steps.values()):  # no reward anywhere (no grader): no mean, as
        for step in steps.values():  # the headline has none, and no pass rate of failures alone
            step.graded = step.passed = 0
            step.score_sum = 0.0
    for version, step in steps.items():
        step.interval = mean_interval(groups.get(version, [])) if step.graded else None
    return [step for step in steps.values() if step.rollouts]


def bucketed(steps: Sequence[StepFigures], most: int = MAX_POINTS) -> list[StepFigures]:
    """``steps`` (with a version) as at most ``most`` spans of consecutive steps, each as many steps
    as the others but the last (all of them one by one when they are ``most`` or fewer)."""
    versioned = [s for s in steps if s.version is not None]
    if len(versioned) <= most:
        return versioned
    size = math.ceil(len(versioned) / most)
    return [_merge(versioned[start : start + size]) for start in range(0, len(versioned), size)]


def _merge(span: Sequence[StepFigures]) -> StepFigures:
    merged = StepFigures(span[0].version, **{name: getattr(span[0], name) for name in _SUMS})
    for step in span[1:]:
        merged = merged.merged(step)
    return merged
