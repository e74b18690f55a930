"""The settings of the ``harbor`` backend: the run config's ``[backend.harbor]`` table.

Every key is optional; with none, ``--backend harbor`` runs the rollout in template mode on the
plugin's own generic task, each rollout in a fresh bubblewrap sandbox. A complete table::

    [backend.harbor]
    mode = "template"                 # or "dataset": rows name existing Harbor tasks
    task_dir = "rollouts/my-rollout/task"   # template mode: the reusable task (default: the plugin's)
    # dataset_dir = "tasks"           # dataset mode: a local dataset, one Harbor task folder per task
    # task_key = "task"               # dataset mode: the row key that names the task
    # code_dir = "rollouts/my-rollout"   # the user code mounted into trials (default: the rollout folder)
    # grade_on_host = false           # true: grade in this process (faster, not sandboxed)
    n_concurrent = 8                  # trials at once (Harbor's TrialQueue); default: run.concurrency
    max_retries = 0                   # Harbor retries of a trial that failed in its machinery
    keep_successful_trials = false    # failed trials are always kept, for debugging
    # trials_dir = "runs/harbor-trials"  # default: <run folder>/harbor-trials

    [backend.harbor.environment]      # where trials run
    type = "bwrap"                    # the plugin's sandbox; or Harbor's "docker", "podman", "daytona", ...
    # import_path = "pkg.mod:MyEnv"   # or any Harbor environment class
    # kwargs = { }                    # passed to the environment's constructor

    [backend.harbor.sandbox]          # the bwrap sandbox's own limits
    memory_mb = 4096                  # per trial; default: the task's [environment].memory_mb, else 4096
    max_processes = 1024
    hide_paths = ["/srv/data"]        # host paths the sandbox must not see even where it shows their folder
    expose_paths = ["/opt/tools"]     # host paths it may see (read-only) beyond the system folders
    image = "auto"                    # "build": each task in its own image (its Dockerfile, built once);
                                      # "host": this machine's tools; "auto": "build" in dataset mode
    # image_cache = "~/.cache/osmosis/images"   # where built images go (default: $OSMOSIS_IMAGE_CACHE, XDG)
    # bases = { "python:3.12-slim" = "bases/py312.tar" }   # bases osmosis cannot make: a rootfs or OCI archive

Which workflow and grader run, and their settings, are the run's (``[rollout]``), as on every backend.

>>> from osmosis_core import structure_table
>>> cfg = structure_table({"n_concurrent": 2, "sandbox": {"memory_mb": 512}}, HarborBackendConfig, "$", "doc")
>>> cfg.mode, cfg.n_concurrent, cfg.sandbox.memory_mb, cfg.environment.type
('template', 2, 512, 'bwrap')
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = [
    "BWRAP_ENVIRONMENT",
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_MEMORY_MB",
    "EnvironmentSection",
    "HarborBackendConfig",
    "SandboxSection",
]

BWRAP_ENVIRONMENT = "bwrap"
"""The ``environment.type`` of the plugin's own sandbox (``osmosis_harbor.sandbox:BubblewrapEnvironment``)."""

DEFAULT_MEMORY_MB = 4096
"""Memory per sandboxed command when neither the sandbox settings nor the task set one."""

DEFAULT_MAX_PROCESSES = 1024
"""Processes (and threads) per sandboxed command."""

MODES = ("template", "dataset")
IMAGE_SETTINGS = ("auto", "build", "host")


