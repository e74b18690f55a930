"""pass@k against its closed form, the mean's interval, and the seeded paired bootstrap."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from osmosis_report.stats import mean_interval, paired_bootstrap, pass_at_k, pass_at_k_curve


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_is_the_closed_form_for_every_small_case(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            closed = 1 - math.comb(n - c, k) / math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12), (n, c, k)


def test_pass_at_k_is_the_chance_that_some_drawn_sample_passes():
    # brute force: every k-subset of 3 passing and 3 failing samples
    samples = [1, 1, 1, 0, 0, 0]
    for k in range(1, 7):
        subsets = list(itertools.combinations(samples, k))
        assert pass_at_k(6, 3, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_k_refuses_impossible_counts_and_stays_exact_for_large_n():
    with pytest.raises(ValueError, match="n=2, c=3"):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError, match="n=4, c=1, k=5"):
        pass_at_k(4, 1, 5)
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert pass_at_k(1000, 500, 10) == pytest.approx(1 - math.comb(500, 10) / math.comb(1000, 10))


def test_the_curve_averages_the_rows_that_can_draw_k_samples():
    curve = pass_at_k_curve([(2, 1), (2, 0), (1, 1)])
    assert curve[0] == (1, pytest.approx((0.5 + 0 + 1) / 3), 3)
    assert curve[1] == (2, pytest.approx((1.0 + 0) / 2), 2)


def test_the_mean_interval_with_one_value_per_row_is_the_normal_one():
    values = [0.0, 1.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.75]
    interval = mean_interval([[v] for v in values])
    assert interval is not None
    half = 1.959963984540054 * statistics.stdev(values) / math.sqrt(len(values))
    assert interval.value == pytest.approx(statistics.mean(values))
    assert interval.low == pytest.approx(statistics.mean(values) - half)
    assert interval.high == pytest.approx(statistics.mean(values) + half)
    assert interval.n == 8


def test_the_mean_interval_counts_rows_not_samples_and_stays_in_range():
    # two rows, one always right, one always wrong: 8 samples each, but only 2 independent units
    interval = mean_interval([[1.0] * 8, [0.0] * 8])
    assert interval is not None
    assert interval.n == 2
    assert (interval.low, interval.high) == (0.0, 1.0)
    assert mean_interval([]) is None
    assert mean_interval([[], []]) is None


def test_the_paired_bootstrap_is_seeded_and_brackets_the_mean():
    diffs = [0.0, 1.0, 0.0, 0.0, -1.0, 1.0, 0.5, 0.0, 1.0, 0.0]
    first = paired_bootstrap(diffs, seed=7)
    assert first == paired_bootstrap(diffs, seed=7)
    assert first is not None
    assert first.low < first.value < first.high
    assert first.value == pytest.approx(0.25)
    # the percentile interval of the resampled means is about the normal one for a sample this size
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    assert first.high - first.low == pytest.approx(2 * 1.96 * se, rel=0.25)
    assert paired_bootstrap([]) is None
    assert paired_bootstrap([0.5]).low == 0.5
