"""The backend contract (osmosis_core.testing.BackendContract) against the ray backend: real actors on two nodes."""

from __future__ import annotations

from typing import Any

import pytest

from osmosis_core.testing import BackendContract


class TestRayBackend(BackendContract):
    @pytest.fixture(autouse=True)
    def _on_the_session_cluster(self, cluster: Any) -> None:
        """Every backend built here attaches to the session's cluster (this process is its driver)."""

    def make_backend(self, workflow: Any, grader: Any = None, *, max_concurrent: int = 4, require_labels: bool = False):
        from osmosis_ray import RayBackend, RayBackendConfig

        config = RayBackendConfig(actors=2)
        return RayBackend(
            workflow, grader=grader, config=config, max_concurrent=max_concurrent, require_labels=require_labels
        )
