"""The backend contract (osmosis_core.testing.BackendContract) against the core's own backends."""

from __future__ import annotations

from typing import Any

from osmosis_core import LocalBackend, WorkerPool
from osmosis_core.testing import BackendContract


class TestLocalBackend(BackendContract):
    def make_backend(self, workflow: Any, grader: Any = None, *, max_concurrent: int = 4, require_labels: bool = False):
        return LocalBackend(workflow, grader=grader, max_concurrent=max_concurrent, require_labels=require_labels)


class TestLocalBackendWithWorkers(BackendContract):
    def make_backend(self, workflow: Any, grader: Any = None, *, max_concurrent: int = 4, require_labels: bool = False):
        return WorkerPool(
            workflow, grader=grader, workers=2, max_concurrent=max_concurrent, require_labels=require_labels
        )
