"""The plots' geometry: axes that reach the data, rule labels apart, titles that say what is counted, units."""

from __future__ import annotations

import itertools
import re

import pytest

from osmosis_report import charts


def reaches(chart: charts.Chart, tallest: float) -> None:
    """The y axis's last tick is at or above the tallest value, and no mark leaves the plot's top."""
    top_tick = max(float(label.rstrip("k")) * (1000 if label.endswith("k") else 1) for _, label in chart.y_ticks)
    assert top_tick >= tallest, (chart.title, [t for _, t in chart.y_ticks], tallest)
    assert chart.y_max >= tallest
    for mark in chart.marks:
        if mark.kind in ("rect", "dot"):
            assert mark.y >= chart.top - 1e-6, (chart.title, mark)


@pytest.mark.parametrize("counts", [[35, 33], [379], [1], [7, 3], [101, 99], [999], [12_345]])
def test_the_y_axis_reaches_the_tallest_bar(counts):
    # 35 and 33 were drawn as high as 30, and 379 errors at 300: the axis stopped at the last round tick below
    reaches(charts.bars("errors", [(f"c{i}", [n]) for i, n in enumerate(counts)], [("workflow", "s0")]), max(counts))
    runs = [(f"run {i}", "s0") for i in range(len(counts))]
    reaches(charts.bars("by run", [("timeout", counts)], runs, grouped=True), max(counts))


def test_the_y_axis_reaches_the_data_on_every_kind_of_chart():
    for n in range(1, 420):
        reaches(charts.bars("b", [("a", [n]), ("b", [max(n - 3, 1)])], [("s", "s0")]), n)
    reaches(charts.histogram("h", [("r", "s0", [1.0] * 35 + [0.0] * 33)]), 35)
    reaches(charts.histogram("h", [("a", "s0", [1.0] * 20), ("b", "s1", [1.0] * 15)]), 35)  # stacked: 35
    side = charts.histogram("h", [("a", "s0", [1.0] * 20), ("b", "s1", [1.0] * 15)], stacked=False)
    reaches(side, 20)
    reaches(charts.histogram("h", [("x", "s0", [i / 7 for i in range(379)] + [0.01] * 300)]), 300)
    reaches(charts.timeline("t", [100.0] * 37 + [101.0], [100.0] * 5), 42)  # stacked in one bucket
    reaches(charts.lines("l", [("v", "s0", [(1, 0.5), (2, 1.7)])], y_max=1.0), 1.7)


def test_the_comparison_histogram_puts_the_runs_side_by_side():
    chart = charts.histogram(
        "Reward distribution, side by side",
        [("1. base", "s0", [0.0] * 5 + [1.0] * 30), ("2. step", "s1", [0.0] * 9 + [1.0] * 26)],
        x_label="reward",
        stacked=False,
    )
    rects = [m for m in chart.marks if m.kind == "rect"]
    assert len(rects) == 4
    for a, b in zip(rects[::2], rects[1::2], strict=True):  # one bin: the two runs' bars
        assert a.x + a.w <= b.x  # next to each other, not on top of each other
        assert a.y + a.h == pytest.approx(chart.bottom)
        assert b.y + b.h == pytest.approx(chart.bottom)
    assert [m.title for m in rects] == [
        "reward 0: 5 rollouts (1. base)",
        "reward 0: 9 rollouts (2. step)",
        "reward 1: 30 rollouts (1. base)",
        "reward 1: 26 rollouts (2. step)",
    ]


def label_boxes(chart: charts.Chart) -> list[tuple[float, float, float]]:
    """(left, right, baseline) of each rule label, its width estimated as the chart estimates it."""
    out = []
    for m in chart.marks:
        if m.kind == "rule":
            width = charts.CHAR_WIDTH * len(m.label)
            left = m.x + 3 if m.anchor == "start" else m.x - 3 - width
            out.append((left, left + width, m.y))
    return out


