"""``HarborBackend``: every rollout in its own Harbor trial (the ``harbor`` backend).

From the command line::

    osmosis run configs/eval/multiply-plain.toml --stub-policy --backend harbor

In code (the same settings as the run config's ``[backend.harbor]`` table)::

    from osmosis_harbor import HarborBackend, HarborBackendConfig

    backend = HarborBackend(MultiplyWorkflow, grader=MultiplyGrader, config=HarborBackendConfig(n_concurrent=8))
    await backend.execute(request, on_workflow_complete, on_grader_complete)
    await backend.aclose()

The constructor of osmosis-ai's ``HarborBackend`` works too (classes or ``"module:attr"`` strings,
its keyword names mapped onto :class:`HarborBackendConfig`)::

    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=8),
        task_dir=Path("tasks/my-task"),
        user_code_dir=Path("."),
        workflow="rollouts.my_rollout.main:MyWorkflow",
        grader="rollouts.my_rollout.main:MyGrader",
        cleanup_successful_trials=True,
    )

**Template mode** (default): each rollout gets a trial of one reusable task (``task_dir``, default
the plugin's generic task). The row's prompt becomes the trial's instruction, the workflow runs
inside the trial against the rollout's policy endpoint (:mod:`osmosis_harbor.agent`), its sample
comes back, and the rollout's grader runs as the trial's verifier
(:mod:`osmosis_harbor.verifier`), so the reward is Harbor's verifier result.

**Dataset mode**: each row names an existing Harbor task (``task_key``, under ``dataset_dir``);
the task keeps its instruction (the workflow gets it as the user message), environment and
verifier, whose reward is the rollout's.

Results mean what they mean on the ``local`` backend: a workflow result (as soon as the agent
phase ends), then a grader result; see :mod:`osmosis_harbor.outcomes` for the error categories.
A failed trial's folder is kept and named in the error message; a successful one is removed
unless ``keep_successful_trials``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import attrs

from osmosis_harbor._harbor import prepare_harbor_import

prepare_harbor_import()

from harbor.models.job.config import RetryConfig  # noqa: E402
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig, VerifierConfig  # noqa: E402
from harbor.trial.hooks import TrialEvent, TrialHookEvent  # noqa: E402
from harbor.trial.queue import TrialQueue  # noqa: E402

from osmosis_core import (  # noqa: E402
    AgentWorkflow,
    AgentWorkflowConfig,
    ConfigError,
    ErrorCategory,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    Grader,
    GraderConfig,
    RolloutSample,
    message_text,
)
from osmosis_core.plugin import (  # noqa: E402
    BackendSetup,
    ExecutionBackend,
    ResultCallback,
    RolloutReporter,
)
from osmosis_harbor.agent import AGENT_IMPORT_PATH  # noqa: E402
from osmosis_harbor.bwrap import check_bwrap, find_bwrap, python_paths, sandbox_id_base  # noqa: E402
from osmosis_harbor.config import HarborBackendConfig  # noqa: E402
from osmosis_harbor.gateways import GatewayMissing, PolicyGateways  # noqa: E402
from osmosis_harbor.images import (  # noqa: E402
    BaseUnavailable,
    ImageBuildError,
    ImageBuilds,
    ImageCache,
    TaskImage,
    default_cache_dir,
    has_dockerfile,
    image_build_missing,
)
from osmosis_harbor.outcomes import NO_REWARD_ERRORS, failure, grader_file_result, pick_reward, trial_error  # noqa: E402
from osmosis_harbor.relay import loopback_address  # noqa: E402
from osmosis_harbor.runtime import RUNTIME_PYTHON, relocated  # noqa: E402
from osmosis_harbor.tasks import (  # noqa: E402
    DEFAULT_TASK_DIR,
    TaskProblem,
    find_dataset_task,
    is_task_dir,
    task_has_no_network,
    task_name,
)
from osmosis_harbor.tickets import TICKETS, ClassRef, Ticket  # noqa: E402
from osmosis_harbor.verifier import HOST_VERIFIER_IMPORT_PATH, VERIFIER_IMPORT_PATH  # noqa: E402
from osmosis_harbor.wire import dump_object  # noqa: E402

__all__ = ["SANDBOX_IMPORT_PATH", "HarborBackend"]

SANDBOX_IMPORT_PATH = "osmosis_harbor.sandbox:BubblewrapEnvironment"
_WF = ExecutionStage.WORKFLOW
_GR = ExecutionStage.GRADER
_SOURCE = "[backend.harbor]"
_TRIAL_CODE = "/osmosis/code"
_TRIAL_LIB = "/osmosis/lib"


_TRIAL_PACKAGES = ("osmosis_core", "osmosis_harbor", "lazy_loader")
"""The packages a trial's runner imports that the plugin uploads to a Harbor (non-bwrap) environment:
osmosis's own and its pure-Python dependencies an image would not have (the image brings ``attrs``,
``cattrs`` and ``anyio``, README)."""


def _trial_lib_uploads(lib: str) -> dict[str, str]:
    """The host folders of ``_TRIAL_PACKAGES``, by their path under ``lib`` in the trial."""
    uploads = {}
    for name in _TRIAL_PACKAGES:
        module = importlib.import_module(name)
        uploads[f"{lib}/{name}"] = str(Path(str(module.__file__)).parent)
    return uploads


def _find(path: str | None, anchors: list[Path]) -> Path | None:
    """A config path: absolute as is; relative against the anchors (the config's folder first), then the current one."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    for base in [*anchors, Path.cwd()]:
        if (base / p).exists():
            return (base / p).resolve()
    return (Path.cwd() / p).resolve()


def _anchors(rollout_dir: Path | None) -> list[Path]:
    """Folders relative config paths may be written against: the rollout folder and its parents."""
    if rollout_dir is None:
        return []
    rollout_dir = rollout_dir.resolve()
    return [rollout_dir, *rollout_dir.parents]


def _trial_name(rollout_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", rollout_id).strip("-.") or "rollout"
    return f"{name[:80]}-{secrets.token_hex(3)}"


def _environment_name(config: HarborBackendConfig, environment_config: EnvironmentConfig | None) -> str:
    """The environment trials run in, as a message names it (``"docker"`` for Harbor's Docker one)."""
    if environment_config is not None:
        if environment_config.import_path:
            return f"the environment class {environment_config.import_path!r}"
        kind = environment_config.type
        return str(getattr(kind, "value", kind)) if kind is not None else "docker"  # Harbor's default
    section = config.environment
    if section.import_path:
        return f"the environment class {section.import_path!r}"
    if section.is_bwrap:
        return f"{section.type!r} (the plugin's bubblewrap sandbox)"
    return section.type


def _with_reference_names(
    config: HarborBackendConfig,
    *,
    task_dir: Path | str | None,
    user_code_dir: Path | str | None,
    cleanup_successful_trials: bool | None,
    prebuild_local_image: bool | None,
    environment_config: EnvironmentConfig | None,
) -> HarborBackendConfig:
    """``config`` with osmosis-ai's constructor keywords applied (each may be given once, in one spelling).

    :raises ConfigError: a keyword that contradicts ``config``, or a Docker option without Docker.
    """
    changes: dict[str, Any] = {}
    problems: list[str] = []

    def take(ours: str, theirs: str, value: Any, default: Any) -> None:
        current = getattr(config, ours)
        if current != default and current != value:
            problems.append(f"{theirs}={value!r} and config {ours}={current!r} disagree; give one @ {theirs}")
        changes[ours] = value

    if task_dir is not None:
        take("task_dir", "task_dir", str(task_dir), None)
    if user_code_dir is not None:
        take("code_dir", "user_code_dir", str(user_code_dir), None)
    if cleanup_successful_trials is not None:
        take("keep_successful_trials", "cleanup_successful_trials", not cleanup_successful_trials, False)
    if prebuild_local_image is not None:
        kind = _environment_name(config, environment_config)
        if kind == "docker":
            changes["environment"] = attrs.evolve(config.environment, force_build=bool(prebuild_local_image))
        elif prebuild_local_image:  # False (do not build) holds in every environment
            problems.append(
                f"prebuild_local_image is an option of Harbor's Docker environment (build the task image here "
                f"instead of pulling a prebuilt one); these trials run in {kind}: "
                "remove it, or use the docker environment @ prebuild_local_image"
            )
    if problems:
        raise ConfigError("HarborBackend", problems)
    return attrs.evolve(config, **changes) if changes else config


def _no_network_policy(base_url: str, *, no_gateway: bool = False) -> str:
    """Why a trial of a ``no-network`` task cannot reach its policy: Harbor's own environment, or no
    policy gateway to put in front of it (:mod:`osmosis_harbor.gateways`)."""
    where = urlsplit(base_url).netloc
    if not no_gateway:
        return (
            f"the task has network_mode = 'no-network', so its trials cannot reach the policy at {where}: in "
            "this environment no-network trials have no path to it; give the task network_mode = 'public'"
        )
    return (
        f"the task has network_mode = 'no-network', so its trials reach the policy at {where} only through a "
        "policy gateway (it serves them the chat routes alone, not the policy server's other routes), and no "
        "plugin provides one: pip install osmosis-gateway, or give the task network_mode = 'public'"
    )


class HarborBackend(ExecutionBackend):
    """Runs each rollout in an isolated Harbor trial; see the module docstring.

    :param workflow: the :class:`~osmosis_core.AgentWorkflow` subclass, or an import path to one.
    :param workflow_config: its config (an object or an import path); default ``workflow.config_type()``.
    :param grader: the :class:`~osmosis_core.Grader` subclass (or import path), None for no grading.
        In dataset mode the task's verifier grades instead.
    :param grader_config: its config (an object or an import path).
    :param config: the ``[backend.harbor]`` settings (:class:`HarborBackendConfig`); the canonical way.
    :param rollout_dir: the rollout's folder: the code mounted into trials unless ``config.code_dir``.
    :param run_dir: the run's folder: trials go to ``run_dir/harbor-trials`` unless ``config.trials_dir``.
    :param config_root: the folder the run config's relative paths resolve against (tried first).
    :param dataset_path: the dataset file; hidden from every trial, since it holds the labels.
    :param require_labels: fail a row without a label instead of running it ungraded (template mode).
    :param max_concurrent: trials at once (``[run] concurrency``) when ``config.n_concurrent`` is unset;
        default: the workflow config's limit.

    osmosis-ai's keyword names are accepted and mapped onto ``config`` (each given in one spelling):

    :param orchestrator: a Harbor ``TrialQueue`` to run the trials on; it keeps its own ``n_concurrent``
        (say the same number in ``config.n_concurrent`` or ``max_concurrent`` for ``max_concurrency``
        to report it; else the backend reports no limit of its own, 0).
    :param task_dir: ``config.task_dir``. :param user_code_dir: ``config.code_dir``.
    :param environment_config: a Harbor ``EnvironmentConfig`` used as is for every trial (instead of
        ``config.environment``).
    :param cleanup_successful_trials: ``not config.keep_successful_trials``.
    :param prebuild_local_image: Harbor's Docker environment builds the task image on this machine
        instead of pulling a prebuilt one (``force_build``); True is refused with any other environment,
        False (do not build) is accepted everywhere.
    """

    def __init__(
        self,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader[Any]] | str | None = None,
        grader_config: GraderConfig | str | None = None,
        *,
        config: HarborBackendConfig | None = None,
        rollout_dir: Path | None = None,
        run_dir: Path | None = None,
        config_root: Path | None = None,
        dataset_path: Path | None = None,
        require_labels: bool = False,
        max_concurrent: int | None = None,
        orchestrator: TrialQueue | None = None,
        task_dir: Path | str | None = None,
        user_code_dir: Path | str | None = None,
        environment_config: EnvironmentConfig | None = None,
        cleanup_successful_trials: bool | None = None,
        prebuild_local_image: bool | None = None,
    ) -> None:
        config = config if config is not None else HarborBackendConfig()
        self.config = config = _with_reference_names(
            config,
            task_dir=task_dir,
            user_code_dir=user_code_dir,
            cleanup_successful_trials=cleanup_successful_trials,
            prebuild_local_image=prebuild_local_image,
            environment_config=environment_config,
        )
        self._dataset_path = dataset_path  # holds the labels: hidden from every trial
        # which workflow and grader run, their configs and the grading rule: decided once
        setup = self.setup = BackendSetup.resolve(
            workflow, workflow_config, grader, grader_config, require_labels=require_labels
        )
        self.workflow_class: type[AgentWorkflow[Any]] = setup.workflow_class
        self.workflow_config: AgentWorkflowConfig = setup.workflow_config
        self.grader_class: type[Grader[Any]] | None = setup.grader_class
        self.grader_config: GraderConfig | None = setup.grader_config

        anchors = ([config_root] if config_root is not None else []) + _anchors(rollout_dir)
        self.mode = config.mode
        self.task_dir: Path | None = None
        self.dataset_dir: Path | None = None
        if self.mode == "template":
            self.task_dir = _find(config.task_dir, anchors) or DEFAULT_TASK_DIR
            if not is_task_dir(self.task_dir):
                raise ConfigError(_SOURCE, [f"{self.task_dir} is not a Harbor task folder (no task.toml) @ task_dir"])
        else:
            self.dataset_dir = _find(config.dataset_dir, anchors)
            if self.dataset_dir is not None and not self.dataset_dir.is_dir():
                raise ConfigError(_SOURCE, [f"{self.dataset_dir} is not a folder @ $.backend.harbor.dataset_dir"])
        module_file = getattr(sys.modules.get(self.workflow_class.__module__), "__file__", None)
        code = _find(config.code_dir, anchors) or rollout_dir or (Path(module_file).parent if module_file else None)
        self.code_dir = Path(code).resolve() if code is not None else None
        self.run_dir = run_dir
        self._own_trials_dir = False
        trials = _find(config.trials_dir, anchors)
        if trials is None and run_dir is not None:
            trials = Path(run_dir) / "harbor-trials"
        if trials is None:
            trials = Path(tempfile.mkdtemp(prefix="osmosis-harbor-"))
            self._own_trials_dir = True
        self.trials_dir = trials.resolve()
        self.trials_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.trials_dir, 0o700)  # trial folders hold what a rollout saw and did: the owner's only

        if environment_config is not None and prebuild_local_image is not None:  # a Docker one (checked above)
            environment_config = environment_config.model_copy(update={"force_build": bool(prebuild_local_image)})
        self._harbor_environment = environment_config
        environment = config.environment
        self._bwrap = environment_config is None and environment.is_bwrap
        self._images: ImageBuilds | None = None
        if self._bwrap:
            check_bwrap(find_bwrap(config.sandbox.bwrap))
            self.python = environment.python or sys.executable
            self._lib_paths = [str(p) for p in python_paths(import_path=True)]
            wanted = config.sandbox.image
            if wanted == "auto" and self.mode == "dataset" and (missing := image_build_missing()):
                _tell(f"tasks run on this machine's tools, not in their own images: {missing} (image = 'auto')")
            elif wanted == "build" or (wanted == "auto" and self.mode == "dataset"):
                cache_dir = _find(config.sandbox.image_cache, anchors) if config.sandbox.image_cache else None
                bases = {name: _find(path, anchors) or Path(path) for name, path in config.sandbox.bases.items()}
                cache = ImageCache(cache_dir or default_cache_dir(), bases, sandbox_id_base())
                self._images = ImageBuilds(cache, progress=_tell)
        else:
            self.python = environment.python or "python3"
            self._lib_paths = [_TRIAL_LIB]
        if orchestrator is not None:
            self._queue = orchestrator
            self._limit = config.n_concurrent or max_concurrent or 0
        else:
            self._limit = config.n_concurrent or max_concurrent or self.workflow_config.concurrency.limit
            retry = RetryConfig(
                max_retries=config.max_retries,
                exclude_exceptions={
                    "WorkflowFailed",
                    "GraderFailed",
                    "AgentTimeoutError",
                    "VerifierTimeoutError",
                    *NO_REWARD_ERRORS,
                },
            )
            self._queue = TrialQueue(n_concurrent=self._limit, retry_config=retry)
        self._queue.add_hook(TrialEvent.START, self._on_trial_start)
        self._by_trial: dict[str, Ticket] = {}
        self._gateways = PolicyGateways()
        try:
            self._workflow_blob = dump_object(self.workflow_config, self.code_dir)
            self._grader_blob = (
                dump_object(self.grader_config, self.code_dir) if self.grader_config is not None else None
            )
        except Exception as exc:
            raise ConfigError(
                _SOURCE,
                [f"the workflow and grader configs are sent into each trial, and this one cannot be: {exc!r}"],
            ) from None
        self._done = 0

    @classmethod
    def from_setup(cls, setup: BackendSetup) -> HarborBackend:
        """The factory registered for the ``harbor`` backend (``osmosis run --backend harbor``)."""
        config = setup.backend_config if isinstance(setup.backend_config, HarborBackendConfig) else None
        limit = setup.limits.concurrency
        return cls(
            *setup.rollout_args(),
            config=config,
            require_labels=setup.require_labels,
            max_concurrent=limit,
            **setup.paths(),
        )

    @property
    def max_concurrency(self) -> int:
        return self._limit

    @property
    def queue(self) -> TrialQueue:
        """Harbor's orchestrator of this backend's trials; add your own hooks with ``queue.add_hook``."""
        return self._queue

    @property
    def grades(self) -> bool:
        """True when rollouts get a grader stage (a grader in template mode; always in dataset mode)."""
        return self.mode == "dataset" or self.grader_class is not None

    def grades_request(self, request: ExecutionRequest) -> bool:
        """Whether ``request`` gets a grader stage: the task's verifier (dataset mode), or the rollout's
        grader on the same terms as the local backend (template mode: asked for, and a labelled row)."""
        if self.mode == "dataset":
            return request.grade
        return self.setup.grades(request)

    def health(self) -> dict[str, Any]:
        from osmosis_harbor.bwrap import sandbox_limits

        env = self.config.environment
        return {
            "status": "ok",
            "mode": self.mode,
            "environment": "bwrap" if self._bwrap else (env.import_path or env.type),
            "limits": sandbox_limits().kind if self._bwrap else None,
            "max_concurrency": self._limit,
            "trials_dir": str(self.trials_dir),
            "queued": sum(1 for t in self._by_trial.values() if t.trial_started is None),
            "running": sum(1 for t in self._by_trial.values() if t.trial_started is not None),
            "finished": self._done,
        }

    async def aclose(self) -> None:
        await self._gateways.aclose()
        if self._own_trials_dir:
            with contextlib.suppress(OSError):
                self.trials_dir.rmdir()  # only when every trial was removed

    # -- one rollout ----------------------------------------------------------------------------

    async def _on_trial_start(self, event: TrialHookEvent) -> None:
        ticket = self._by_trial.get(event.config.trial_name)
        if ticket is not None:
            ticket.trial_started = time.perf_counter()

    def _task_for(self, request: ExecutionRequest) -> Path:
        if self.task_dir is not None:
            return self.task_dir
        return find_dataset_task(request.metadata, self.config.task_key, self.dataset_dir)

    def _class_ref(self, klass: type[Any]) -> ClassRef:
        if self._bwrap or self.code_dir is None:
            return ClassRef.of(klass)
        code = self.code_dir

        def to_trial(file: str) -> str | None:
            path = Path(file).resolve()
            return f"{_TRIAL_CODE}/{path.relative_to(code).as_posix()}" if path.is_relative_to(code) else None

        return ClassRef.of(klass, map_path=to_trial)

    def _uploads(self) -> dict[str, str]:
        if self._bwrap:
            return {}
        uploads = _trial_lib_uploads(_TRIAL_LIB)
        if self.code_dir is not None:
            uploads[_TRIAL_CODE] = str(self.code_dir)
        return uploads

    def _environment_config(
        self, policy_relay: tuple[str, int] | None = None, image: TaskImage | None = None
    ) -> EnvironmentConfig:
        """The trial's environment; ``policy_relay``: the loopback address of its policy gateway,
        relayed into a no-network bwrap trial (:mod:`osmosis_harbor.relay`); ``image``: the task's
        built image, which the bwrap trial runs on (:mod:`osmosis_harbor.image_sandbox`)."""
        if self._harbor_environment is not None:
            return self._harbor_environment.model_copy(deep=True)
        env = self.config.environment
        common: dict[str, Any] = {
            "env": dict(env.env),
            "force_build": env.force_build,
            "override_cpus": env.override_cpus,
            "override_memory_mb": env.override_memory_mb,
        }
        if not self._bwrap:
            kind = {"import_path": env.import_path} if env.import_path else {"type": env.type}
            return EnvironmentConfig(**kind, kwargs=dict(env.kwargs), delete=True, **common)
        sandbox = self.config.sandbox
        hide = [str(self.trials_dir), *sandbox.hide_paths]
        # the labels, and the tasks' own tests and solutions: never visible to a rollout
        for secret in (self._dataset_path, self.dataset_dir, self.task_dir):
            if secret is not None:
                hide.append(str(Path(secret).resolve()))
        if self.run_dir is not None:
            hide.append(str(Path(self.run_dir).resolve()))
        expose = [str(self.code_dir)] if self.code_dir is not None else []
        kwargs = {
            "memory_mb": sandbox.memory_mb,
            "max_processes": sandbox.max_processes or 0,
            "hide_paths": hide,
            "expose_paths": [*expose, *sandbox.expose_paths],
            "bwrap": sandbox.bwrap,
            **env.kwargs,
        }
        if policy_relay is not None:
            host, port = policy_relay
            kwargs["policy_relay"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if image is not None:
            kwargs["image"] = str(image.folder)
        return EnvironmentConfig(import_path=SANDBOX_IMPORT_PATH, kwargs=kwargs, delete=False, **common)

    def _trial_config(
        self, ticket: Ticket, task_dir: Path, trial_name: str, image: TaskImage | None = None
    ) -> TrialConfig:
        request = ticket.request
        if not self.grades_request(request):
            verifier = VerifierConfig(disable=True)
        elif self.mode == "dataset":
            verifier = VerifierConfig()
        else:
            verifier = VerifierConfig(
                import_path=HOST_VERIFIER_IMPORT_PATH if self.config.grade_on_host else VERIFIER_IMPORT_PATH,
                kwargs={"ticket": ticket.id},
                override_timeout_sec=request.grader_timeout_sec or None,
            )
        extra = []
        if self.mode == "template":
            users = [m for m in request.prompt if m.get("role") == "user"]
            extra = [message_text(users[-1]) if users else message_text(request.prompt[-1]) if request.prompt else ""]
        return TrialConfig(
            task=TaskConfig(path=task_dir),
            trial_name=trial_name,
            trials_dir=self.trials_dir,
            agent=AgentConfig(
                import_path=AGENT_IMPORT_PATH,
                kwargs={"ticket": ticket.id, "rollout_id": request.rollout_id},
                override_timeout_sec=request.agent_timeout_sec or None,
            ),
            environment=self._environment_config(ticket.policy_relay, image),
            verifier=verifier,
            extra_instructions=extra,
        )

    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback,
        on_grader_complete: ResultCallback | None = None,
    ) -> None:
        submitted = time.perf_counter()
        rollout = RolloutReporter(
            request, on_workflow_complete, on_grader_complete, grades=self.grades_request(request)
        )
        ticket: Ticket | None = None
        trial_task: asyncio.Future[Any] | None = None
        gateway_opened = False
        try:
            async with rollout:
                try:
                    task_dir = self._task_for(request)
                except TaskProblem as exc:
                    await rollout.report(failure(request.rollout_id, _WF, ErrorCategory.VALIDATION_ERROR, str(exc)))
                    return
                image: TaskImage | None = None
                if self._images is not None and has_dockerfile(task_dir / "environment"):
                    try:
                        image = await self._images.image(task_dir / "environment")
                    except ImageBuildError as exc:
                        given = isinstance(exc, BaseUnavailable)  # the user's to fix
                        category = ErrorCategory.VALIDATION_ERROR if given else ErrorCategory.INFRA_ERROR
                        await rollout.report(failure(request.rollout_id, _WF, category, str(exc)))
                        return
                trial_name = _trial_name(request.rollout_id)
                ticket = Ticket(
                    request=request,
                    mode=self.mode,
                    task_name=task_name(task_dir),
                    trial_dir=self.trials_dir / trial_name,
                    workflow=self._class_ref(self.workflow_class),
                    workflow_config=self._workflow_blob,
                    grader=self._class_ref(self.grader_class) if self.grader_class is not None else None,
                    grader_config=self._grader_blob,
                    python=RUNTIME_PYTHON if image is not None else self.python,
                    lib_paths=[relocated(p) for p in self._lib_paths] if image is not None else self._lib_paths,
                    code_dir=(_TRIAL_CODE if not self._bwrap else str(self.code_dir)) if self.code_dir else None,
                    upload=self._uploads(),
                    grader_class=self.grader_class,
                    grader_config_object=self.grader_config,
                    no_network=task_has_no_network(task_dir),
                )
                if ticket.no_network and self._bwrap:  # its one path to the policy: a gateway, through its socket
                    try:
                        policy = await self._gateways.open(request.policy, request.rollout_id)
                    except GatewayMissing:
                        problem = _no_network_policy(request.policy.base_url, no_gateway=True)
                        await rollout.report(failure(request.rollout_id, _WF, ErrorCategory.POLICY_ERROR, problem))
                        return
                    gateway_opened = True
                    ticket.request = attrs.evolve(request, policy=policy)
                    ticket.policy_relay = loopback_address(policy.base_url)
                TICKETS[ticket.id] = ticket
                self._by_trial[trial_name] = ticket
                rollout.detail = f" (trial kept: {ticket.trial_dir})"
                trial_config = self._trial_config(ticket, task_dir, trial_name, image)
                trial_task = asyncio.ensure_future(self._queue.submit(trial_config))
                try:
                    await self._run_trial(rollout, ticket, trial_task, submitted)
                except BaseException:
                    # cancelled, or a callback failed: do not leave the trial running behind the caller's back
                    with anyio.CancelScope(shield=True):
                        if not trial_task.done():
                            trial_task.cancel()
                            with contextlib.suppress(BaseException):
                                await asyncio.wait_for(asyncio.shield(trial_task), 30)
                    raise
        finally:
            if ticket is not None:
                TICKETS.pop(ticket.id, None)
                self._by_trial.pop(ticket.trial_dir.name, None)
            if gateway_opened:
                with anyio.CancelScope(shield=True):
                    await self._gateways.close(request.policy, request.rollout_id)
            self._done += 1

    async def _run_trial(
        self, rollout: RolloutReporter, ticket: Ticket, trial_task: asyncio.Future[Any], submitted: float
    ) -> None:
        """Report the trial's stages as they end: the workflow's when the agent phase is done, then the grader's."""
        timings = rollout.timings
        waiter = asyncio.ensure_future(ticket.workflow_done.wait())
        try:
            await asyncio.wait({trial_task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        workflow = ticket.workflow_result
        if workflow is not None and workflow.ok:
            await rollout.report(self._workflow_stage(ticket, timings, submitted))
        try:
            trial = await trial_task
        except Exception as exc:
            await rollout.report(self._trial_crash(exc, ticket, rollout.stage, timings))
            return
        timings["trial"] = time.perf_counter() - (ticket.trial_started or submitted)
        if rollout.stage is _WF:
            await rollout.report(self._failed_workflow(ticket, trial, timings, submitted))
            return
        if rollout.ended:  # not graded
            await self._cleanup(ticket, success=trial.exception_info is None)
            return
        graded, ok = self._grader_stage(ticket, trial, timings)
        await rollout.report(graded)
        await self._cleanup(ticket, success=ok)

    def _workflow_stage(self, ticket: Ticket, timings: dict[str, float], submitted: float) -> ExecutionResult:
        result = ticket.workflow_result
        assert result is not None
        started = ticket.trial_started or submitted
        timings["queued"] = started - submitted
        for key in ("workflow",):
            if key in result.timings:
                timings[key] = result.timings[key]
        timings["sandbox_overhead"] = max(
            0.0, time.perf_counter() - (ticket.agent_started or started) - timings.get("workflow", 0.0)
        )
        return ExecutionResult(
            result.rollout_id, _WF, ExecutionStatus.SUCCESS, sample=result.sample, timings=dict(timings)
        )

    def _failed_workflow(
        self, ticket: Ticket, trial: Any, timings: dict[str, float], submitted: float
    ) -> ExecutionResult:
        rid = ticket.request.rollout_id
        trial_dir = ticket.trial_dir
        info = trial.exception_info
        timings["queued"] = (ticket.trial_started or submitted) - submitted
        result = ticket.workflow_result
        if result is not None and result.error is not None:
            timings.update({k: v for k, v in result.timings.items() if k == "workflow"})
            message = result.error.message
            limit = ticket.request.agent_timeout_sec
            if result.error.category is ErrorCategory.TIMEOUT and limit:
                message = f"the workflow ran past its {limit:g} s timeout"
            elif result.error.category is ErrorCategory.POLICY_ERROR and ticket.no_network and not ticket.policy_relay:
                message = f"{message}; {_no_network_policy(ticket.request.policy.base_url)}"
            return failure(
                rid,
                _WF,
                result.error.category,
                f"{message} (Harbor trial {trial_dir.name} of task {ticket.task_name!r}; logs: {trial_dir})",
                sample=result.sample,
                timings=timings,
            )
        if info is None:
            return failure(
                rid, _WF, ErrorCategory.INFRA_ERROR, f"the trial ended without running the workflow ({trial_dir})"
            )
        _stage, error = trial_error(
            info.exception_type,
            info.exception_message,
            task_name=ticket.task_name,
            trial_dir=trial_dir,
            agent_timeout=ticket.request.agent_timeout_sec,
            grader_timeout=ticket.request.grader_timeout_sec,
            workflow_ok=False,
        )
        return failure(rid, _WF, error.category, error.message, timings=timings)

    def _grader_stage(self, ticket: Ticket, trial: Any, timings: dict[str, float]) -> tuple[ExecutionResult, bool]:
        rid = ticket.request.rollout_id
        workflow = ticket.workflow_result
        assert workflow is not None
        assert workflow.sample is not None
        sample: RolloutSample = copy.copy(workflow.sample)
        sample.metrics = dict(sample.metrics)
        verifier_dir = ticket.trial_dir / "verifier"
        own = ticket.grader_result
        if own is None and self.mode == "template":
            own = grader_file_result(verifier_dir, ticket.nonce)
        verifier_timing = getattr(trial, "verifier", None)
        if verifier_timing is not None and verifier_timing.started_at and verifier_timing.finished_at:
            timings["grader"] = (verifier_timing.finished_at - verifier_timing.started_at).total_seconds()
        info = trial.exception_info
        rewards = trial.verifier_result.rewards if trial.verifier_result is not None else None
        if info is None and rewards:
            try:
                sample.reward = pick_reward(rewards)
            except ValueError as exc:
                message = f"task {ticket.task_name!r}: {exc} ({ticket.trial_dir})"
                return failure(rid, _GR, ErrorCategory.VALIDATION_ERROR, message, sample=sample, timings=timings), False
            if own is not None and own.sample is not None:
                sample.metrics.update(own.sample.metrics)
            if len(rewards) > 1 or "reward" not in rewards:
                sample.metrics["harbor_rewards"] = dict(rewards)
            return ExecutionResult(rid, _GR, ExecutionStatus.SUCCESS, sample=sample, timings=dict(timings)), True
        if info is None:
            message = f"the trial of task {ticket.task_name!r} ended without a verifier result ({ticket.trial_dir})"
            return failure(rid, _GR, ErrorCategory.INFRA_ERROR, message, sample=sample, timings=timings), False
        if own is not None and own.error is not None and info.exception_type in {*NO_REWARD_ERRORS, "GraderFailed"}:
            message = f"{own.error.message} (Harbor trial {ticket.trial_dir.name}; logs: {ticket.trial_dir})"
            return failure(rid, _GR, own.error.category, message, sample=sample, timings=timings), False
        _stage, error = trial_error(
            info.exception_type,
            info.exception_message,
            task_name=ticket.task_name,
            trial_dir=ticket.trial_dir,
            agent_timeout=ticket.request.agent_timeout_sec,
            grader_timeout=ticket.request.grader_timeout_sec,
            workflow_ok=True,
        )
        return failure(rid, _GR, error.category, error.message, sample=sample, timings=timings), False

    @staticmethod
    def _trial_crash(
        exc: Exception, ticket: Ticket, stage: ExecutionStage, timings: dict[str, float]
    ) -> ExecutionResult:
        """Harbor could not even run the trial (``Trial.create`` failed: a bad task folder, a setup error)."""
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:1500]
        # a task folder Harbor rejects (missing instruction.md or tests, a bad task.toml) is the data's
        # fault; anything else is the machinery's
        bad_task = isinstance(exc, (FileNotFoundError, ValueError))
        category = ErrorCategory.VALIDATION_ERROR if bad_task else ErrorCategory.INFRA_ERROR
        message = f"Harbor could not start a trial of task {ticket.task_name!r}: {text} ({ticket.trial_dir})"
        return failure(ticket.request.rollout_id, stage, category, message, timings=timings)

    async def _cleanup(self, ticket: Ticket, *, success: bool) -> None:
        """Remove a successful trial's folder (unless asked to keep it); failed ones stay for debugging."""
        if success and not self.config.keep_successful_trials:
            await asyncio.to_thread(shutil.rmtree, ticket.trial_dir, True)


def _tell(message: str) -> None:
    """A task image's build progress, on standard error (builds take seconds to minutes, once)."""
    print(f"osmosis harbor: {message}", file=sys.stderr, flush=True)
