"""The seam every backend implements, and the records a backend plugin registers.

A backend receives one :class:`ExecutionRequest` at a time, runs the workflow (and the grader),
and reports each stage through the callbacks. A minimal backend plugin::

    import attrs
    from osmosis_core import BackendSetup, BackendSpec, ExecutionBackend, hookimpl

    @attrs.define(kw_only=True)
    class EchoConfig:
        greeting: str = "hi"

    class EchoBackend(ExecutionBackend):
        def __init__(self, setup: BackendSetup) -> None:
            self.setup = setup

        async def execute(self, request, on_workflow_complete, on_grader_complete=None) -> None:
            ...  # run setup.workflow_class on request.prompt, then await on_workflow_complete(result)

    @hookimpl
    def osmosis_register_backends():
        return [BackendSpec("echo", EchoBackend, config_type=EchoConfig, description="Says hi.")]
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs

from osmosis_core.records import (
    ErrorCategory,
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
)
from osmosis_core.workflow import AgentWorkflow, AgentWorkflowConfig, Grader, GraderConfig

__all__ = ["BackendSetup", "BackendSpec", "ExecutionBackend", "ResultCallback", "load_object", "report_cancelled"]

ResultCallback = Callable[[ExecutionResult], Awaitable[None]]
"""An async callable a backend awaits with each stage's result."""


class ExecutionBackend(abc.ABC):
    """Runs rollouts somewhere: in-process (``local``), in Harbor trials, on Ray, ..."""

    @abc.abstractmethod
    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback,
        on_grader_complete: ResultCallback | None = None,
    ) -> None:
        """Run one rollout: the workflow, then the grader when one is configured.

        Await ``on_workflow_complete`` with the workflow's result; when a grader is configured and
        the workflow succeeded, await ``on_grader_complete`` with the graded result. Failures are
        reported as results (with a category and a message), not raised.
        """

    @property
    def max_concurrency(self) -> int:
        """How many executions this backend runs at once; 0 means no limit."""
        return 0

    def health(self) -> dict[str, Any]:
        """A JSON-ready health report."""
        return {"status": "ok"}

    async def aclose(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Release what the backend holds (pools, sandboxes). Called once at the end of a run."""


async def report_cancelled(
    rollout_id: str,
    stage: ExecutionStage,
    on_workflow_complete: ResultCallback,
    on_grader_complete: ResultCallback | None,
    *,
    timings: dict[str, float] | None = None,
    detail: str = "",
) -> None:
    """Report a rollout cancelled during ``stage`` through that stage's callback, shielded from the
    cancellation that is under way (so the report is delivered). Re-raise the cancellation after::

        except anyio.get_cancelled_exc_class():
            await report_cancelled(request.rollout_id, stage, on_workflow_complete, on_grader_complete)
            raise

    :param detail: appended to the message, e.g. ``" (trial kept: /runs/x/trials/y)"``.
    """
    import anyio

    result = ExecutionResult(
        rollout_id,
        stage,
        ExecutionStatus.CANCELLED,
        error=ErrorInfo(ErrorCategory.CANCELLED, f"rollout cancelled during the {stage} stage{detail}"),
        timings=dict(timings or {}),
    )
    callback = on_workflow_complete if stage is ExecutionStage.WORKFLOW else on_grader_complete
    if callback is not None:
        with anyio.CancelScope(shield=True):
            await callback(result)


@attrs.frozen
class BackendSetup:
    """Everything a backend factory needs to build a backend for one run."""

    workflow_class: type[AgentWorkflow[Any]]
    workflow_config: AgentWorkflowConfig
    grader_class: type[Grader[Any]] | None
    grader_config: GraderConfig | None
    backend_config: Any
    """The backend's own config: an instance of its spec's ``config_type`` (from ``[backend.<name>]``)."""
    rollout_dir: Path | None = None
    """The rollout's folder (its code), when the run has one."""
    run_dir: Path | None = None
    """The run's output folder; backends may keep per-rollout files under it."""
    config_root: Path | None = None
    """The folder the run config's relative paths resolve against (resolve your table's paths there too)."""
    dataset_path: Path | None = None
    """The dataset file (a sandboxing backend hides it from rollouts: it holds the labels)."""
    workers: int = 1
    """Processes the backend may run rollouts in (``[run] workers``); the local backend forks a pool when > 1."""
    require_labels: bool = False
    """``[run] require_labels``: a row without a label fails (``validation_error``) instead of running ungraded."""


def load_object(path: str) -> Any:
    """Import ``"package.module:attr"`` (or ``"package.module.attr"``) and return the attribute."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not an import path like 'package.module:Name'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@attrs.frozen
class BackendSpec:
    """What a plugin registers for a backend.

    :param name: the name users type (``--backend NAME``, ``[backend.NAME]``).
    :param factory: a callable ``(BackendSetup) -> ExecutionBackend`` (usually the class), or an
        import path to one, so a plugin's entry module need not import its heavy machinery.
    :param config_type: an attrs class the ``[backend.NAME]`` table is read into (unknown keys
        are rejected); ``None`` if the backend takes no settings.
    :param description: one line for ``osmosis plugins`` and error messages.
    """

    name: str
    factory: Callable[[BackendSetup], ExecutionBackend] | str
    config_type: type[Any] | str | None = None
    description: str = ""

    def resolve_factory(self) -> Callable[[BackendSetup], ExecutionBackend]:
        """The factory, imported if it was given as a path."""
        factory = self.factory
        return load_object(factory) if isinstance(factory, str) else factory  # type: ignore[no-any-return]

    def resolve_config_type(self) -> type[Any] | None:
        """The config type, imported if it was given as a path."""
        ct = self.config_type
        return load_object(ct) if isinstance(ct, str) else ct  # type: ignore[no-any-return]
