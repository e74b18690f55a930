"""``LocalBackend``: runs rollouts in-process on the running event loop (the ``local`` backend).

It keeps the hot path lean: no filesystem work, no threads, one semaphore per stage, one timeout
scope per stage, and a fresh workflow and grader instance (with a config copy) per rollout.

>>> import anyio
>>> from osmosis_core import AgentWorkflow, ExecutionRequest, PolicyEndpoint
>>> class Echo(AgentWorkflow):
...     async def run(self, ctx):
...         return [*ctx.prompt, {"role": "assistant", "content": "hi"}]
>>> results = []
>>> async def collect(result):
...     results.append(result)
>>> request = ExecutionRequest("r1", [{"role": "user", "content": "hello"}],
...                            PolicyEndpoint("http://127.0.0.1:1/v1", "m"))
>>> anyio.run(LocalBackend(Echo).execute, request, collect)
>>> results[0].status.value, len(results[0].sample.messages)
('success', 2)
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import attrs

from osmosis_core.backend import BackendSetup, ExecutionBackend, ResultCallback, RunLimits, load_object
from osmosis_core.lifecycle import RolloutReporter, _context, run_grader, run_workflow
from osmosis_core.records import ExecutionRequest
from osmosis_core.workflow import AgentWorkflow, AgentWorkflowConfig, Grader, GraderConfig

__all__ = ["LocalBackend", "LocalBackendConfig"]


@attrs.define
class LocalBackendConfig:
    """Deprecated since 0.2.0 (the ``local`` backend takes no ``[backend.local]`` table): set the
    limit with ``[run] concurrency``, ``--concurrency`` or ``LocalBackend(max_concurrent=...)``."""

    max_concurrent: int | None = None

    def __attrs_post_init__(self) -> None:
        from osmosis_core.deprecation import warn_deprecated

        replacement = "[run] concurrency or LocalBackend(max_concurrent=...)"
        warn_deprecated("LocalBackendConfig", replacement, "0.2.0", stacklevel=4)


class LocalBackend(ExecutionBackend):
    """Runs each rollout in-process with separate workflow and grader limits and timeouts.

    :param workflow: the :class:`AgentWorkflow` subclass; a new instance per rollout.
    :param workflow_config: its config (copied per rollout); default ``workflow.config_type()``.
    :param grader: the :class:`Grader` subclass, or None for no grading.
    :param grader_config: its config (copied per rollout).
    :param max_concurrent: overrides ``workflow_config.concurrency.max_concurrent`` (default 4).
    :param limits: the run's limits (:class:`~osmosis_core.plugin.RunLimits`, what ``osmosis run`` passes);
        ``max_concurrent`` overrides its ``concurrency``.
    :param require_labels: fail a rollout whose row has no label (``validation_error``) instead of
        running it ungraded (``[run] require_labels``).

    Each class may be given as an import path and each config as an object or an import path,
    as in osmosis-ai: ``LocalBackend(workflow="rollouts.my_rollout.main:MyWorkflow",
    grader="rollouts.my_rollout.main:MyGrader")``.

    Grading runs as :meth:`BackendSetup.grades` says: a row without a label is run and reported
    ungraded (the workflow's result is the last one: success, no reward), as the reference SDK does,
    unless ``require_labels``.
    """

    def __init__(
        self,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader[Any]] | str | None = None,
        grader_config: GraderConfig | str | None = None,
        *,
        max_concurrent: int | None = None,
        require_labels: bool = False,
        limits: RunLimits | None = None,
    ) -> None:
        setup = BackendSetup.resolve(
            workflow,
            workflow_config,
            grader,
            grader_config,
            require_labels=require_labels,
            limits=limits,
            max_concurrent=max_concurrent,
        )
        self._start(setup)

    @classmethod
    def _of(cls, setup: BackendSetup) -> LocalBackend:
        """The backend of a run's setup, its classes and configs taken as resolved (``setup.limits``)."""
        backend = cls.__new__(cls)
        backend._start(setup)
        return backend

    def _start(self, setup: BackendSetup) -> None:
        self.setup = setup
        """The workflow and grader, their configs and the grading rule (:meth:`BackendSetup.grades`)."""
        self.workflow_class: type[AgentWorkflow[Any]] = setup.workflow_class
        self.workflow_config: AgentWorkflowConfig = setup.workflow_config
        self.grader_class: type[Grader[Any]] | None = setup.grader_class
        self.grader_config: GraderConfig | None = setup.grader_config
        self.require_labels = setup.require_labels
        self.limits: RunLimits = setup.limits.resolve(self.workflow_config, self.grader_config)
        """The limits this backend keeps, resolved (both numbers)."""
        self._limit: int = self.limits.concurrency or 0
        self._workflow_slots = anyio.Semaphore(self._limit, fast_acquire=True)
        self._grader_slots = anyio.Semaphore(self.limits.grader_concurrency or self._limit, fast_acquire=True)
        self._queued = 0
        self._running = 0
        self._grading = 0
        self._done = 0

    @classmethod
    def from_setup(cls, setup: BackendSetup) -> ExecutionBackend:
        """Deprecated since 0.2.0: register ``osmosis_core.plugin:local_backend`` (or a
        factory of your own) instead. Kept for plugins written against 0.1's documented API
        (``BackendSpec(name, factory="my_plugin:MyLocalBackend.from_setup")``); it builds ``cls``,
        or a worker pool of ``cls``'s workflow and grader when ``setup.workers`` > 1, as before."""
        from osmosis_core.deprecation import warn_deprecated

        warn_deprecated(f"{cls.__name__}.from_setup", "osmosis_core.plugin:local_backend", "0.2.0")
        if setup.workers > 1:
            # the worker pool sits above this module (it hosts LocalBackends), so the deprecated
            # shim reaches the registered factory at run time rather than importing up a layer
            backend: ExecutionBackend = load_object("osmosis_core._engine.builtin:local_backend")(setup)
            return backend
        return cls(*setup.rollout_args(), require_labels=setup.require_labels, limits=setup.limits)

    @property
    def max_concurrency(self) -> int:
        return self._limit

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "max_concurrency": self._limit,
            "queued": self._queued,
            "running": self._running,
            "grading": self._grading,
            "finished": self._done,
        }

    def grades(self, request: ExecutionRequest) -> bool:
        """Whether ``request`` gets a grader stage (see the class docstring; :meth:`BackendSetup.grades`)."""
        return self.setup.grades(request)

    async def aclose(self) -> None:
        """Close the running loop's HTTP clients (the rollouts' connections to their policies)."""
        from osmosis_core.http import aclose_http

        await aclose_http()

    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback,
        on_grader_complete: ResultCallback | None = None,
    ) -> None:
        submitted = time.perf_counter()
        report = RolloutReporter(request, on_workflow_complete, on_grader_complete, grades=self.grades(request))
        timings = report.timings
        rollout = _context(request)  # (its own copy of the row's metadata)
        self._queued += 1
        queued = True
        # a free slot is taken without a coroutine (``acquire_nowait``; anyio's ``async with`` runs
        # three per semaphore, two semaphores per rollout: bench/local_overhead.py); a cancellation
        # that comes meanwhile is raised at the stage's first await instead of here
        slots = self._workflow_slots
        try:
            if not _took(slots):
                await slots.acquire()
            self._running += 1
            try:
                self._queued -= 1
                queued = False
                timings["queued"] = time.perf_counter() - submitted
                result = await run_workflow(self.workflow_class, self.workflow_config, request, rollout, timings)
            finally:
                self._running -= 1
                slots.release()
            await report.report(result)
            if report.ended:
                return
            assert self.grader_class is not None
            assert result.sample is not None
            slots = self._grader_slots
            if not _took(slots):
                await slots.acquire()
            self._grading += 1
            try:
                graded = await run_grader(
                    self.grader_class, self.grader_config, request, result.sample, rollout, timings
                )
            finally:
                self._grading -= 1
                slots.release()
            await report.report(graded)
        except anyio.get_cancelled_exc_class():  # (the stages report their own failures: only this is left)
            await report.cancelled()
            raise
        finally:
            if queued:
                self._queued -= 1
            self._done += 1


def _took(slots: anyio.Semaphore) -> bool:
    """Take a free slot without awaiting; False when none is free (then ``await slots.acquire()``)."""
    try:
        slots.acquire_nowait()
    except anyio.WouldBlock:
        return False
    return True
