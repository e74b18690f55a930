"""``osmosis report``: one HTML file for a run, or for several side by side, and the summary table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from osmosis_report.render import Built

__all__ = ["print_report_summary", "report"]


@click.command(short_help="Write one HTML report of run folders.")
@click.argument(
    "runs", metavar="RUN [RUN ...]", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path)
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The HTML file to write (default: RUN/report.html for one run, ./report.html for several).",
)
@click.option("--open", "open_", is_flag=True, help="Open the report in the default browser once written.")
@click.option(
    "--max-mb",
    type=click.FloatRange(min=1),
    default=24.0,
    show_default=True,
    help="The page's size limit: past it, every row and rollout stays but only a stated sample of trajectories.",
)
def report(runs: tuple[Path, ...], output: Path | None, open_: bool, max_mb: float) -> None:
    """Write one self-contained HTML report of RUN folders, and print their summary.

    One run: its figures (mean reward with a 95% interval, pass rate, pass@k, errors, latency),
    plots, every row with its samples, and every rollout's trajectory. Several runs of one dataset:
    the first against each other, row by row (matched by position and prompt hash), with paired
    bootstrap intervals and the rows that flipped. The file works offline and from file://, and
    makes no request. A run that is still going can be reported at any time.

    \b
    Examples:
      osmosis report runs/multiply-plain-20260101-120000
      osmosis report runs/base runs/checkpoint-200 -o compare.html --open
    """
    import webbrowser

    from osmosis_core import OsmosisError
    from osmosis_core.frontend import make_console
    from osmosis_report.render import build_report

    for run in runs:
        if not run.is_dir():
            raise click.BadParameter(f"{run} is not a folder", param_hint="RUN")
    target = output or (runs[0] / "report.html" if len(runs) == 1 else Path("report.html"))
    console = make_console()
    err = make_console(stderr=True)
    try:
        with _progress(err) as progress:
            built = build_report(runs, target, max_bytes=int(max_mb * 2**20), progress=progress)
    except OsmosisError:
        raise
    print_report_summary(console, built)
    for data in built.runs:
        for problem in data.damaged[:10]:
            err.print(f"damaged line skipped: {problem}", markup=False, soft_wrap=True)
        for problem in data.nonfinite[:10]:
            err.print(f"not a finite number: {problem}", markup=False, soft_wrap=True)
        if len(data.nonfinite) > 10:
            err.print(f"and {len(data.nonfinite) - 10} more NaN or infinite numbers (listed in the report)")
    console.print(
        f"wrote {built.path} ({built.bytes / 2**20:.1f} MB, {built.rollouts:,} rollouts, "
        f"{built.embedded:,} trajectories, {built.seconds:.1f} s)",
        markup=False,
        soft_wrap=True,
    )
    if open_:
        uri = built.path.resolve().as_uri()
        try:
            opened = webbrowser.open(uri)
        except webbrowser.Error:
            opened = False
        if not opened:
            err.print(
                f"--open: no browser found to open it (set BROWSER to one); open {uri} yourself",
                markup=False,
                soft_wrap=True,
            )


class _progress:
    """A progress bar on a terminal while the report builds (reading, compressing, writing); nothing elsewhere."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Any:
        if not self.console.is_terminal:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.bar.start()
        return self.update

    def update(self, phase: str, done: int, total: int) -> None:
        task = self.tasks.get(phase)
        if task is None:
            task = self.tasks[phase] = self.bar.add_task(phase, total=total or 1)
        self.bar.update(task, completed=done, total=total or 1)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def print_report_summary(console: Any, built: Built) -> None:
    """The summary table: one column per run (and the deltas against the first when there are several)."""
    from rich.table import Table

    from osmosis_report.render import run_figures
    from osmosis_report.units import format_durations

    figures = [run_figures(run) for run in built.runs]
    title = "osmosis report" + ("" if len(figures) == 1 else f": {len(figures)} runs against {figures[0]['name']}")
    table = Table(title=title, title_justify="left", show_header=len(figures) > 1)
    table.add_column(style="bold", no_wrap=True)
    for f in figures:
        table.add_column(f["name"] + (" (partial)" if f["partial"] else ""), overflow="fold")

    def num(v: float | None, spec: str = ".3f") -> str:
        return "-" if v is None else format(v, spec)

    def row(name: str, values: list[str]) -> None:
        table.add_row(name, *values)

    row("status", [_status(f) for f in figures])
    row("model", [str(f["model"] or "-") for f in figures])
    row("finished", [f"{f['summary'].finished} / {f['summary'].expected}" for f in figures])
    row(
        "mean reward [95% CI]",
        [
            "-"
            if f["interval"] is None
            else f"{f['interval'].value:.3f} [{f['interval'].low:.3f}, {f['interval'].high:.3f}]"
            for f in figures
        ],
    )
    row(
        "mean reward (graded)",
        ["-" if f["interval_graded"] is None else f"{f['interval_graded'].value:.3f}" for f in figures],
    )
    row("pass rate", ["-" if f["summary"].pass_rate is None else f"{f['summary'].pass_rate:.1%}" for f in figures])
    row(
        "pass@k",
        [
            ", ".join(f"@{k} {v:.3f}" for k, v, _ in f["pass_at_k"][:4]) + (" ..." if len(f["pass_at_k"]) > 4 else "")
            or "-"
            for f in figures
        ],
    )
    row("ungraded", [str(f["summary"].ungraded) for f in figures])
    row(
        "errors",
        [", ".join(f"{k} {v}" for k, v in f["summary"].errors_by_category.items()) or "none" for f in figures],
    )
    row("latency p50/p95/p99", [format_durations([f["latency"][q] for q in (50, 95, 99)]) for f in figures])
    row("rollouts/s", [num(f["rate"], ".1f") for f in figures])
    if any(f["first_step"] is not None for f in figures):
        row("mean reward by step", [_by_step(f) for f in figures])
    if any(f["call_versions"] for f in figures):
        calls = [f["off_policy_calls"] for f in figures]
        row(
            "off-policy rollouts",
            [f"{f['off_policy']} ({n} call{'s' if n != 1 else ''})" for f, n in zip(figures, calls, strict=True)],
        )
    if built.comparison is not None:
        deltas = built.comparison.deltas
        row("Δ mean reward [95% CI]", ["(baseline)"] + [_signed(d.reward) for d in deltas])
        row("Δ pass rate [95% CI]", ["(baseline)"] + [_signed(d.pass_rate) for d in deltas])
        row("pass → fail / fail → pass", ["(baseline)"] + [f"{len(d.broke)} / {len(d.fixed)}" for d in deltas])
        row(
            "rows compared",
            ["(baseline)"] + [f"{len(d.rows)} (of {len(d.matched)} matched)" for d in deltas],
        )
        if any(d.mismatches for d in deltas):
            row("not matched", ["(baseline)"] + [str(len(d.mismatches)) for d in deltas])
    console.print(table)


def _signed(interval: Any) -> str:
    if interval is None:
        return "-"
    return f"{interval.value:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]"


def _by_step(figures: dict[str, Any]) -> str:
    """The mean reward of the first and the last training step (policy version), and how many there are."""
    first, last = figures["first_step"], figures["last_step"]
    if first is None:
        return "-"

    def mean(step: Any) -> str:
        return "-" if step.mean_reward is None else f"{step.mean_reward:.3f}"

    return f"{mean(first)} ({first.label}) -> {mean(last)} ({last.label}), {figures['versions']} versions"


def _status(figures: dict[str, Any]) -> str:
    if figures["live"]:
        return "partial (the run is still going)"
    if figures["summary"].interrupted:
        return "partial (interrupted)"
    return "partial" if figures["partial"] else "complete"
