"""The backend contract (osmosis_core.testing.BackendContract) against the harbor backend: real trials."""

from __future__ import annotations

from typing import Any

from osmosis_core.testing import BackendContract
from osmosis_harbor import HarborBackend, HarborBackendConfig


class TestHarborBackend(BackendContract):
    stage_timeout_sec = 2.0  # a trial's interpreter takes a moment to start

    def make_backend(self, workflow: Any, grader: Any = None, *, max_concurrent: int = 4, require_labels: bool = False):
        config = HarborBackendConfig(n_concurrent=max_concurrent)
        return HarborBackend(workflow, grader=grader, config=config, require_labels=require_labels)
