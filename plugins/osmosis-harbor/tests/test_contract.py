"""The backend contract (osmosis_core.testing.BackendContract) against the harbor backend: real trials."""

from __future__ import annotations

from osmosis_core.testing import BackendContract


class TestHarborBackend(BackendContract):
    backend = "harbor"  # built as `osmosis run --backend harbor` builds it: the limit comes in BackendSetup.limits
    stage_timeout_sec = 2.0  # a trial's interpreter takes a moment to start
