"""What ``osmosis run`` shows: a live progress bar (rich) and the summary table at the end."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from osmosis_core._engine.results import ResultStats, Summary
from osmosis_core.errors import clip

__all__ = ["PlainReporter", "RichReporter", "make_reporter", "print_summary"]


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _stats_text(stats: ResultStats) -> str:
    return f"errors {stats.failed}  mean reward {_fmt(stats.mean_reward)}"


class RichReporter:
    """A live bar: rollouts done of total, errors, running mean reward, elapsed and ETA."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            refresh_per_second=8,
            transient=False,
        )
        self.task = self.progress.add_task("run", total=1, stats="")

    def start(self, total: int, already_done: ResultStats) -> None:
        self.progress.update(self.task, total=total, completed=already_done.finished, stats=_stats_text(already_done))
        self.progress.start()

    def advance(self, line: dict[str, Any], stats: ResultStats) -> None:
        self.progress.update(self.task, completed=stats.finished, stats=_stats_text(stats))

    def stop(self) -> None:
        self.progress.stop()


class PlainReporter:
    """For logs and CI (no terminal): one line at most every 5 seconds, and at the end."""

    def __init__(self, console: Console, every: float = 5.0) -> None:
        self.console = console
        self.every = every
        self.total = 0
        self._last = 0.0

    def start(self, total: int, already_done: ResultStats) -> None:
        self.total = total
        self._last = time.monotonic()

    def advance(self, line: dict[str, Any], stats: ResultStats) -> None:
        now = time.monotonic()
        if now - self._last >= self.every or stats.finished == self.total:
            self._last = now
            self.console.print(f"rollouts {stats.finished}/{self.total}  {_stats_text(stats)}", highlight=False)

    def stop(self) -> None:
        pass


def make_reporter(console: Console) -> RichReporter | PlainReporter:
    """A live bar on a terminal, periodic lines elsewhere."""
    return RichReporter(console) if console.is_terminal else PlainReporter(console)


SHOWN_MESSAGE_CHARS = 120
"""How much of a category's most common message the summary table shows (summary.json keeps more)."""


def _errors_text(summary: Summary) -> Text | str:
    """One line per error category: its count and its most common message (``policy_error 20: ...``)."""
    if not summary.errors_by_category:
        return "none"
    lines = []
    for category, count in summary.errors_by_category.items():
        common = summary.error_messages.get(category)
        if common is None:
            lines.append(f"{category} {count}")
            continue
        alike = "" if common["count"] == count else f" ({common['count']} alike)"
        message = clip(str(common["message"]), limit=SHOWN_MESSAGE_CHARS)
        lines.append(f"{category} {count}{alike}: {message}")
    return Text("\n".join(lines))  # (a message is text, never rich markup)


def print_summary(
    console: Console, summary: Summary, run_dir: Path, *, written: Sequence[tuple[str, Path]] = ()
) -> None:
    """The end-of-run table; ``written``: ``(plugin name, path)`` of the files plugins wrote (``report.html``)."""
    table = Table(
        title="osmosis run summary" + (" (interrupted)" if summary.interrupted else ""),
        show_header=False,
        title_justify="left",
    )
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("rows x samples", f"{summary.rows} x {summary.n_samples} = {summary.expected}")
    ungraded = f", {summary.ungraded} ungraded" if summary.ungraded else ""
    table.add_row("finished", f"{summary.finished} ({summary.succeeded} ok{ungraded}, {summary.failed} failed)")
    counted = " (a failed rollout counts as 0)" if summary.failed and summary.mean_reward is not None else ""
    table.add_row("mean reward", _fmt(summary.mean_reward) + counted)
    if counted:
        table.add_row("mean reward (graded)", f"{_fmt(summary.mean_reward_graded)} (failed rollouts left out)")
    table.add_row("pass rate", f"{_fmt(summary.pass_rate, '.1%')} (reward >= {summary.pass_threshold:g})")
    table.add_row("errors", _errors_text(summary))
    table.add_row(
        "latency p50 / p95",
        f"{_fmt(summary.latency_p50_sec, '.2f')} s / {_fmt(summary.latency_p95_sec, '.2f')} s",
    )
    table.add_row("wall time", f"{summary.wall_sec:.1f} s")
    table.add_row("results", str(run_dir / "results.jsonl"))
    for name, path in written:
        table.add_row(name, str(path))
    if summary.stub_policy:
        table.add_row("policy", "[yellow]stub (scripted calculator server, not a model)[/yellow]")
    console.print(table)