def test_rule_labels_that_would_collide_are_set_apart_and_stay_inside():
    values = [0.010 + 0.001 * i for i in range(200)]
    rules = [("p50", 0.11), ("p95", 0.2), ("p99", 0.205)]
    chart = charts.histogram("Latency", [("ok", "ok", values)], x_label="latency", unit="s", rules=rules)
    boxes = label_boxes(chart)
    assert len(boxes) == 3
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert a[2] != b[2] or a[1] <= b[0] or b[1] <= a[0], (a, b)  # another row, or apart
        assert charts.MARGIN[0] <= a[0]  # inside the plot
        assert a[1] <= chart.right
    assert {m.title for m in chart.marks if m.kind == "rule"} >= {"p99: latency 0.205 s"}


def test_every_chart_titles_its_axes_and_says_what_a_bar_counts():
    made = [
        charts.histogram("Reward", [("rewarded", "s0", [0.0, 1.0, 1.0])], x_label="reward"),
        charts.histogram("Latency", [("ok", "ok", [0.01, 0.02])], x_label="latency", unit="ms"),
        charts.bars("Errors", [("timeout", [2])], [("workflow stage", "st-workflow")], counted="failed rollouts"),
        charts.timeline("Over time", [1.0, 2.0, 30.0], [4.0]),
        charts.lines("pass@k", [("pass@k", "s0", [(1, 0.5), (2, 0.75)])], x_label="k (samples)", y_label="pass@k"),
    ]
    for chart in made:
        assert chart.y_label, chart.title
        assert chart.x_label or chart.title == "Errors", chart.title
        for mark in chart.marks:
            if mark.kind == "rect":
                assert re.search(r": \d+ (failed )?rollouts", mark.title), mark.title
    assert made[1].x_label == "latency (ms)"
    assert made[0].marks[0].title == "reward 0: 1 rollouts"
    assert made[2].marks[0].title == "timeout, workflow stage: 2 failed rollouts"
    assert made[3].x_label == "time since the start (s)"


def test_durations_come_in_a_unit_that_suits_them():
    from osmosis_report.units import format_duration, format_durations

    # "0.00 s" said nothing about a 4 ms latency
    assert format_durations([0.004, 0.012, 0.031]) == "4.00 / 12.0 / 31.0 ms"
    assert format_durations([0.2, 1.5, 2.0]) == "0.200 / 1.50 / 2.00 s"
    assert format_duration(0.0000071) == "7.10 \u00b5s"
    assert format_duration(1234.0) == "20.6 min"
    assert format_duration(None) == "\u2013"
    assert format_durations([None, None]) == "\u2013 / \u2013"


def test_named_x_ticks_of_many_steps_do_not_overlap_and_a_negative_mean_stays_in_the_plot():
    names = [f"checkpoint-{k}" for k in range(60)]
    points = [(float(k), -0.5 + k / 40) for k in range(60)]
    chart = charts.lines("Reward by training step", [("mean reward", "s0", points)], x_names=names,
                         notes={0.0: "4 rollouts"}, tip="{x}: {series} {y} ({note})")  # fmt: skip
    labels = [label for _, label in chart.x_ticks]
    assert labels[0] == "checkpoint-0"
    assert all(label in names for label in labels)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(chart.x_ticks)]
    assert min(gaps) >= len("checkpoint-59") * charts.CHAR_WIDTH  # each label fits before the next
    assert chart.marks[1].title == "checkpoint-0: mean reward -0.500 (4 rollouts)"
    assert float(chart.y_ticks[0][1]) <= -0.5  # the axis reaches the lowest mean
    for mark in chart.marks:
        if mark.kind == "dot":
            assert chart.top - 1e-6 <= mark.y <= chart.bottom + 1e-6
    counts = charts.bars("Rollouts by training step", [(n, [3, 1]) for n in names], [("ok", "ok"), ("failed", "fail")],
                         thin=True)  # fmt: skip
    assert 2 <= len(counts.x_ticks) < len(names)
    assert len([m for m in counts.marks if m.kind == "rect"]) == 120  # every step is drawn; only labels are thinned
