"""Charts as data: the geometry of each plot, drawn as inline SVG by ``templates/charts.html.j2``.

Every plot is a :class:`Chart`: a plotting area, ticks, axis titles, and marks (rectangles,
paths, dots, rules) in pixel coordinates, each with a CSS class (colours come from the page's
stylesheet) and a hover title that says what it counts. No script draws them: the page shows its
plots before any script has run.

The y axis always reaches the data: its last tick is at or above the tallest bar or highest point.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import attrs

from osmosis_report.units import duration_unit, format_amount

__all__ = ["Chart", "Mark", "bars", "histogram", "lines", "nice_ticks", "timeline"]

WIDTH = 440
HEIGHT = 220
MARGIN = (52, 12, 14, 34)
"""left (room for the tick labels and the rotated y-axis title), top, right, bottom."""
CHAR_WIDTH = 7.0
"""About the width of one character of a 10.5 px label, to keep rule labels from overlapping."""
LABEL_ROW = 12.0
"""Pixels between two rows of rule labels."""


@attrs.frozen
class Mark:
    """One shape: ``rect`` (x, y, w, h), ``path`` (d), ``dot`` (x, y), ``rule`` (a vertical line at
    x, its label's baseline at y, drawn from x towards ``anchor``)."""

    kind: str
    cls: str
    title: str = ""
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = 0.0
    d: str = ""
    label: str = ""
    anchor: str = "start"


@attrs.frozen
class Chart:
    """A plot, ready to draw."""

    title: str
    marks: list[Mark]
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    x_label: str = ""
    y_label: str = ""
    legend: list[tuple[str, str]] = attrs.field(factory=list)
    note: str = ""
    """Said instead of (or under) the plot: why it is empty, what it leaves out."""
    width: int = WIDTH
    height: int = HEIGHT
    slug: str = ""
    y_max: float = 0.0
    """The value at the top of the y axis (its last tick)."""

    @property
    def left(self) -> float:
        return MARGIN[0]

    @property
    def top(self) -> float:
        return MARGIN[1]

    @property
    def right(self) -> float:
        return self.width - MARGIN[2]

    @property
    def bottom(self) -> float:
        return self.height - MARGIN[3]

    @property
    def middle(self) -> float:
        """The vertical middle of the plotting area (where the y-axis title is centred)."""
        return (self.top + self.bottom) / 2

    @property
    def empty(self) -> bool:
        return not self.marks


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values 1, 2, 2.5 or 5 times a power of ten apart, about ``count`` steps, that
    cover ``lo``..``hi``: the first at or below ``lo``, the last at or above ``hi``.

    >>> nice_ticks(0, 35, 4), nice_ticks(0, 379, 4)
    ([0.0, 10.0, 20.0, 30.0, 40.0], [0.0, 100.0, 200.0, 300.0, 400.0])
    """
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)
    return [float(round(k * step, 10)) for k in range(first, last + 1)]


def _fmt(value: float) -> str:
    if abs(value) >= 10_000:
        return f"{value / 1000:.0f}k"
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}k"
    if value == int(value):
        return str(int(value))
    return f"{value:.3g}"


class _Scale:
    def __init__(self, lo: float, hi: float, a: float, b: float) -> None:
        self.lo, self.hi, self.a, self.b = lo, hi if hi > lo else lo + 1.0, a, b

    def __call__(self, value: float) -> float:
        return self.a + (value - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def _y_ticks(top: float, *, integer: bool) -> list[float]:
    """Ticks from 0 to at least ``top`` (whole numbers only for counts)."""
    ticks = nice_ticks(0.0, top if top > 0 else 1.0, 4)
    if integer:
        ticks = [t for t in ticks if t == int(t)] or [0.0, 1.0]
        while ticks[-1] < top:  # (nice steps of counts end on a whole number; kept as a guarantee)
            ticks.append(ticks[-1] + max(ticks[-1] - ticks[-2], 1.0) if len(ticks) > 1 else 1.0)
    return ticks


def _fitting(widest: int, most: int = 10) -> int:
    """How many x tick labels of ``widest`` characters fit side by side (at least 2, at most ``most``)."""
    return max(2, min(most, int((WIDTH - MARGIN[0] - MARGIN[2]) // (widest * CHAR_WIDTH + 10))))


def _frame(lo: float, hi: float, top: float, *, integer: bool = False) -> tuple[_Scale, _Scale, list[float]]:
    """The y ticks and scale for 0..top (the last tick at or above ``top``) and an x scale for lo..hi."""
    ticks = _y_ticks(top, integer=integer)
    y = _Scale(0.0, ticks[-1], HEIGHT - MARGIN[3], MARGIN[1])
    x = _Scale(lo, hi, MARGIN[0], WIDTH - MARGIN[2])
    return x, y, ticks


def _rules(rules: Sequence[tuple[str, float]], x: _Scale, low: float, high: float, name: str, unit: str) -> list[Mark]:
    """Labelled vertical lines at values of ``name`` (in ``unit``); labels that would overlap go on
    the next row down, and a label that would leave the plot on the right is drawn left of its line."""
    marks = []
    placed: list[list[tuple[float, float]]] = []
    for label, at in sorted(((label, at) for label, at in rules if low <= at <= high), key=lambda r: r[1]):
        px = x(at)
        width = CHAR_WIDTH * len(label)
        anchor, x0 = "start", px + 3
        if x0 + width > WIDTH - MARGIN[2]:
            anchor, x0 = "end", px - 3 - width
        row = 0
        while row < len(placed) and any(x0 < b + 4 and a < x0 + width + 4 for a, b in placed[row]):
            row += 1
        if row == len(placed):
            placed.append([])
        placed[row].append((x0, x0 + width))
        marks.append(
            Mark(
                "rule",
                "rule",
                f"{label}: {name} {_fmt(at)}{' ' + unit if unit else ''}".strip(),
                px,
                MARGIN[1] + 9 + LABEL_ROW * row,
                label=label,
                anchor=anchor,
            )
        )
    return marks


def histogram(
    title: str,
    series: Sequence[tuple[str, str, Sequence[float]]],
    *,
    bins: int = 24,
    lo: float | None = None,
    hi: float | None = None,
    x_label: str = "",
    unit: str = "",
    counted: str = "rollouts",
    stacked: bool = True,
    rules: Sequence[tuple[str, float]] = (),
    note: str = "",
    slug: str = "",
) -> Chart:
    """Counts of values in equal bins (``(label, css class, values)`` per series), stacked or, with
    ``stacked=False``, side by side within each bin.

    Values that are few distinct numbers (rewards of 0 and 1) get one bar each instead of bins.
    ``x_label`` names the values and ``unit`` their unit (both in the axis title and the hover
    titles, which say ``reward 1: 30 rollouts``); ``counted`` is what a bar counts (the y axis).
    ``rules`` are labelled vertical lines (p50, p95, ...).
    """
    axis = f"{x_label} ({unit})" if unit else x_label
    values = [v for _, _, vs in series for v in vs if math.isfinite(v)]
    if not values:
        return Chart(title, [], [], [], axis, counted, note=note or "no values", slug=slug)
    distinct = sorted(set(values))
    low = min(values) if lo is None else lo
    high = max(values) if hi is None else hi
    if len(distinct) <= 12 and all(round(v, 6) == v for v in distinct):
        edges = [(v, v) for v in distinct]
        step = min((b - a for a, b in itertools.pairwise(distinct)), default=1.0) or 1.0
        low, high = distinct[0] - step / 2, distinct[-1] + step / 2
    else:
        if high <= low:
            high = low + 1.0
        width = (high - low) / bins
        edges = [(low + i * width, low + (i + 1) * width) for i in range(bins)]
    counts = [[0] * len(edges) for _ in series]
    for s, (_, _, vs) in enumerate(series):
        for v in vs:
            if not math.isfinite(v):
                continue
            if edges[0][0] == edges[0][1]:
                i = distinct.index(v) if v in distinct else 0
            else:
                i = min(max(int((v - low) / (high - low) * len(edges)), 0), len(edges) - 1)
            counts[s][i] += 1
    top = max(sum(c[i] for c in counts) if stacked else max(c[i] for c in counts) for i in range(len(edges)))
    x, y, yt = _frame(low, high, top, integer=True)
    marks = []
    several = len(series) > 1
    suffix = f" {unit}" if unit else ""
    for i, (a, b) in enumerate(edges):
        if a == b:
            half = (x(high) - x(low)) / len(edges) * 0.35
            left, right = x(a) - half, x(a) + half
            span = _fmt(a)
        else:
            left, right = x(a) + 0.5, x(b) - 0.5
            span = f"{_fmt(a)} to {_fmt(b)}"
        base = 0
        slot = (right - left) / len(series)
        for s, (label, cls, _) in enumerate(series):
            n = counts[s][i]
            if not n:
                continue
            tip = f"{x_label} {span}{suffix}: {n} {counted}" + (f" ({label})" if several else "")
            if stacked:
                mark = Mark("rect", cls, tip, left, y(base + n), max(right - left, 1.0), y(base) - y(base + n))
                base += n
            else:
                mark = Mark("rect", cls, tip, left + s * slot, y(n), max(slot - 1.0, 1.0), y(0) - y(n))
            marks.append(mark)
    marks.extend(_rules(rules, x, low, high, x_label, unit))
    xt = [
        (x(v), _fmt(v))
        for v in (distinct if edges[0][0] == edges[0][1] else nice_ticks(low, high, 5))
        if low <= v <= high
    ]
    legend = [(label, cls) for label, cls, vs in series if vs] if several else []
    return Chart(title, marks, xt, [(y(t), _fmt(t)) for t in yt], axis, counted, legend, note, slug=slug, y_max=yt[-1])


def lines(
    title: str,
    series: Sequence[tuple[str, str, Sequence[tuple[float, float]]]],
    *,
    x_label: str = "",
    y_label: str = "",
    y_max: float | None = 1.0,
    tip: str = "{series}: {x_label} {x}, {y_label} {y}",
    x_names: Sequence[str] = (),
    notes: Mapping[float, str] | None = None,
    note: str = "",
    slug: str = "",
) -> Chart:
    """Line plots with a dot per point (``(label, css class, [(x, y), ...])``), e.g. pass@k against k.

    The y axis goes from 0 (or below, to the lowest point) to ``y_max``, or further when a point is
    higher. ``tip`` is each dot's hover title, formatted with ``series``, ``x``, ``y``, ``x_label``,
    ``y_label`` and ``note`` (``notes[x]``: what the point counts, e.g. ``16 rollouts``). With
    ``x_names``, the x values are positions in it (0, 1, ...: training steps), and the ticks and
    titles say the names; the ticks are thinned so that their labels do not overlap.
    """
    points = [p for _, _, ps in series for p in ps]
    if not points:
        return Chart(title, [], [], [], x_label, y_label, note=note or "no values", slug=slug)
    xs = [p[0] for p in points]
    lo, hi = min(xs), max(xs)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    top = max(y_max or 0.0, max(p[1] for p in points))
    low = min(0.0, min(p[1] for p in points))  # (a mean reward may be negative)
    ticks = _y_ticks(top, integer=False) if low == 0 else nice_ticks(low, top, 4)
    y = _Scale(ticks[0], ticks[-1], HEIGHT - MARGIN[3], MARGIN[1])
    x = _Scale(lo, hi, MARGIN[0] + 8, WIDTH - MARGIN[2] - 8)

    def name(value: float) -> str:
        return x_names[int(value)] if x_names and 0 <= int(value) < len(x_names) else _fmt(value)

    marks = []
    for label, cls, ps in series:
        if not ps:
            continue
        d = "M" + " L".join(f"{x(a):.1f},{y(b):.1f}" for a, b in ps)
        marks.append(Mark("path", cls, label, d=d))
        for a, b in ps:
            said = (notes or {}).get(a, "")
            text = tip.format(series=label, x=name(a), y=f"{b:.3f}", x_label=x_label, y_label=y_label, note=said)
            marks.append(Mark("dot", cls, text, x(a), y(b)))
    whole = sorted({a for a in xs})
    most = _fitting(max(len(name(v)) for v in whole)) if x_names else 10
    step = max(1, math.ceil(len(whole) / most))
    xt = [(x(v), name(v)) for v in whole[::step]]
    legend = [(label, cls) for label, cls, _ in series] if len(series) > 1 else []
    return Chart(
        title, marks, xt, [(y(t), _fmt(t)) for t in ticks], x_label, y_label, legend, note, slug=slug, y_max=ticks[-1]
    )


def bars(
    title: str,
    groups: Sequence[tuple[str, Sequence[int]]],
    stacks: Sequence[tuple[str, str]],
    *,
    grouped: bool = False,
    counted: str = "rollouts",
    tip: str = "{group}, {stack}: {n} {counted}",
    note: str = "",
    empty: str = "none",
    x_label: str = "",
    thin: bool = False,
    slug: str = "",
) -> Chart:
    """Vertical bars per group (an error category), stacked (by stage) or side by side (by run).

    :param groups: ``(group label, one count per stack)``.
    :param stacks: ``(label, css class)`` of each count.
    :param counted: what a bar counts (the y axis's title).
    :param tip: each bar's hover title, formatted with ``group``, ``stack``, ``n`` and ``counted``.
    :param x_label: what the groups are (the x axis's title).
    :param thin: label only as many groups as fit side by side (many groups: training steps).
    """
    groups = [(g, counts) for g, counts in groups if sum(counts)]
    if not groups:
        return Chart(title, [], [], [], x_label, counted, note=empty, slug=slug)
    top = max((max(c) if grouped else sum(c)) for _, c in groups)
    x, y, yt = _frame(0, len(groups), top, integer=True)
    marks = []
    slot = (x(1) - x(0)) * 0.7
    for i, (group, counts) in enumerate(groups):
        left = x(i) + (x(1) - x(0)) * 0.15
        base = 0
        for s, ((label, cls), n) in enumerate(zip(stacks, counts, strict=True)):
            if not n:
                continue
            text = tip.format(group=group, stack=label, n=n, counted=counted)
            if grouped:
                w = slot / len(stacks)
                marks.append(Mark("rect", cls, text, left + s * w, y(n), w - 1, y(0) - y(n)))
            else:
                marks.append(Mark("rect", cls, text, left, y(base + n), slot, y(base) - y(base + n)))
                base += n
    every = math.ceil(len(groups) / _fitting(max(len(g) for g, _ in groups), len(groups))) if thin else 1
    xt = [(x(i + 0.5), g) for i, (g, _) in enumerate(groups) if i % every == 0]
    legend = [(label, cls) for label, cls in stacks] if len(stacks) > 1 else []
    y_ticks = [(y(t), _fmt(t)) for t in yt]
    return Chart(title, marks, xt, y_ticks, x_label, counted, legend, note, slug=slug, y_max=yt[-1])


def timeline(
    title: str,
    ok: Sequence[float],
    failed: Sequence[float],
    *,
    start: float | None = None,
    note: str = "",
    slug: str = "",
) -> Chart:
    """Rollouts finished per time bucket (stacked: succeeded, failed) against the time since the
    start, in seconds, minutes or hours as the run's length suits.

    A stall shows as a gap, an endpoint outage as a run of failures.
    """
    times = [*ok, *failed]
    if not times:
        empty = note or "no timestamps"
        return Chart(title, [], [], [], "time since the start", "rollouts finished", note=empty, slug=slug)
    t0 = min(times) if start is None else min(start, min(times))
    span = max(max(times) - t0, 1.0)
    unit, size = duration_unit(span)  # (a span is at least a second: seconds or longer)
    buckets = min(60, max(10, int(math.sqrt(len(times)))))
    width = span / buckets
    ok_counts, fail_counts = [0] * buckets, [0] * buckets
    for t in ok:
        ok_counts[min(int((t - t0) / width), buckets - 1)] += 1
    for t in failed:
        fail_counts[min(int((t - t0) / width), buckets - 1)] += 1
    top = max(a + b for a, b in zip(ok_counts, fail_counts, strict=True))
    x, y, yt = _frame(0.0, span / size, top, integer=True)
    marks = []
    for i in range(buckets):
        a, b = i * width / size, (i + 1) * width / size
        when = f"{format_amount(a)} to {format_amount(b)} {unit}"
        rate = (ok_counts[i] + fail_counts[i]) / width
        if ok_counts[i]:
            n = ok_counts[i]
            marks.append(
                Mark(
                    "rect",
                    "ok",
                    f"{when}: {n} rollouts succeeded ({rate:.1f} finished/s)",
                    x(a) + 0.5,
                    y(n),
                    x(b) - x(a) - 1,
                    y(0) - y(n),
                )
            )
        if fail_counts[i]:
            n, base = fail_counts[i], ok_counts[i]
            marks.append(
                Mark(
                    "rect",
                    "fail",
                    f"{when}: {n} rollouts failed",
                    x(a) + 0.5,
                    y(base + n),
                    x(b) - x(a) - 1,
                    y(base) - y(base + n),
                )
            )
    xt = [(x(v), _fmt(v)) for v in nice_ticks(0.0, span / size, 5) if v <= span / size]
    legend = [("succeeded", "ok"), ("failed", "fail")]
    return Chart(
        title,
        marks,
        xt,
        [(y(t), _fmt(t)) for t in yt],
        f"time since the start ({unit})",
        "rollouts finished",
        legend,
        note,
        slug=slug,
        y_max=yt[-1],
    )
