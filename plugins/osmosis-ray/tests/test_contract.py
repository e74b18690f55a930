"""The backend contract (osmosis_core.testing.BackendContract) against the ray backend: real actors on two nodes."""

from __future__ import annotations

from typing import ClassVar

from osmosis_core.testing import BackendContract


class TestRayBackend(BackendContract):
    backend = "ray"  # built as `osmosis run --backend ray` builds it, from its [backend.ray] table
    backend_table: ClassVar[dict[str, object]] = {"actors": 2}
    fixtures = ("cluster",)  # every backend built here attaches to the session's cluster (this process drives it)
