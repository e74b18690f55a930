"""Everything a plugin author needs from osmosis, under one name: ``osmosis_core.plugin``.

A plugin (a backend, an agent integration, graders, templates, CLI commands) imports from here,
from ``osmosis_core`` (records, the author API, errors) and from ``osmosis_core.testing`` (test
tools) only; the first-party plugins do too, and the ``lint`` session checks it (import-linter).
Names are imported on first use, so a plugin's entry module stays light.

A complete backend plugin::

    # osmosis_echo/plugin.py: the entry point ([project.entry-points.osmosis] echo = "osmosis_echo.plugin")
    from osmosis_core.plugin import BackendSpec, hookimpl

    @hookimpl
    def osmosis_register_backends():
        return [BackendSpec("echo", "osmosis_echo.backend:EchoBackend.from_setup",
                            config_type="osmosis_echo.backend:EchoConfig", description="Echoes.")]

    # osmosis_echo/backend.py
    import anyio, attrs
    from osmosis_core import ExecutionResult, ExecutionStage, ExecutionStatus, RolloutSample
    from osmosis_core.plugin import BackendSetup, ExecutionBackend, report_cancelled

    @attrs.define(kw_only=True)
    class EchoConfig:
        greeting: str = "hi"

    class EchoBackend(ExecutionBackend):
        def __init__(self, greeting: str) -> None:
            self.greeting = greeting

        @classmethod
        def from_setup(cls, setup: BackendSetup) -> "EchoBackend":
            return cls(setup.backend_config.greeting)

        async def execute(self, request, on_workflow_complete, on_grader_complete=None) -> None:
            try:
                sample = RolloutSample(messages=[*request.prompt, {"role": "assistant", "content": self.greeting}])
                await on_workflow_complete(ExecutionResult(
                    request.rollout_id, ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS, sample=sample))
            except anyio.get_cancelled_exc_class():
                await report_cancelled(request.rollout_id, ExecutionStage.WORKFLOW,
                                       on_workflow_complete, on_grader_complete)
                raise

Check it with the backend contract suite (``osmosis_core.testing.BackendContract``).
"""

from osmosis_core.lazy import attach_stub

__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
