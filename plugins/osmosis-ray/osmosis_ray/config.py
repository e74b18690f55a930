"""The settings of the ``ray`` backend: the run config's ``[backend.ray]`` table.

Every key is optional; with none, ``--backend ray`` starts a local Ray cluster on this machine,
runs one actor per free CPU, and stops the cluster at the end of the run. A complete table::

    [backend.ray]
    address = "auto"              # a running cluster (`ray start`, $RAY_ADDRESS); or "ray://head:10001",
                                  # or "host:port"; unset: this process's Ray, else $RAY_ADDRESS, else a
                                  # new local cluster that the run stops when it ends
    # namespace = "osmosis"
    actors = 4                    # default: [run] workers when > 1, else one per free CPU (cpus_per_actor each)
    cpus_per_actor = 1.0          # Ray resources each actor reserves (never GPUs)
    concurrency_per_actor = 64    # rollouts at once per actor; default: [run] concurrency split over the actors
    chunk_size = 64               # requests sent to an actor in one call at most (1: one call per rollout)
    batch_window_ms = 10.0        # requests to an actor, and results from it, gather this long before they
                                  # travel together (a Ray call costs ~1 ms of CPU a side whatever it carries)
    max_infra_attempts = 5        # tries of a rollout whose actor died / node was lost / result was lost
    retry_backoff_sec = 0.5       # first wait before such a retry (doubling, with jitter) ...
    retry_backoff_max_sec = 10.0  # ... up to this
    isolate_after_deaths = 2      # a rollout in flight on this many dead actors is run alone, once
    watchdog_grace_sec = 30.0     # past agent + grader timeout + this, a rollout is reported `timeout`
    unavailable_after_sec = 120.0 # no live actor this long: rollouts not yet started stop the run (resumable)
    start_timeout_sec = 180.0     # actors (and their runtime environment) must be up within this
    dependencies = "auto"         # the rollout's declared dependencies: "auto" installs (runtime_env pip)
                                  # only those some node lacks; "install" always; "none" never
    ship_code = true              # the rollout folder reaches the actors as Ray's working_dir
    log_to_driver = true          # actors' stdout/stderr on this terminal
    inner = "local"               # the backend each actor hosts: "local", or "harbor" (trials on the nodes)

    [backend.ray.runtime_env]     # merged into the actors' Ray runtime environment
    env_vars = { HF_HOME = "/data/hf" }
    # pip = ["my-tools==1.2"]     # added to the rollout's missing dependencies
    # excludes = ["*.parquet"]    # not shipped, besides Ray's defaults and the folder's .gitignore

    [backend.ray.inner_config]    # the inner backend's own table, as it would be under [backend.<inner>]
    # n_concurrent = 4

    [backend.ray.local_cluster]   # only when this backend starts the cluster (no address)
    num_cpus = 8                  # default: Ray's detection
    temp_dir = "/tmp/ray"         # Ray's session folder (keep it short: unix socket paths are limited)
    include_dashboard = false

Which workflow and grader run, and their settings, are the run's (``[rollout]``), as on every backend.

>>> from osmosis_core.plugin import structure_table
>>> cfg = structure_table({"actors": 2, "inner_config": {"n_concurrent": 2}}, RayBackendConfig, "$", "doc")
>>> cfg.actors, cfg.inner, cfg.chunk_size, cfg.inner_config
(2, 'local', 64, {'n_concurrent': 2})
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["DEPENDENCY_MODES", "LocalClusterSection", "RayBackendConfig"]

DEPENDENCY_MODES = ("auto", "install", "none")


def _one_of(*choices: str) -> Any:
    def check(_inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in choices:
            raise ValueError(f"{attribute.name} must be one of {', '.join(map(repr, choices))}, got {value!r}")

    return check


def _at_least(low: float, *, optional: bool = False) -> Any:
    def check(_inst: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
        if value is None and optional:
            return
        if value is None or value < low:
            raise ValueError(f"{attribute.name} must be >= {low:g}, got {value}")

    return check


def _address(_inst: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not value.strip():
        raise ValueError(f"{attribute.name} must be 'auto', 'ray://host:port', 'host:port', or left unset")


def _not_ray(_inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value.strip().lower() == "ray":
        raise ValueError(f"{attribute.name} cannot be 'ray' (an actor hosts a backend that runs rollouts itself)")


@attrs.define(kw_only=True)
class LocalClusterSection:
    """``[backend.ray.local_cluster]``: how the local cluster is started when no address is given."""

    num_cpus: int | None = attrs.field(default=None, validator=_at_least(1, optional=True))
    """CPUs the cluster offers; default: Ray's own detection."""
    temp_dir: str | None = None
    """Ray's temporary folder (sessions, logs, sockets); default Ray's (``$RAY_TMPDIR/ray`` or ``/tmp/ray``)."""
    include_dashboard: bool = False
    object_store_memory: int | None = attrs.field(default=None, validator=_at_least(78643200, optional=True))
    """Bytes of the object store (Ray's default: 30% of memory)."""


@attrs.define(kw_only=True)
class RayBackendConfig:
    """``[backend.ray]``: where the cluster is, how many actors, how rollouts are sent and retried.

    See the module docstring for every key with its default.
    """

    address: str | None = attrs.field(default=None, validator=_address)
    namespace: str | None = None
    actors: int | None = attrs.field(default=None, validator=_at_least(1, optional=True))
    cpus_per_actor: float = attrs.field(default=1.0, validator=_at_least(0))
    concurrency_per_actor: int | None = attrs.field(default=None, validator=_at_least(1, optional=True))
    chunk_size: int = attrs.field(default=64, validator=_at_least(1))
    batch_window_ms: float = attrs.field(default=10.0, validator=_at_least(0))
    max_infra_attempts: int = attrs.field(default=5, validator=_at_least(1))
    retry_backoff_sec: float = attrs.field(default=0.5, validator=_at_least(0))
    retry_backoff_max_sec: float = attrs.field(default=10.0, validator=_at_least(0))
    isolate_after_deaths: int = attrs.field(default=2, validator=_at_least(1))
    watchdog_grace_sec: float = attrs.field(default=30.0, validator=_at_least(0))
    unavailable_after_sec: float = attrs.field(default=120.0, validator=_at_least(0))
    start_timeout_sec: float = attrs.field(default=180.0, validator=_at_least(1))
    dependencies: str = attrs.field(default="auto", validator=_one_of(*DEPENDENCY_MODES))
    ship_code: bool = True
    log_to_driver: bool = True
    runtime_env: dict[str, Any] = attrs.field(factory=dict)
    inner: str = attrs.field(default="local", validator=_not_ray)
    inner_config: dict[str, Any] = attrs.field(factory=dict)
    local_cluster: LocalClusterSection = attrs.field(factory=LocalClusterSection)
