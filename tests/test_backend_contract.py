"""The backend contract (osmosis_core.testing.BackendContract) against the core's own backends, the
README's example backend, and a backend written only from the seam's documented API."""

from __future__ import annotations

import types
from typing import Any

from osmosis_core import ExecutionRequest, LocalBackend
from osmosis_core.plugin import BackendSetup, BackendSpec, ExecutionBackend, ResultCallback, hookimpl
from osmosis_core.testing import BackendContract, example_backend


class TestLocalBackend(BackendContract):
    backend = "local"


class TestLocalBackendWithWorkers(BackendContract):
    backend = "local"
    workers = 2


class TestExampleBackend(BackendContract):
    backend = "inline"
    plugin = example_backend


class MeteredBackend(ExecutionBackend):
    """A third party's backend, written from the seam alone (0.1's documented API): it meters the
    rollouts a LocalBackend runs, and takes its limit from the workflow config, as 0.1 documented."""

    def __init__(self, setup: BackendSetup) -> None:
        self.inner = LocalBackend(
            setup.workflow_class,
            setup.workflow_config,
            setup.grader_class,
            setup.grader_config,
            require_labels=setup.require_labels,
        )
        self.started = 0

    @property
    def max_concurrency(self) -> int:
        return self.inner.max_concurrency

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "started": self.started}

    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback,
        on_grader_complete: ResultCallback | None = None,
    ) -> None:
        self.started += 1
        await self.inner.execute(request, on_workflow_complete, on_grader_complete)


@hookimpl
def _register_metered() -> list[BackendSpec]:
    return [BackendSpec("metered", MeteredBackend, description="A third party's backend.")]


class TestThirdPartyBackend(BackendContract):
    backend = "metered"
    plugin = types.SimpleNamespace(osmosis_register_backends=_register_metered)
