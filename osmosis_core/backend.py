"""The seam every backend implements, and the records a backend plugin registers.

A backend receives one :class:`ExecutionRequest` at a time, runs the workflow (and the grader)
somewhere, and reports each stage through the callbacks; :mod:`osmosis_core.lifecycle` keeps the
rules every backend must (each callback once, in order; the categories; the cancellation report).
A whole backend plugin (``osmosis_core/testing/example_backend.py``, the README's example)::

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
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypedDict

import attrs

from osmosis_core.errors import RolloutLoadError
from osmosis_core.records import ExecutionRequest, ExecutionResult, ExecutionStage
from osmosis_core.workflow import AgentWorkflow, AgentWorkflowConfig, Grader, GraderConfig

__all__ = [
    "BackendSetup",
    "BackendSpec",
    "ExecutionBackend",
    "ResultCallback",
    "RunLimits",
    "load_object",
    "report_cancelled",
    "resolve_config_object",
    "resolve_object",
]

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

    :class:`~osmosis_core.lifecycle.RolloutReporter` does this (and knows the stage) for you.

    :param detail: appended to the message, e.g. ``" (trial kept: /runs/x/trials/y)"``.
    """
    import anyio

    from osmosis_core.lifecycle import cancelled_result

    callback = on_workflow_complete if stage is ExecutionStage.WORKFLOW else on_grader_complete
    if callback is not None:
        with anyio.CancelScope(shield=True):
            await callback(cancelled_result(rollout_id, stage, timings=timings, detail=detail))


