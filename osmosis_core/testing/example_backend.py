"""The example backend of the README and ``osmosis_core.backend``: a whole backend plugin in one module.

``InlineBackend`` runs each rollout on the running event loop; the core's lifecycle does the rest
(stages, timeouts, error categories, the partial sample, each callback once and in order, the
cancellation report). A backend that runs rollouts elsewhere (a process, a sandbox, a cluster)
calls :func:`run_workflow` and :func:`run_grader` there and reports what comes back through the
same :class:`RolloutReporter`. The backend contract suite checks it (``tests/test_backend_contract.py``).
"""

import anyio
import attrs

from osmosis_core import ExecutionRequest
from osmosis_core.plugin import (
    BackendSetup,
    BackendSpec,
    ExecutionBackend,
    ResultCallback,
    RolloutReporter,
    hookimpl,
    run_grader,
    run_workflow,
)


@attrs.define(kw_only=True)
class InlineConfig:  # the [backend.inline] table
    max_concurrent: int = 4  # rollouts at once when the run sets no [run] concurrency


class InlineBackend(ExecutionBackend):  # each rollout on this event loop, max_concurrency at once
    def __init__(self, setup: BackendSetup) -> None:
        self.setup = setup
        self.limit = setup.limits.concurrency or setup.backend_config.max_concurrent
        self.slots = anyio.Semaphore(self.limit)

    @property
    def max_concurrency(self) -> int:
        return self.limit

    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback,
        on_grader_complete: ResultCallback | None = None,
    ) -> None:
        s = self.setup
        grades = s.grades(request)  # a grader, asked for, and a labelled row (or require_labels)
        async with RolloutReporter(request, on_workflow_complete, on_grader_complete, grades=grades) as rollout:
            async with self.slots:
                result = await run_workflow(s.workflow_class, s.workflow_config, request)
            await rollout.report(result)
            if not rollout.ended:  # the workflow succeeded and the row is graded
                assert s.grader_class is not None
                assert result.sample is not None
                await rollout.report(await run_grader(s.grader_class, s.grader_config, request, result.sample))


@hookimpl
def osmosis_register_backends() -> list[BackendSpec]:
    return [BackendSpec("inline", InlineBackend, config_type=InlineConfig, description="On this event loop.")]
