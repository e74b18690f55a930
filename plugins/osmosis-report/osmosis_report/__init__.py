"""osmosis-report: one self-contained HTML file for an osmosis run, or several side by side.

* ``osmosis report RUN [RUN ...]``: write the report (and print the summary table);
* the ``osmosis_run_progress`` hook: ``report.html`` in every run folder, kept up to date while
  the run goes (``[report] enabled = false`` or ``osmosis run --no-report`` turns it off);
* :func:`build_report` and :func:`load_run` for scripts.

Names are imported lazily: ``import osmosis_report`` imports neither Jinja2 nor the readers.
"""

from osmosis_core.plugin import attach_stub

__version__ = "0.1.0"
__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
