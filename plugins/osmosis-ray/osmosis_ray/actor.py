"""The actor side: :class:`RolloutActor`, an async Ray actor hosting one inner backend on a node.

An actor is an event loop, not a rollout: it runs up to its share of the run's concurrency at
once, each rollout through its inner backend (``local`` by default, any registered backend by
name), and returns each rollout's results (both stages) as pickled records. Workflow and grader
failures are results there, classified by the inner backend as ``local`` classifies them.

Methods, by concurrency group:

* default (the actor's main event loop): :meth:`ready`; :meth:`submit` (start many rollouts, return
  at once) and :meth:`results` (one streaming generator per actor: the outcomes of every submitted
  rollout as they finish, those finishing within a short window in one item), so one Ray call
  carries many requests and one stream item many results; :meth:`run_one` (one rollout, one plain
  call: for Ray Client, which has no streaming generators); :meth:`shutdown`;
* ``control`` (its own loop and thread, so it answers while rollouts run, or while a rollout
  blocks the main loop): :meth:`health`, :meth:`cancel`.

The backend applies ``ray.remote`` with its options (restarts, resources, runtime environment);
this module imports Ray, the package's entry modules do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import ray

from osmosis_core import ErrorCategory, ErrorInfo, ExecutionRequest, ExecutionResult, ExecutionStatus
from osmosis_core.plugin import (
    BackendSetup,
    ExecutionBackend,
    RolloutReports,
    RunLimits,
    clip,
    error_info,
    get_registry,
    run_one,
)
from osmosis_ray.failures import failure_result
from osmosis_ray.shipping import CodeLoadError, RolloutCode

__all__ = ["ActorSpec", "Outcome", "RolloutActor"]

_ray: Any = ray

CONTROL = "control"
"""The concurrency group of the methods that must answer while rollouts run."""

_BEAT_SEC = 0.2

Outcome = tuple[str, list[ExecutionResult]]
"""One rollout's results, in stage order, under its rollout id."""


@attrs.frozen
class ActorSpec:
    """What an actor is for: its inner backend, its share of the concurrency, the run's paths."""

    name: str
    """How the driver calls it in messages (``actor 3``, ``the quarantine actor``)."""
    inner: str = "local"
    capacity: int = 4
    """Rollouts at once here: the actor's share of the run's concurrency."""
    grader_capacity: int | None = None
    """Grader stages at once here: its share of the grader limit (None: ``capacity``)."""
    require_labels: bool = False
    run_dir: str | None = None
    config_root: str | None = None
    dataset_path: str | None = None


