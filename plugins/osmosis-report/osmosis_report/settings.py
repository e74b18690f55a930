"""The ``[report]`` table of a run config: whether the run folder gets its ``report.html``."""

from __future__ import annotations

import attrs

__all__ = ["ReportSettings"]


@attrs.define(kw_only=True)
class ReportSettings:
    """``[report]``::

    [report]
    enabled = true     # write report.html into the run folder, during the run and at its end
    max_mb = 24        # past it, the page keeps a stated sample of the trajectories
    """

    enabled: bool = True
    max_mb: float = 24.0
