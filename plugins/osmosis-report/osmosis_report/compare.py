"""Comparing runs of one dataset: each run's rows matched with the baseline's by position and
prompt hash, per-row deltas, flips.

Each run after the first is matched with the first (the baseline) on its own: a row is matched
when both runs have it at the same index with the same prompt hash. A row whose prompts differ, or
that only one of the two has, is reported as such and left out of that run's deltas: never
guessed. A run that stopped early shortens its own comparison, not the others'.

Every figure of a run's delta counts the same rows: the matched rows with a graded rollout in both
runs (a failed rollout counts as reward 0 and as not passing, as the headline figures count it).

A row *passes* when at least half of its graded samples pass (with one sample: when it passes).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from osmosis_report.load import Row, RunData
from osmosis_report.stats import Interval, paired_bootstrap

__all__ = ["Comparison", "Delta", "Mismatch", "compare", "match_pair", "match_rows", "row_passes"]


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
    """One run against the first (the baseline), over the rows the two share."""

    reward: Interval | None
    """Mean over ``rows`` of (row mean reward here - in the baseline), a failure counting as 0; paired bootstrap 95%."""
    pass_rate: Interval | None
    """The same for the rows' pass rates (a failure counts as not passing), over the same ``rows``."""
    broke: list[int]
    """Rows that passed in the baseline and fail here."""
    fixed: list[int]
    """Rows that failed in the baseline and pass here."""
    reward_rows: int
    """How many rows every figure of the delta counts (``len(rows)``)."""
    matched: list[int] = attrs.field(factory=list)
    """Rows this run and the baseline both have, with the same prompt."""
    mismatches: list[Mismatch] = attrs.field(factory=list)
    """Rows only one of the two has, or whose prompts differ (hashes: the baseline's, this run's)."""
    rows: list[int] = attrs.field(factory=list)
    """The matched rows with a graded rollout in both runs: what ``reward``, ``pass_rate``,
    ``broke``, ``fixed`` and ``means`` all count."""
    means: tuple[float, float] | None = None
    """(baseline, this run): the mean over ``rows`` of each row's mean reward (a failure counting as 0)."""
    pass_rates: tuple[float, float] | None = None
    """(baseline, this run): the mean over ``rows`` of each row's pass rate."""


@attrs.frozen
class Comparison:
    """The runs side by side."""

    matched: list[int]
    """Rows every run matches with the baseline (the deltas each count their own: see :class:`Delta`)."""
    mismatches: list[Mismatch]
    """Rows some run does not match with the baseline, with every run's prompt hash."""
    deltas: list[Delta]
    """One per run after the first."""
    rows: list[int] = attrs.field(factory=list)
    """Every row index any run has (the row table's)."""


def row_passes(row: Row | None) -> bool | None:
    """Whether at least half of the row's graded samples pass (None: nothing graded)."""
    if row is None:
        return None
    n, c = row.counts()
    return None if n == 0 else c * 2 >= n


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _hashes(runs: Sequence[RunData], index: int) -> tuple[str | None, ...]:
    return tuple(run.rows[index].hash if index in run.rows else None for run in runs)


def match_rows(runs: Sequence[RunData]) -> tuple[list[int], list[Mismatch]]:
    """Row indices every run has with the same prompt hash, and the indices they disagree on."""
    indices = sorted({i for run in runs for i in run.rows})
    matched, mismatches = [], []
    for index in indices:
        hashes = _hashes(runs, index)
        if all(h for h in hashes) and len(set(hashes)) == 1:
            matched.append(index)
        else:
            mismatches.append(Mismatch(index, hashes))
    return matched, mismatches


def match_pair(base: RunData, other: RunData) -> tuple[list[int], list[Mismatch]]:
    """The rows ``other`` shares with ``base`` (same index, same prompt hash), and those it does not."""
    return match_rows([base, other])


def compare(runs: Sequence[RunData], *, seed: int = 0, resamples: int = 2000) -> Comparison:
    """Match each run after the first with the first, and measure it against the first over the
    rows the two share (see the module)."""
    matched, mismatches = match_rows(runs)
    base = runs[0]
    deltas = []
    for other in runs[1:]:
        pair, missed = match_pair(base, other)
        rewards: list[float] = []
        passes: list[float] = []
        means: list[tuple[float, float]] = []
        rates: list[tuple[float, float]] = []
        broke, fixed, counted = [], [], []
        for index in pair:
            a, b = base.rows[index], other.rows[index]
            (na, ca), (nb, cb) = a.counts(), b.counts()
            ma, mb = _mean(a.scores()), _mean(b.scores())
            if not (na and nb) or ma is None or mb is None:
                continue  # nothing graded in one of the two: no figure counts the row
            counted.append(index)
            rewards.append(mb - ma)
            passes.append(cb / nb - ca / na)
            means.append((ma, mb))
            rates.append((ca / na, cb / nb))
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
                len(counted),
                matched=pair,
                mismatches=missed,
                rows=counted,
                means=_column_means(means),
                pass_rates=_column_means(rates),
            )
        )
    rows = sorted({i for run in runs for i in run.rows})
    return Comparison(matched, mismatches, deltas, rows)


def _column_means(pairs: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    if not pairs:
        return None
    return sum(a for a, _ in pairs) / len(pairs), sum(b for _, b in pairs) / len(pairs)