class RolloutActor:
    """Hosts the inner backend; see the module docstring. Built by Ray, on a node, from pickled args."""

    def __init__(self, code: RolloutCode, spec: ActorSpec) -> None:
        context = ray.get_runtime_context()
        self._spec = spec
        self._node_id: str = context.get_node_id()
        self._node_ip = str(_ray.util.get_node_ip_address())
        self._pid = os.getpid()
        self._tasks: dict[str, asyncio.Task[Outcome]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Queue[Outcome] | None = None
        self._beater: asyncio.Task[None] | None = None
        self._started_tasks: set[asyncio.Task[Outcome]] = set()
        self._beat = time.monotonic()
        self._started = 0
        self._finished = 0
        self._backend: ExecutionBackend | None = None
        self._broken: str | None = None
        try:
            self._backend = self._build(code, spec)
        except CodeLoadError as exc:
            self._broken = f"{self.where}: cannot import the rollout's code: {exc}"
        except Exception as exc:
            info = error_info(exc)
            self._broken = f"{self.where}: cannot build the {spec.inner!r} backend: {info.message}"
        gc.freeze()  # Ray's, the rollout's and the backend's start-up live as long as the actor: collections skip them

    @property
    def where(self) -> str:
        """``node 10.0.0.3 (node id 1a2b3c4d)``: the node, as messages name it."""
        return f"node {self._node_ip} (node id {self._node_id[:8]})"

    @staticmethod
    def _build(code: RolloutCode, spec: ActorSpec) -> ExecutionBackend:
        objects = code.load()
        rollout_dir = Path.cwd() if code.shipped else (Path(code.origin) if code.origin else None)
        setup = BackendSetup(
            workflow_class=objects["workflow"],
            workflow_config=objects["workflow_config"],
            grader_class=objects.get("grader"),
            grader_config=objects.get("grader_config"),
            backend_config=objects.get("inner_config"),
            rollout_dir=rollout_dir,
            run_dir=Path(spec.run_dir) if spec.run_dir else None,
            config_root=Path(spec.config_root) if spec.config_root else None,
            dataset_path=Path(spec.dataset_path) if spec.dataset_path else None,
            workers=1,
            require_labels=spec.require_labels,
            limits=RunLimits(spec.capacity, spec.grader_capacity),
        )
        factory = get_registry().backend(spec.inner).resolve_factory()
        backend = factory(setup)
        if not isinstance(backend, ExecutionBackend):
            raise TypeError(f"the {spec.inner!r} backend factory returned {type(backend).__name__}")
        return backend

    # -- the main loop ------------------------------------------------------------------------------

    def _attach(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._done = asyncio.Queue()
            self._beater = self._loop.create_task(self._heartbeat())
        return self._loop

    async def _heartbeat(self) -> None:
        """Stamps the time while the main loop turns: a blocked loop shows in :meth:`health`."""
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(_BEAT_SEC)

    async def ready(self) -> dict[str, Any]:
        """Where this actor runs, and why it cannot run rollouts (``broken``), if it cannot."""
        self._attach()
        return {"node_id": self._node_id, "node_ip": self._node_ip, "pid": self._pid, "broken": self._broken}

    async def run_one(self, request: ExecutionRequest) -> Outcome:
        """Run one rollout; its results in stage order."""
        self._attach()
        task = asyncio.current_task()
        assert task is not None
        return await self._run(request, task)

    async def submit(self, requests: list[ExecutionRequest]) -> int:
        """Start ``requests``; their outcomes go to :meth:`results`. Returns at once (how many were started)."""
        loop = self._attach()
        for request in requests:
            task: asyncio.Task[Outcome] = loop.create_task(self._run_to_results(request))
            self._started_tasks.add(task)
            task.add_done_callback(self._started_tasks.discard)
        return len(requests)

    async def _run_to_results(self, request: ExecutionRequest) -> Outcome:
        task = asyncio.current_task()
        assert task is not None
        outcome = await self._run(request, task)
        assert self._done is not None
        self._done.put_nowait(outcome)
        return outcome

    async def results(self, window_sec: float) -> AsyncIterator[list[Outcome]]:
        """The outcomes of submitted rollouts as they finish (a streaming generator that never ends):
        each item holds every outcome finished within ``window_sec`` of the first one it holds."""
        self._attach()
        assert self._done is not None
        done = self._done
        while True:
            items = [await done.get()]
            if window_sec > 0:
                await asyncio.sleep(window_sec)
            while not done.empty():
                items.append(done.get_nowait())
            yield items

    async def _run(self, request: ExecutionRequest, task: asyncio.Task[Outcome]) -> Outcome:
        if self._backend is None:
            message = self._broken or f"{self.where}: the actor has no backend"
            return request.rollout_id, [failure_result(request, ErrorCategory.INFRA_ERROR, message)]
        reports = RolloutReports(request)
        self._tasks[request.rollout_id] = task
        self._started += 1
        try:
            final = await run_one(self._backend, request, reports)
            if final is not reports.last and final.error is not None:  # what went wrong around the inner backend
                inner = f"{self.where}: the {self._spec.inner!r} backend"
                message = (
                    f"{inner} is unavailable: {reports.unavailable}"
                    if reports.unavailable is not None
                    else f"{inner}: {final.error.message}"
                )
                error = ErrorInfo(final.error.category, clip(message, request.policy.secrets(), limit=1000))
                final = attrs.evolve(final, error=error)  # the sample and timings reported so far kept
        except asyncio.CancelledError:
            # cancelled through cancel() or shutdown(): the inner backend reported the cancelled stage
            last = reports.last
            cancelled = last is not None and last.status is ExecutionStatus.CANCELLED
            final = last if last is not None and cancelled else reports.cancelled(f"{self.where}: rollout cancelled")
            task.uncancel()
        finally:
            self._finished += 1
            if self._tasks.get(request.rollout_id) is task:
                del self._tasks[request.rollout_id]
        results = reports.results()
        return request.rollout_id, results if results and results[-1] is final else [*results, final]

    async def shutdown(self) -> int:
        """Cancel every rollout here, wait for them, close the inner backend; how many were cancelled."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._backend is not None:
            with contextlib.suppress(Exception):
                await self._backend.aclose()
        return len(tasks)

    # -- the control group (its own loop) -----------------------------------------------------------

    @ray.method(concurrency_group=CONTROL)
    async def health(self) -> dict[str, Any]:
        """Load and liveness, answered even while the main loop is busy or blocked."""
        inner: dict[str, Any] = {}
        if self._backend is not None:
            with contextlib.suppress(Exception):
                inner = self._backend.health()
        return {
            "node_id": self._node_id,
            "node_ip": self._node_ip,
            "pid": self._pid,
            "running": len(self._tasks),
            "started": self._started,
            "finished": self._finished,
            "loop_lag_sec": round(time.monotonic() - self._beat, 3) if self._loop is not None else 0.0,
            "broken": self._broken,
            "inner": inner,
        }

    @ray.method(concurrency_group=CONTROL)
    async def cancel(self, rollout_ids: list[str]) -> int:
        """Cancel these rollouts (on the main loop); how many were running here."""
        loop = self._loop
        found = 0
        for rollout_id in rollout_ids:
            task = self._tasks.get(rollout_id)
            if task is not None and loop is not None:
                loop.call_soon_threadsafe(task.cancel)
                found += 1
        return found
