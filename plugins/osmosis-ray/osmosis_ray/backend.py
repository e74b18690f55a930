"""``RayBackend``: the ``ray`` backend. Rollouts run in async Ray actors, each hosting an inner backend.

The driver (this process) keeps every decision; the actors only run rollouts::

    driver: RayBackend.execute(request)                      node: RolloutActor (async, many rollouts)
      slot of the run's concurrency  --(pickled requests)-->   inner backend (LocalBackend by default)
      least-busy healthy actor       <--(pickled results)---   workflow / grader failures -> results
      retry Ray's failures, isolate poison rows, watchdog, callbacks here

* **Dispatch.** At most ``max_concurrency`` rollouts in flight over the cluster, each on the
  healthy actor with the fewest in flight (:mod:`osmosis_ray.dispatch` sends them in chunks and
  streams results back in completion order). The seam's callbacks fire here, on the driver,
  once per stage, when the rollout's results arrive.
* **Failures as data.** A workflow's or grader's failure is the inner backend's result, classified
  as ``local`` classifies it, and final. Only Ray's own failures (actor died, node lost, object
  lost) are retried, on another actor, after a backoff, up to ``max_infra_attempts``. A rollout
  that was in flight on ``isolate_after_deaths`` actors that died is then run alone on a
  quarantine actor; if it kills that one too it is reported ``infra_error`` naming the row, and
  the other rollouts are unaffected. A rollout still unanswered ``watchdog_grace_sec`` after its
  agent and grader timeouts is reported ``timeout``; if its actor's event loop is blocked, the
  actor is restarted and its other rollouts are retried elsewhere.
* **Cancellation.** A cancelled ``execute`` (Ctrl-C, SIGTERM, a server's cancel) reports the
  rollout ``cancelled`` and asks its actor to cancel it; ``aclose()`` cancels whatever still runs
  on the actors, lets the inner backends close, then ends the actors (and the local cluster, if
  this backend started it).
* **Unavailable.** When no actor has been usable for ``unavailable_after_sec`` (or the cluster is
  gone), a rollout that never started raises :class:`~osmosis_core.plugin.BackendUnavailable`, which
  ``osmosis run`` turns into a clean, resumable stop.

In code, as ``osmosis run --backend ray`` builds it::

    from osmosis_ray import RayBackend, RayBackendConfig

    backend = RayBackend(MultiplyWorkflow, grader=MultiplyGrader, rollout_dir="rollouts/multiply-plain",
                         config=RayBackendConfig(actors=2), max_concurrent=64)
    try:
        await backend.execute(request, on_workflow_complete, on_grader_complete)
    finally:
        await backend.aclose()
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import stamina

from osmosis_core import (
    AgentWorkflow,
    AgentWorkflowConfig,
    ConfigError,
    ErrorCategory,
    ExecutionRequest,
    ExecutionResult,
    Grader,
    GraderConfig,
    InfraError,
)
from osmosis_core.plugin import (
    BackendSetup,
    BackendUnavailable,
    ExecutionBackend,
    ResultCallback,
    RolloutReporter,
    RunLimits,
    get_registry,
    structure_table,
)
from osmosis_ray.cluster import ClusterLink, connect, is_loopback_url, ray_api
from osmosis_ray.config import RayBackendConfig
from osmosis_ray.dispatch import BROKEN, HEALTHY, ActorFailure, ActorSlot, Dispatcher
from osmosis_ray.failures import describe, failure_result, prompt_excerpt
from osmosis_ray.shipping import declared_requirements, missing_requirements, pack_rollout_code, upload_local_paths

__all__ = ["RayBackend"]

log = logging.getLogger("osmosis_ray")

_STOP_GRACE_SEC = 10.0
_HUNG_PROBE_SEC = 10.0
_EXTRA_CALLS = 8
"""Actor call slots beyond its rollout capacity (batches, probes of the default group)."""


class _WatchdogExpired(Exception):
    pass


class RayBackend(ExecutionBackend):
    """Rollouts on a Ray cluster, in async actors each hosting an inner backend (see the module docstring).

    :param workflow: the :class:`AgentWorkflow` subclass (or an import path), as for ``LocalBackend``.
    :param workflow_config: its config; :param grader: the grader class, or None; :param grader_config: its config.
    :param config: the ``[backend.ray]`` settings (:class:`RayBackendConfig`); default: all defaults.
    :param max_concurrent: rollouts at once over the cluster (default: the workflow config's limit);
        ``concurrency_per_actor`` in ``config`` overrides it (then it is that times the actors).
    :param require_labels: fail an unlabelled row (``validation_error``) instead of running it ungraded.
    :param rollout_dir: the rollout's folder: shipped to the actors as Ray's working dir, its
        declared dependencies installed where a node lacks them (``config.dependencies``).
    :param run_dir: :param config_root: :param dataset_path: the run's paths, handed to the inner backend.
    :param workers: ``[run] workers``: the number of actors when ``config.actors`` is unset.
    :param limits: the run's limits (:class:`~osmosis_core.plugin.RunLimits`) over the whole cluster;
        ``max_concurrent`` overrides its ``concurrency``.

    Building it attaches to (or starts) the cluster, starts the actors and waits until they are
    up: an unreachable cluster, a runtime environment Ray cannot set up, or actors that cannot be
    placed raise :class:`~osmosis_core.InfraError` here, before any rollout.
    """

    def __init__(
        self,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader[Any]] | str | None = None,
        grader_config: GraderConfig | str | None = None,
        *,
        config: RayBackendConfig | None = None,
        max_concurrent: int | None = None,
        require_labels: bool = False,
        rollout_dir: Path | str | None = None,
        run_dir: Path | str | None = None,
        config_root: Path | str | None = None,
        dataset_path: Path | str | None = None,
        workers: int = 1,
        limits: RunLimits | None = None,
    ) -> None:
        # the workflow and grader, their configs and which requests get a grader stage (for the
        # watchdog's deadline): resolved once
        self.setup = BackendSetup.resolve(
            workflow,
            workflow_config,
            grader,
            grader_config,
            require_labels=require_labels,
            limits=limits,
            max_concurrent=max_concurrent,
        )
        self.config = config if config is not None else RayBackendConfig()
        self.rollout_dir = Path(rollout_dir).resolve() if rollout_dir is not None else None
        self._config_root = Path(config_root) if config_root is not None else None
        self._inner_config = self._structure_inner(self.config)
        self._closed = False
        self._actors: list[ActorSlot] = []
        self._quarantine: ActorSlot | None = None
        self._implicated: dict[str, int] = {}
        self._poison: list[str] = []
        self._retried = 0
        self._watchdog_timeouts = 0
        self._checked_urls: set[str] = set()
        self._warned_loopback = False
        self._down_since: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._quarantine_lock: asyncio.Lock | None = None
        self._waiting = 0
        self._make_quarantine: Callable[[], ActorSlot]
        self._link: ClusterLink = connect(self.config, self._config_root)
        try:
            self._start(workers, require_labels, run_dir, config_root, dataset_path)
        except BaseException:
            self._kill_actors()
            self._link.close()
            raise

    # -- construction ------------------------------------------------------------------------------------

    @classmethod
    def from_setup(cls, setup: BackendSetup) -> RayBackend:
        """The factory registered for the ``ray`` backend (``osmosis run --backend ray``)."""
        config = setup.backend_config if isinstance(setup.backend_config, RayBackendConfig) else None
        return cls(
            *setup.rollout_args(),
            config=config,
            require_labels=setup.require_labels,
            workers=setup.workers,
            limits=setup.limits,
            **setup.paths(),
        )

    @staticmethod
    def _structure_inner(config: RayBackendConfig) -> Any:
        """The inner backend's config object, read from ``inner_config`` (unknown keys refused, with their path)."""
        spec = get_registry().backend(config.inner)
        config_type = spec.resolve_config_type()
        if config_type is None:
            if config.inner_config:
                problem = f"the {config.inner!r} backend takes no settings @ $.backend.ray.inner_config"
                raise ConfigError("[backend.ray]", [problem])
            return None
        return structure_table(config.inner_config, config_type, "$.backend.ray.inner_config", "[backend.ray]")

    def _start(
        self,
        workers: int,
        require_labels: bool,
        run_dir: Path | str | None,
        config_root: Path | str | None,
        dataset_path: Path | str | None,
    ) -> None:
        ray = ray_api()

        from osmosis_ray.actor import CONTROL, ActorSpec, RolloutActor

        cfg = self.config
        self._node_count = len(self._link.alive_nodes())
        n_actors = cfg.actors or (workers if workers > 1 else 0)
        if not n_actors:
            free = float(ray.available_resources().get("CPU", 0.0))
            n_actors = max(1, math.floor(free / cfg.cpus_per_actor)) if cfg.cpus_per_actor > 0 else self._node_count
        setup = self.setup
        limits = setup.limits  # the run's, as given: resolved below against the configs
        if cfg.concurrency_per_actor is not None:
            limits = attrs.evolve(limits, concurrency=cfg.concurrency_per_actor * n_actors)
        limits = limits.resolve(setup.workflow_config, setup.grader_config)
        self._limit = limits.concurrency or 0
        share = limits.split(n_actors)  # each actor's inner backend keeps its share of both limits
        runtime_env = self._runtime_env()
        objects = {
            "workflow": setup.workflow_class,
            "workflow_config": setup.workflow_config,
            "grader": setup.grader_class,
            "grader_config": setup.grader_config,
            "inner_config": self._inner_config,
        }
        code = pack_rollout_code(
            objects, rollout_dir=self.rollout_dir, ship=cfg.ship_code and self.rollout_dir is not None
        )

        remote = ray.remote(concurrency_groups={CONTROL: 4})(RolloutActor)

        def make(name: str, limits: RunLimits, cpus: float, index: int) -> ActorSlot:
            capacity = limits.concurrency or 1
            spec = ActorSpec(
                name=name,
                inner=cfg.inner,
                capacity=capacity,
                grader_capacity=limits.grader_concurrency,
                require_labels=require_labels,
                run_dir=str(run_dir) if run_dir is not None else None,
                config_root=str(config_root) if config_root is not None else None,
                dataset_path=str(dataset_path) if dataset_path is not None else None,
            )
            options: dict[str, Any] = {
                "num_cpus": cpus,
                "max_restarts": -1,
                "max_task_retries": 0,
                "max_concurrency": capacity + _EXTRA_CALLS,
                "scheduling_strategy": "SPREAD",
            }
            if runtime_env:
                options["runtime_env"] = runtime_env
            handle = remote.options(**options).remote(code, spec)
            return ActorSlot(index, name, handle, capacity)

        def quarantine() -> ActorSlot:
            return make("the quarantine actor", RunLimits(1, 1), 0.0, -1)

        self._make_quarantine = quarantine
        self._actors = [make(f"actor {i}", share, cfg.cpus_per_actor, i) for i in range(n_actors)]
        self._await_ready(self._actors)
        self._dispatch = Dispatcher(
            chunk_size=cfg.chunk_size,
            window_sec=cfg.batch_window_ms / 1000.0,
            streaming=not self._link.client,
        )
        self._dispatch.on_change = self._on_change
        broken = [a for a in self._actors if a.state == BROKEN]
        if broken:
            where = "; ".join(a.broken or "" for a in broken[:3])
            usable = len(self._actors) - len(broken)
            log.warning(
                "%d of %d Ray actors cannot run this rollout (%s)%s",
                len(broken),
                len(self._actors),
                where,
                f"; the other {usable} run every rollout" if usable else "; every rollout fails with infra_error",
            )

    def _await_ready(self, actors: list[ActorSlot]) -> None:
        """Block until every actor answers ``ready()``; a runtime environment or placement failure raises."""
        ray = ray_api()

        refs = {actor.handle.ready.remote(): actor for actor in actors}
        deadline = time.monotonic() + self.config.start_timeout_sec
        left = list(refs)
        while left:
            done, left = ray.wait(left, num_returns=len(left), timeout=max(0.0, deadline - time.monotonic()))
            for ref in done:
                actor = refs[ref]
                try:
                    actor.apply_ready(ray.get(ref))
                except Exception as exc:
                    raise InfraError(f"{actor.name} could not start: {_ray_message(exc)}") from exc
            if left and time.monotonic() >= deadline:
                free = ray.available_resources().get("CPU", 0.0)
                raise InfraError(
                    f"{len(left)} of {len(actors)} Ray actors did not start within {self.config.start_timeout_sec:g} s "
                    f"(each reserves cpus_per_actor={self.config.cpus_per_actor:g} CPU; the cluster has {free:g} "
                    "free): lower [backend.ray] actors or cpus_per_actor, or raise start_timeout_sec"
                )

    def _runtime_env(self) -> dict[str, Any]:
        """The actors' runtime environment: the rollout folder, missing dependencies, the config's additions."""
        cfg = self.config
        env: dict[str, Any] = {}
        if cfg.ship_code and self.rollout_dir is not None:
            env["working_dir"] = str(self.rollout_dir)
        pip = self._dependencies_to_install()
        if pip:
            env["pip"] = pip
        for key, value in cfg.runtime_env.items():
            if key == "env_vars" and isinstance(value, dict):
                env["env_vars"] = {**env.get("env_vars", {}), **{k: str(v) for k, v in value.items()}}
            elif key in ("excludes", "pip") and isinstance(value, list) and isinstance(env.get(key), list):
                env[key] = [*env[key], *value]
            elif key == "working_dir" and isinstance(value, str):
                env[key] = self._resolve(value)
            elif key == "py_modules" and isinstance(value, list):
                env[key] = [self._resolve(v) if isinstance(v, str) and "://" not in v else v for v in value]
            else:
                env[key] = value
        try:
            return upload_local_paths(env, log)
        except Exception as exc:
            raise InfraError(f"cannot upload the rollout's code to the Ray cluster: {_ray_message(exc)}") from exc

    def _resolve(self, value: str) -> str:
        path = Path(value).expanduser()
        if not path.is_absolute() and self._config_root is not None and "://" not in value:
            path = self._config_root / path
        return str(path) if "://" not in value else value

    def _dependencies_to_install(self) -> list[str]:
        """The rollout's declared dependencies Ray must install on the nodes (``config.dependencies``)."""
        ray = ray_api()

        requirements = declared_requirements(self.rollout_dir)
        mode = self.config.dependencies
        if not requirements or mode == "none":
            return []
        if mode == "install":
            return requirements
        if self._link.started_cluster:  # its only node is this machine, with this Python
            missing = missing_requirements(requirements)
            where = "this machine"
        else:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            probe = ray.remote(num_cpus=0, max_retries=0)(missing_requirements)
            refs = {
                node["NodeID"]: probe.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                ).remote(requirements)
                for node in self._link.alive_nodes()
            }
            found: dict[str, list[str]] = {}
            for node_id, ref in refs.items():
                try:
                    found[node_id] = ray.get(ref, timeout=self.config.start_timeout_sec)
                except Exception as exc:
                    log.warning("cannot check the rollout's dependencies on node %s: %s", node_id[:8], describe(exc))
            missing = sorted({req for reqs in found.values() for req in reqs})
            where = ", ".join(f"node {n[:8]}" for n, reqs in found.items() if reqs) or "no node"
        if missing:
            log.warning(
                "the rollout's declared dependencies %s are missing on %s: Ray installs them for the actors "
                '(runtime_env pip; set [backend.ray] dependencies = "none" to rely on the nodes\' environment)',
                ", ".join(missing),
                where,
            )
        return missing

    # -- the seam ---------------------------------------------------------------------------------------

    @property
    def max_concurrency(self) -> int:
        return self._limit

    def grades(self, request: ExecutionRequest) -> bool:
        """Whether ``request`` gets a grader stage (as on the local backend)."""
        return self.setup.grades(request)

    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        self._slots = asyncio.Semaphore(self._limit)
        self._quarantine_lock = asyncio.Lock()
        self._dispatch.attach()

    def _on_change(self) -> None:
        healthy = any(a.state == HEALTHY for a in self._actors)
        if healthy:
            self._down_since = None
        elif self._down_since is None:
            self._down_since = time.monotonic()

    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback,
        on_grader_complete: ResultCallback | None = None,
    ) -> None:
        self._attach()
        self._check_policy(request)
        async with RolloutReporter(
            request, on_workflow_complete, on_grader_complete, grades=self.grades(request)
        ) as rollout:
            for result in await self._run(request):
                await rollout.report(result)

    async def _run(self, request: ExecutionRequest) -> list[ExecutionResult]:
        """The rollout's results from some actor, after retries; or the failure the backend reports."""
        assert self._slots is not None
        cfg = self.config
        rollout_id = request.rollout_id
        tried: set[int] = set()
        causes: list[str] = []
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            try:
                async for retry in stamina.retry_context(on=_retry_wait, attempts=cfg.max_infra_attempts, timeout=None):
                    with retry:
                        attempt = retry.num
                        if self._implicated.get(rollout_id, 0) >= cfg.isolate_after_deaths:
                            return await self._run_isolated(request, causes)
                        actor = await self._actor_for(request, tried, started=attempt > 1)
                        if isinstance(actor, ExecutionResult):
                            return [actor]
                        try:
                            results = await self._attempt(actor, request)
                        except ActorFailure as failure:
                            if not failure.retriable:
                                return [failure_result(request, ErrorCategory.INFRA_ERROR, str(failure))]
                            causes.append(str(failure))
                            if failure.implicated:
                                self._implicated[rollout_id] = self._implicated.get(rollout_id, 0) + 1
                            tried.add(actor.index)
                            if attempt < cfg.max_infra_attempts:
                                self._retried += 1
                            raise _RetryAfter(self._backoff(attempt)) from failure
                        except _WatchdogExpired:
                            return [self._watchdog_result(request, actor)]
                        self._implicated.pop(rollout_id, None)
                        return results
            except _RetryAfter:
                pass  # the last attempt failed too
            message = (
                f"the rollout failed on Ray {cfg.max_infra_attempts} times ({'; '.join(causes[-3:])}); "
                "raise [backend.ray] max_infra_attempts to try more"
            )
            return [failure_result(request, ErrorCategory.INFRA_ERROR, message)]
        finally:
            self._slots.release()

    def _backoff(self, attempt: int) -> float:
        cfg = self.config
        return float(
            min(cfg.retry_backoff_max_sec, cfg.retry_backoff_sec * 2 ** (attempt - 1)) * random.uniform(0.5, 1)
        )

    async def _actor_for(
        self, request: ExecutionRequest, tried: set[int], *, started: bool
    ) -> ActorSlot | ExecutionResult:
        """The least-busy healthy actor with room (preferring one not tried yet), waiting for one if need be."""
        ray = ray_api()

        while True:
            if self._closed or not ray.is_initialized():
                why = "the backend was closed" if self._closed else "this process is no longer connected to Ray"
                if not started:
                    raise BackendUnavailable(f"the ray backend cannot run rollouts: {why}")
                return failure_result(request, ErrorCategory.INFRA_ERROR, f"the rollout could not be retried: {why}")
            best: ActorSlot | None = None
            fallback: ActorSlot | None = None
            for actor in self._actors:
                if not actor.has_room:
                    continue
                if actor.index in tried:
                    if fallback is None or actor.in_flight < fallback.in_flight:
                        fallback = actor
                elif best is None or actor.in_flight < best.in_flight:
                    best = actor
            if best is not None or fallback is not None:
                return best or fallback  # type: ignore[return-value]
            if all(a.state == BROKEN for a in self._actors):
                nodes = "; ".join(dict.fromkeys(a.broken or "" for a in self._actors))
                return failure_result(request, ErrorCategory.INFRA_ERROR, nodes)
            timeout: float | None = None
            if self._down_since is not None:
                left = self.config.unavailable_after_sec - (time.monotonic() - self._down_since)
                if left <= 0:
                    errors = "; ".join(f"{a.describe()}: {a.last_error}" for a in self._actors[:3])
                    message = (
                        f"no Ray actor has been usable for {self.config.unavailable_after_sec:g} s ({errors}); "
                        "the rollouts not started stay to be run"
                    )
                    if not started:
                        raise BackendUnavailable(message)
                    return failure_result(request, ErrorCategory.INFRA_ERROR, message)
                timeout = left
            await self._dispatch.wait(timeout)

    async def _attempt(self, actor: ActorSlot, request: ExecutionRequest) -> list[ExecutionResult]:
        """Send ``request`` to ``actor`` and wait for its results, the watchdog, or a cancellation."""
        pending = self._dispatch.submit(actor, request)
        deadline = self._deadline(request)
        try:
            if deadline is None:
                return await pending.future
            async with asyncio.timeout(deadline):
                return await pending.future
        except TimeoutError:  # the watchdog (awaiting the future directly: the timeout cancelled it)
            self._dispatch.cancel_on_actor(pending)
            self._dispatch.spawn(self._check_hung(actor))
            raise _WatchdogExpired() from None
        except asyncio.CancelledError:
            self._dispatch.cancel_on_actor(pending)
            raise

    def _deadline(self, request: ExecutionRequest) -> float | None:
        """Agent + grader timeouts + the grace; None (no watchdog) when a stage has no timeout."""
        agent = request.agent_timeout_sec
        if agent is None or agent <= 0:
            return None
        total = agent
        if self.grades(request):
            grader = request.grader_timeout_sec
            if grader is None or grader <= 0:
                return None
            total += grader
        return total + self.config.watchdog_grace_sec

    def _watchdog_result(self, request: ExecutionRequest, actor: ActorSlot) -> ExecutionResult:
        self._watchdog_timeouts += 1
        deadline = self._deadline(request) or 0.0
        message = (
            f"{actor.describe()} did not report the rollout within {deadline:g} s (its agent and grader "
            f"timeouts plus watchdog_grace_sec {self.config.watchdog_grace_sec:g}): the actor may be hung "
            "(a workflow blocking its event loop)"
        )
        return failure_result(request, ErrorCategory.TIMEOUT, message)

    async def _check_hung(self, actor: ActorSlot) -> None:
        """After a watchdog expiry: restart the actor if its main loop is blocked, so its other rollouts move."""
        ray = ray_api()

        if actor.state != HEALTHY:
            return
        try:
            async with asyncio.timeout(_HUNG_PROBE_SEC):
                report = await actor.handle.health.remote()
            lag = float(report.get("loop_lag_sec", 0.0))
            why = f"its event loop has been blocked for {lag:.1f} s"
        except Exception as exc:
            lag, why = math.inf, f"it does not answer ({describe(exc)})"
        if lag <= max(1.0, self.config.watchdog_grace_sec) or actor.state != HEALTHY:
            return
        log.warning("%s is hung (%s): restarting it; its other rollouts are retried elsewhere", actor.describe(), why)
        self._dispatch.mark_down(actor, f"restarted: {why}")
        try:
            ray.kill(actor.handle, no_restart=False)
        except Exception as exc:
            log.warning("cannot restart %s: %s", actor.describe(), describe(exc))

    async def _run_isolated(self, request: ExecutionRequest, causes: list[str]) -> list[ExecutionResult]:
        """Run a rollout implicated in several actor deaths alone, on the quarantine actor, once."""
        assert self._quarantine_lock is not None
        rollout_id = request.rollout_id
        async with self._quarantine_lock:
            actor = await self._quarantine_actor()
            if isinstance(actor, str):
                message = f"the rollout was in flight on actors that died ({'; '.join(causes[-3:])}) and {actor}"
                return [failure_result(request, ErrorCategory.INFRA_ERROR, message)]
            try:
                results = await self._attempt(actor, request)
            except ActorFailure as failure:
                if not failure.retriable:
                    return [failure_result(request, ErrorCategory.INFRA_ERROR, str(failure))]
                self._poison.append(rollout_id)
                self._implicated.pop(rollout_id, None)
                excerpt = prompt_excerpt(request)
                message = (
                    f"poison row: rollout {rollout_id}"
                    + (f" (prompt {excerpt!r})" if excerpt else "")
                    + f" was in flight on {len(causes)} Ray actors that died, then killed {failure.actor.describe()} "
                    f"when run alone ({failure.text}); it is not retried (its workflow or grader ends its process)"
                )
                return [failure_result(request, ErrorCategory.INFRA_ERROR, message)]
            except _WatchdogExpired:
                return [self._watchdog_result(request, actor)]
            self._implicated.pop(rollout_id, None)
            return results

    async def _quarantine_actor(self) -> ActorSlot | str:
        """The concurrency-1 actor for suspects, started on first use; healthy, or why it cannot be."""
        if self._quarantine is None:
            self._quarantine = self._make_quarantine()
        actor = self._quarantine
        deadline = time.monotonic() + self.config.start_timeout_sec
        while actor.state != HEALTHY:
            if actor.state == BROKEN:
                return f"cannot be run alone: {actor.broken}"
            if actor.state == "starting":
                try:
                    async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                        actor.apply_ready(await actor.handle.ready.remote())
                except Exception as exc:
                    self._dispatch.mark_down(actor, describe(exc))
                continue
            if time.monotonic() >= deadline:
                return f"the quarantine actor is not available ({actor.last_error})"
            await self._dispatch.wait(1.0)
        return actor

    # -- the policy endpoint -------------------------------------------------------------------------------

    def _check_policy(self, request: ExecutionRequest) -> None:
        url = request.policy.base_url
        if url in self._checked_urls:
            return
        self._checked_urls.add(url)
        if not self._warned_loopback and self._node_count > 1 and is_loopback_url(url):
            self._warned_loopback = True
            log.warning(
                "the policy endpoint %s is a loopback address, but the Ray cluster has %d nodes: actors on other "
                "machines cannot reach it; give the endpoint's routable address (--policy-url)",
                url,
                self._node_count,
            )

    # -- health and closing -----------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        healthy = sum(a.state == HEALTHY for a in self._actors)
        status = "ok" if healthy == len(self._actors) else ("degraded" if healthy else "failed")
        if self._closed:
            status = "failed"
        quarantine = self._quarantine.report() if self._quarantine is not None else None
        return {
            "status": status,
            "backend": "ray",
            "address": self._link.address,
            "started_cluster": self._link.started_cluster,
            "nodes": self._node_count,
            "inner": self.config.inner,
            "max_concurrency": self._limit,
            "in_flight": sum(a.in_flight for a in self._actors) + (quarantine or {}).get("in_flight", 0),
            "waiting": self._waiting,
            "calls": self._dispatch.calls,
            "result_items": self._dispatch.items,
            "retried": self._retried,
            "watchdog_timeouts": self._watchdog_timeouts,
            "poison_rows": list(self._poison),
            "actors": [a.report() for a in self._actors],
            "quarantine": quarantine,
        }

    def _all_slots(self) -> list[ActorSlot]:
        return [*self._actors, *([self._quarantine] if self._quarantine is not None else [])]

    async def aclose(self) -> None:
        """Cancel what still runs on the actors, let their inner backends close, end the actors; then
        disconnect (and stop the local cluster if this backend started it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        ray = ray_api()

        if ray.is_initialized():
            slots = [a for a in self._all_slots() if a.state in (HEALTHY, BROKEN)]
            stops = [asyncio.wrap_future(a.handle.shutdown.remote().future()) for a in slots]
            for stop in stops:  # an actor killed meanwhile fails its call: nothing to report
                stop.add_done_callback(lambda f: f.cancelled() or f.exception())
            if stops:  # a hung actor does not answer: it is killed below anyway
                await asyncio.wait(stops, timeout=_STOP_GRACE_SEC)
        self._dispatch.close(self._all_slots())
        self._kill_actors()
        self._link.close()

    def _kill_actors(self) -> None:
        ray = ray_api()

        if not ray.is_initialized():
            return
        for actor in self._all_slots():
            try:
                ray.kill(actor.handle, no_restart=True)
            except Exception as exc:
                log.debug("cannot kill %s: %s", actor.describe(), exc)


def _ray_message(exc: BaseException) -> str:
    """A Ray error in one line: a runtime environment that failed says why."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text[:800]}"


class _RetryAfter(Exception):
    """An attempt failed on Ray in a way worth another try (on another actor) after ``wait`` seconds."""

    def __init__(self, wait: float) -> None:
        super().__init__(f"retry in {wait:.2f} s")
        self.wait = wait


def _retry_wait(exc: BaseException) -> bool | float:
    """stamina's hook: the wait :meth:`RayBackend._backoff` chose; any other exception is not retried."""
    return exc.wait if isinstance(exc, _RetryAfter) else False
