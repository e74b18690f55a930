"""The osmosis plugin of osmosis-report (entry point ``report``).

* ``osmosis report``: the command;
* ``osmosis_run_progress``: writes ``report.html`` into each run folder (of ``osmosis run`` and
  ``osmosis serve``) while it goes and when it ends, unless ``[report] enabled = false`` or
  ``osmosis run --no-report``. A report that takes long is written less often: at most every
  minute, and never more than 5% of the time. It returns the page's path, which the summary
  table at the end of ``osmosis run`` names.

It stays light: Jinja2 and the readers are imported when a report is written.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from osmosis_core.plugin import hookimpl

if TYPE_CHECKING:
    import click

    from osmosis_core.plugin import RunProgress

__all__ = ["REPORT_FILE", "osmosis_register_commands", "osmosis_run_progress"]

REPORT_FILE = "report.html"
SHARE = 0.05
"""The largest share of a run's time its periodic reports may take."""

_lock = threading.Lock()
_last: dict[Path, tuple[float, float]] = {}
"""run folder -> (when its last report was written, how long it took)."""


@hookimpl
def osmosis_register_commands(cli: click.Group) -> None:
    from osmosis_report.report_cmd import report

    cli.add_command(report)


@hookimpl
def osmosis_run_progress(progress: RunProgress) -> Path | None:
    """Write ``report.html`` into the run folder (not more often than :data:`SHARE` allows while the
    run goes); the path it wrote, which the run's summary names, or None."""
    from osmosis_core.plugin import structure_table
    from osmosis_report.render import build_report
    from osmosis_report.settings import ReportSettings

    config = progress.config
    table = config.report if config is not None else {}
    source = str(config.source) if config is not None and config.source is not None else "<config>"
    settings = structure_table(table, ReportSettings, "$.report", source)
    if not settings.enabled:
        return None
    folder = Path(progress.run_dir)
    now = time.monotonic()
    with _lock:
        last = _last.get(folder)
        if not progress.final and last is not None and now - last[0] < last[1] / SHARE:
            return None
    built = build_report([folder], folder / REPORT_FILE, max_bytes=int(settings.max_mb * 2**20))
    with _lock:
        _last[folder] = (time.monotonic(), time.monotonic() - now)
    return built.path
