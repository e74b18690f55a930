r"""Durations in a unit that suits them: ``12.0 ms`` rather than ``0.01 s``, ``4.00 min`` rather than ``240 s``.

One unit for a set of figures that are read side by side (p50 / p95 / p99), chosen by the largest:

>>> format_duration(0.0123), format_duration(1.5), format_duration(0.0000071)
('12.3 ms', '1.50 s', '7.10 µs')
>>> format_durations([0.004, 0.012, 0.031])
'4.00 / 12.0 / 31.0 ms'
>>> format_durations([None, 2.0])
'\u2013 / 2.00 s'
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["duration_unit", "format_amount", "format_duration", "format_durations"]

_UNITS = (("µs", 1e-6, 1e-3), ("ms", 1e-3, 1.0), ("s", 1.0, 600.0), ("min", 60.0, 36_000.0), ("h", 3600.0, math.inf))
"""(unit, its size in seconds, the duration from which the next unit is used)."""
DASH = "\u2013"


def duration_unit(seconds: float) -> tuple[str, float]:
    """The unit for durations up to ``seconds`` and its size in seconds (``("ms", 0.001)``)."""
    seconds = abs(seconds) if math.isfinite(seconds) else 0.0
    for unit, size, below in _UNITS:
        if seconds < below:
            return unit, size
    return _UNITS[-1][0], _UNITS[-1][1]  # (unreachable: the last bound is infinite)


def format_amount(value: float) -> str:
    """Three significant figures, never in scientific notation (``0.0123``, ``1.50``, ``12.3``, ``1,234``)."""
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    size = abs(value)
    if size >= 100 or value == 0:
        return f"{value:,.0f}"
    decimals = 2 - math.floor(math.log10(size))
    return f"{value:.{decimals}f}"


def format_duration(seconds: float | None) -> str:
    """``seconds`` in the unit that suits it; a dash for None."""
    return format_durations([seconds])


def format_durations(values: Sequence[float | None], sep: str = " / ") -> str:
    """Several durations in one unit (the largest one's), the unit written once at the end."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    if not known:
        return sep.join(DASH for _ in values) if len(values) > 1 else DASH
    unit, size = duration_unit(max(known))
    text = sep.join(DASH if v is None else format_amount(v / size) for v in values)
    return f"{text} {unit}"