def _one_of(*choices: str) -> Any:
    def check(_inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in choices:
            raise ValueError(f"{attribute.name} must be one of {', '.join(map(repr, choices))}, got {value!r}")

    return check


def _positive_or_none(_inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


def _not_negative(_inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


@attrs.define(kw_only=True)
class SandboxSection:
    """``[backend.harbor.sandbox]``: limits and visibility of the bubblewrap sandbox.

    Only used when ``environment.type = "bwrap"``. Each command a trial runs gets a fresh sandbox;
    the trial's commands together are capped in memory and processes (a cgroup when this process
    may create one, else rlimits per command); the host is read-only, home folders, credentials,
    the run folder and every trial's files are hidden.
    """

    memory_mb: int | None = attrs.field(default=None, validator=_positive_or_none)
    """Memory of a trial's commands; None: the task's ``[environment].memory_mb``, else 4096."""
    max_processes: int | None = attrs.field(default=DEFAULT_MAX_PROCESSES, validator=_positive_or_none)
    """Processes and threads of a trial's commands; None for no limit."""
    hide_paths: list[str] = attrs.field(factory=list)
    """More host paths to hide (an empty folder is shown in their place) where a shown folder holds them."""
    expose_paths: list[str] = attrs.field(factory=list)
    """Host paths to show read-only beyond the system folders, this Python and the rollout code
    (e.g. a tool under /opt); a trial sees nothing else of the host."""
    image: str = attrs.field(default="auto", validator=_one_of(*IMAGE_SETTINGS))
    """``build``: a task with ``environment/Dockerfile`` runs in its own image, built once and cached
    (:mod:`osmosis_harbor.images`; needs root, buildah and mmdebstrap); ``host``: on this machine's
    tools; ``auto`` (the default): ``build`` in dataset mode where it can (root, buildah and
    mmdebstrap; else ``host``, saying why once), ``host`` in template mode (whose generic task's
    Dockerfile is for Docker-based environments)."""
    image_cache: str | None = None
    """The folder of built images; default ``$OSMOSIS_IMAGE_CACHE``, else ``$XDG_CACHE_HOME/osmosis/images``."""
    bases: dict[str, str] = attrs.field(factory=dict)
    """Base images osmosis cannot make (``python:3.12-slim``), by name: a rootfs tarball or an OCI archive."""
    bwrap: str | None = None
    """The bubblewrap executable; default ``bwrap`` on PATH."""


@attrs.define(kw_only=True)
class EnvironmentSection:
    """``[backend.harbor.environment]``: which Harbor environment trials run in.

    ``type = "bwrap"`` (the default) is the plugin's sandbox and needs no container engine.
    Any other ``type`` is one of Harbor's own environments (``docker``, ``podman``, ``daytona``,
    ...), passed through unchanged; ``import_path`` names any other environment class. In those,
    the trial image must provide Python >= 3.12 with the rollout's dependencies (osmosis-core and
    the agent framework); the plugin uploads the rollout code and the osmosis packages.
    """

    type: str = BWRAP_ENVIRONMENT
    import_path: str | None = None
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    """Keyword arguments of the environment's constructor (Harbor's ``--ek key=value``)."""
    env: dict[str, str] = attrs.field(factory=dict)
    """Environment variables of every command in the trial."""
    force_build: bool = False
    override_cpus: float | None = None
    override_memory_mb: int | None = None
    python: str | None = None
    """The interpreter inside the trial; default: this one (bwrap) or ``python3`` (other environments)."""

    @property
    def is_bwrap(self) -> bool:
        """True when trials run in the plugin's own sandbox."""
        return self.import_path is None and self.type == BWRAP_ENVIRONMENT


@attrs.define(kw_only=True)
class HarborBackendConfig:
    """``[backend.harbor]``: the whole backend. See the module docstring for every key."""

    mode: str = attrs.field(default="template", validator=_one_of(*MODES))
    """``template``: one reusable task, the row's prompt is the instruction, the grader is the verifier.
    ``dataset``: each row names an existing Harbor task, whose instruction and verifier are used."""
    task_dir: str | None = None
    """Template mode: the task folder every rollout's trial is made from (default: the plugin's own)."""
    dataset_dir: str | None = None
    """Dataset mode: the folder of Harbor task folders that rows name."""
    task_key: str = "task"
    """Dataset mode: the row key naming the task (a folder under ``dataset_dir``, or a path)."""
    code_dir: str | None = None
    """The rollout code made visible in trials (default: the rollout folder)."""
    grade_on_host: bool = False
    """Template mode: run the grader in this process (as the trial's Harbor verifier) instead of
    inside the trial. Faster (no second interpreter per rollout), but the grader is not sandboxed:
    keep the default when it runs anything the model wrote."""
    n_concurrent: int | None = attrs.field(default=None, validator=_positive_or_none)
    """Trials at once (Harbor's TrialQueue); default: the workflow's concurrency (run.concurrency)."""
    max_retries: int = attrs.field(default=0, validator=_not_negative)
    """Harbor retries of a trial whose machinery failed (never of a workflow or grader failure)."""
    trials_dir: str | None = None
    """Where trial folders go; default ``<run folder>/harbor-trials``."""
    keep_successful_trials: bool = False
    """Keep the folders of successful trials too (failed ones are always kept)."""
    environment: EnvironmentSection = attrs.field(factory=EnvironmentSection)
    sandbox: SandboxSection = attrs.field(factory=SandboxSection)
