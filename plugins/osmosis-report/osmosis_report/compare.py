"""Comparing runs of one dataset: rows matched by position and prompt hash, per-row deltas, flips.

Rows are matched by their index *and* a hash of their prompt. A row whose prompts differ, or that
only some runs have, is reported as such and left out of every delta: never guessed.

A row *passes* when at least half of its graded samples pass (with one sample: when it passes).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from osmosis_report.load import Row, RunData
from osmosis_report.stats import Interval, paired_bootstrap

__all__ = ["Comparison", "Delta", "Mismatch", "compare", "match_rows", "row_passes"]


@attrs.frozen
class Mismatch:
    """A row index the runs do not agree on."""

    index: int
    hashes: tuple[str | None, ...]
    """Each run's prompt hash for the row (None: the run has no such row; "": its prompt is unknown)."""

    @property
    def reason(self) -> str:
        if any(h is None for h in self.hashes):
            return "missing in " + ", ".join(f"run {i + 1}" for i, h in enumerate(self.hashes) if h is None)
        if any(h == "" for h in self.hashes):
            return "prompt unknown in " + ", ".join(f"run {i + 1}" for i, h in enumerate(self.hashes) if h == "")
        return "different prompts"


@attrs.frozen
class Delta:
    """One run against the first (the baseline), over the matched rows."""

    reward: Interval | None
    """Mean over rows of (row mean reward here - row mean reward in the baseline), paired bootstrap 95%."""
    pass_rate: Interval | None
    """The same for the rows' pass rates (a failure counts as not passing)."""
    broke: list[int]
    """Rows that passed in the baseline and fail here."""
    fixed: list[int]
    """Rows that failed in the baseline and pass here."""
    reward_rows: int
    """Matched rows with a reward in both runs (the others are left out of ``reward``)."""


@attrs.frozen
class Comparison:
    """The runs side by side."""

    matched: list[int]
    mismatches: list[Mismatch]
    deltas: list[Delta]
    """One per run after the first."""


def row_passes(row: Row | None) -> bool | None:
    """Whether at least half of the row's graded samples pass (None: nothing graded)."""
    if row is None:
        return None
    n, c = row.counts()
    return None if n == 0 else c * 2 >= n


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def match_rows(runs: Sequence[RunData]) -> tuple[list[int], list[Mismatch]]:
    """Row indices every run has with the same prompt hash, and the indices they disagree on."""
    indices = sorted({i for run in runs for i in run.rows})
    matched, mismatches = [], []
    for index in indices:
        hashes = tuple(run.rows[index].hash if index in run.rows else None for run in runs)
        if all(h for h in hashes) and len(set(hashes)) == 1:
            matched.append(index)
        else:
            mismatches.append(Mismatch(index, hashes))
    return matched, mismatches


def compare(runs: Sequence[RunData], *, seed: int = 0, resamples: int = 2000) -> Comparison:
    """Match the rows of ``runs`` and measure each run after the first against the first."""
    matched, mismatches = match_rows(runs)
    base = runs[0]
    deltas = []
    for other in runs[1:]:
        rewards: list[float] = []
        passes: list[float] = []
        broke, fixed = [], []
        for index in matched:
            a, b = base.rows[index], other.rows[index]
            ma, mb = _mean(a.rewards()), _mean(b.rewards())
            if ma is not None and mb is not None:
                rewards.append(mb - ma)
            (na, ca), (nb, cb) = a.counts(), b.counts()
            if na and nb:
                passes.append(cb / nb - ca / na)
            pa, pb = row_passes(a), row_passes(b)
            if pa is True and pb is False:
                broke.append(index)
            elif pa is False and pb is True:
                fixed.append(index)
        deltas.append(
            Delta(
                paired_bootstrap(rewards, seed=seed, resamples=resamples),
                paired_bootstrap(passes, seed=seed, resamples=resamples),
                broke,
                fixed,
                len(rewards),
            )
        )
    return Comparison(matched, mismatches, deltas)
