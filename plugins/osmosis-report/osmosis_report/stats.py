"""The statistics of a report: pass@k, the mean reward's confidence interval, the paired bootstrap.

Rows are the independent units of an evaluation (a row's samples share its prompt), so intervals
are taken over rows, not over rollouts.

>>> round(pass_at_k(n=4, c=1, k=2), 4)   # 1 - C(3,2)/C(4,2)
0.5
>>> pass_at_k(n=4, c=0, k=4), pass_at_k(n=4, c=4, k=1)
(0.0, 1.0)
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import attrs

__all__ = ["Interval", "mean_interval", "paired_bootstrap", "pass_at_k", "pass_at_k_curve"]

Z95 = 1.959963984540054
"""The 97.5% quantile of the standard normal distribution."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k for one row: ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021).

    The chance that at least one of ``k`` samples drawn without replacement from the row's ``n``
    (of which ``c`` passed) passes; computed as a product, so large ``n`` neither overflows nor loses
    precision.

    :raises ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def pass_at_k_curve(rows: Sequence[tuple[int, int]]) -> list[tuple[int, float, int]]:
    """``(k, pass@k, rows counted)`` for every ``k`` from 1 to the largest ``n``.

    :param rows: ``(n, c)`` per row: graded samples (failures count as not passing) and passing ones.
        A row with ``n < k`` is left out of pass@k (it cannot draw k samples); the third figure says
        how many rows each point averages.
    """
    most = max((n for n, _ in rows), default=0)
    curve = []
    for k in range(1, most + 1):
        values = [pass_at_k(n, c, k) for n, c in rows if n >= k]
        curve.append((k, sum(values) / len(values), len(values)))
    return curve


@attrs.frozen
class Interval:
    """An estimate with its 95% interval."""

    value: float
    low: float
    high: float
    n: int
    """The independent units it rests on (rows)."""

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def mean_interval(groups: Sequence[Sequence[float]]) -> Interval | None:
    """The mean of every value, with a 95% interval that treats each group (a row's samples) as one unit.

    The standard error is the cluster-robust one of a ratio estimator, ``sqrt(m/(m-1) *
    sum((s_i - mean * n_i)^2)) / N`` over the ``m`` groups (sums ``s_i``, sizes ``n_i``, ``N``
    values); with one value per group it is the usual ``sd / sqrt(N)``. The interval is kept within
    the values' range. None when there is no value.
    """
    groups = [g for g in groups if g]
    total = sum(len(g) for g in groups)
    if not total:
        return None
    mean = sum(sum(g) for g in groups) / total
    m = len(groups)
    if m < 2:
        return Interval(mean, mean, mean, m)
    spread = sum((sum(g) - mean * len(g)) ** 2 for g in groups)
    se = math.sqrt(m / (m - 1) * spread) / total
    lowest, highest = min(min(g) for g in groups), max(max(g) for g in groups)
    # a mean never leaves the range of its values (rewards in [0, 1] keep an interval in [0, 1])
    return Interval(mean, max(mean - Z95 * se, lowest), min(mean + Z95 * se, highest), m)


def paired_bootstrap(differences: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> Interval | None:
    """The mean of paired per-row differences with a percentile bootstrap 95% interval.

    Rows are drawn with replacement ``resamples`` times from a generator seeded with ``seed``, so
    the same runs always give the same interval. None when there is no pair.
    """
    m = len(differences)
    if not m:
        return None
    mean = sum(differences) / m
    if m < 2:
        return Interval(mean, mean, mean, m)
    rng = random.Random(seed)
    values = list(differences)
    means = sorted(math.fsum(rng.choices(values, k=m)) / m for _ in range(resamples))
    low = means[int(0.025 * (resamples - 1))]
    high = means[math.ceil(0.975 * (resamples - 1))]
    return Interval(mean, low, high, m)