def _limit(_instance: Any, attribute: Any, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{attribute.name} must be >= 1 or None, got {value}")


@attrs.frozen
class RunLimits:
    """How many rollouts run at once: the run's settings, carried from the config to what enforces them.

    ``osmosis run`` builds it from ``[run] concurrency`` (``--concurrency``) and hands it to the
    backend's factory in :attr:`BackendSetup.limits`; the author's ``workflow_config`` is never
    written. An unset limit is the author's (:meth:`resolve`).

    >>> from osmosis_core import AgentWorkflowConfig
    >>> RunLimits().resolve(AgentWorkflowConfig(), None)
    RunLimits(concurrency=4, grader_concurrency=4)
    >>> RunLimits(concurrency=10).resolve(AgentWorkflowConfig(), None).split(4)
    RunLimits(concurrency=3, grader_concurrency=3)
    """

    concurrency: int | None = attrs.field(default=None, validator=_limit)
    """Workflows at once over the whole backend; None: ``workflow_config.concurrency`` (default 4)."""
    grader_concurrency: int | None = attrs.field(default=None, validator=_limit)
    """Grader stages at once; None: the grader config's, else :attr:`concurrency`."""

    def resolve(self, workflow_config: AgentWorkflowConfig, grader_config: GraderConfig | None) -> RunLimits:
        """Both limits as numbers, each unset one taken from the author's config (or the default of 4)."""
        concurrency = self.concurrency or workflow_config.concurrency.limit
        grading = self.grader_concurrency
        if grading is None and grader_config is not None:
            grading = grader_config.concurrency.max_concurrent
        return RunLimits(concurrency, grading or concurrency)

    def split(self, parts: int) -> RunLimits:
        """One of ``parts`` even shares of resolved limits (rounded up, at least 1): what each worker
        process or actor enforces so that together they keep the limits."""
        assert self.concurrency is not None, "split() takes resolved limits (see resolve())"
        grading = self.grader_concurrency or self.concurrency
        return RunLimits(max(1, -(-self.concurrency // parts)), max(1, -(-grading // parts)))


class SetupPaths(TypedDict):
    """:meth:`BackendSetup.paths`: the run's paths, as keyword arguments."""

    rollout_dir: Path | None
    run_dir: Path | None
    config_root: Path | None
    dataset_path: Path | None


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
    limits: RunLimits = RunLimits()
    """The run's concurrency limits (``[run] concurrency``); an unset one is the author's config's."""

    def __attrs_post_init__(self) -> None:
        # a config left out is its class's default: every reader of a setup sees the same objects
        if self.workflow_config is None:
            object.__setattr__(self, "workflow_config", self.workflow_class.config_type())
        if self.grader_config is None and self.grader_class is not None:
            object.__setattr__(self, "grader_config", self.grader_class.config_type())

    @classmethod
    def resolve(
        cls,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader[Any]] | str | None = None,
        grader_config: GraderConfig | str | None = None,
        *,
        backend_config: Any = None,
        require_labels: bool = False,
        limits: RunLimits | None = None,
        max_concurrent: int | None = None,
        **paths: Any,
    ) -> BackendSetup:
        """A setup from a backend constructor's arguments, each class given as a class or an import
        path and each config as an object, an import path, or None (its class's default): what
        :class:`~osmosis_core.LocalBackend` and the other backends' constructors do with theirs.

        >>> setup = BackendSetup.resolve("osmosis_core.testing.contract:ContractWorkflow")
        >>> setup.workflow_class.__name__, type(setup.workflow_config).__name__, setup.grader_class
        ('ContractWorkflow', 'AgentWorkflowConfig', None)

        ``max_concurrent``, a backend constructor's own limit, overrides ``limits.concurrency``.

        :raises TypeError: a class or config that cannot be imported or is not of its kind.
        """
        try:
            workflow_class = resolve_object(workflow, AgentWorkflow, what="workflow")
            grader_class = None if grader is None else resolve_object(grader, Grader, what="grader")
            if workflow_config is not None:
                workflow_config = resolve_config_object(workflow_config, AgentWorkflowConfig, what="workflow_config")
            if grader_config is not None:
                grader_config = resolve_config_object(grader_config, GraderConfig, what="grader_config")
        except RolloutLoadError as exc:
            raise TypeError(str(exc)) from None
        limits = limits or RunLimits()
        if max_concurrent is not None:
            limits = attrs.evolve(limits, concurrency=max_concurrent)
        return cls(
            workflow_class,
            workflow_config,  # type: ignore[arg-type]  # None: the class's default (__attrs_post_init__)
            grader_class,
            grader_config,  # type: ignore[arg-type]
            backend_config,
            require_labels=require_labels,
            limits=limits,
            **paths,
        )

    def grades(self, request: ExecutionRequest) -> bool:
        """Whether ``request`` gets a grader stage: a grader is configured, the request asks for one
        (``grade``, true by default) and the row has a label, or ``require_labels`` makes a row
        without one fail there (``validation_error``). The one grading rule of every backend."""
        return self.grader_class is not None and request.grade and (request.label is not None or self.require_labels)

    def rollout_args(
        self,
    ) -> tuple[type[AgentWorkflow[Any]], AgentWorkflowConfig, type[Grader[Any]] | None, GraderConfig | None]:
        """``(workflow_class, workflow_config, grader_class, grader_config)``: the leading arguments of
        a backend class that takes them the way :class:`~osmosis_core.LocalBackend` does."""
        return self.workflow_class, self.workflow_config, self.grader_class, self.grader_config

    def paths(self) -> SetupPaths:
        """The run's paths as keyword arguments: ``rollout_dir``, ``run_dir``, ``config_root``, ``dataset_path``."""
        return SetupPaths(
            rollout_dir=self.rollout_dir,
            run_dir=self.run_dir,
            config_root=self.config_root,
            dataset_path=self.dataset_path,
        )


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


def resolve_object(spec: Any, base: type[Any], *, module: ModuleType | None = None, what: str | None = None) -> Any:
    """The class ``spec`` names, checked to be a ``base`` subclass: the one place a string becomes a class.

    ``spec`` is a class, an import path (``"pkg.mod:Class"`` or ``"pkg.mod.Class"``), or the name
    of a class in ``module`` (a rollout's entrypoint): what ``[rollout] workflow = ...`` and the
    backends' constructors accept.

    >>> from osmosis_core import AgentWorkflow
    >>> resolve_object("osmosis_core.testing.contract:ContractWorkflow", AgentWorkflow).__name__
    'ContractWorkflow'

    :raises RolloutLoadError: it cannot be imported, or is not a ``base`` subclass.
    """
    label = what or base.__name__
    obj = spec
    if isinstance(spec, str):
        try:
            if ":" in spec or (module is None and "." in spec):
                obj = load_object(spec)
            elif module is not None and hasattr(module, spec):
                obj = getattr(module, spec)
            else:
                where = (
                    f"the entrypoint {module.__file__}" if module is not None else "an import path like 'pkg.mod:Class'"
                )
                raise RolloutLoadError(f"{label} {spec!r} is not defined in {where}")
        except (ImportError, AttributeError, ValueError) as exc:
            raise RolloutLoadError(f"cannot import the {label} {spec!r}: {type(exc).__name__}: {exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise RolloutLoadError(f"the {label} must be a {base.__name__} subclass or an import path to one, got {spec!r}")
    return obj


def resolve_config_object(spec: Any, base: type[Any], *, what: str) -> Any:
    """A config object: an instance of ``base``, or an import path to one (``"pkg.mod:CONFIG"``).

    :raises RolloutLoadError: it cannot be imported, or is not a ``base`` instance.
    """
    obj = spec
    if isinstance(spec, str):
        try:
            obj = load_object(spec)
        except (ImportError, AttributeError, ValueError) as exc:
            raise RolloutLoadError(f"cannot import the {what} {spec!r}: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, base):
        raise RolloutLoadError(f"the {what} must be a {base.__name__} (or an import path to one), got {spec!r}")
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
        return load_object(self.factory) if isinstance(self.factory, str) else self.factory

    def resolve_config_type(self) -> type[Any] | None:
        """The config type, imported if it was given as a path."""
        return load_object(self.config_type) if isinstance(self.config_type, str) else self.config_type
