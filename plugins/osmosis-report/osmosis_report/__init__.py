"""osmosis-report: one self-contained HTML file for an osmosis run, or several side by side.

* ``osmosis report RUN [RUN ...]``: write the report (and print the summary table);
* the ``osmosis_run_progress`` hook: ``report.html`` in every run folder, kept up to date while
  the run goes (``[report] enabled = false`` or ``osmosis run --no-report`` turns it off);
* :func:`build_report` and :func:`load_run` for scripts.

Names are imported lazily: ``import osmosis_report`` imports neither Jinja2 nor the readers.
"""

from typing import TYPE_CHECKING

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_report.compare import Comparison as Comparison
    from osmosis_report.compare import compare as compare
    from osmosis_report.load import RunData as RunData
    from osmosis_report.load import load_run as load_run
    from osmosis_report.render import Built as Built
    from osmosis_report.render import build_report as build_report
    from osmosis_report.settings import ReportSettings as ReportSettings
    from osmosis_report.stats import mean_interval as mean_interval
    from osmosis_report.stats import paired_bootstrap as paired_bootstrap
    from osmosis_report.stats import pass_at_k as pass_at_k

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "compare": ["Comparison", "compare"],
        "load": ["RunData", "load_run"],
        "render": ["Built", "build_report"],
        "settings": ["ReportSettings"],
        "stats": ["mean_interval", "paired_bootstrap", "pass_at_k"],
    },
)
