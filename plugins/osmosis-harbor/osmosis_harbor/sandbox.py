"""``BubblewrapEnvironment``: a Harbor environment that runs trials in bubblewrap sandboxes, no Docker.

Harbor takes it by import path, so it works with Harbor's own CLI as well as the ``harbor``
backend::

    harbor run -p path/to/task -a oracle -e osmosis_harbor.sandbox:BubblewrapEnvironment

Each trial gets a private root folder (``<trial dir>/sandbox/<role>/``) shown as ``/``: the task's
paths (``/app`` or its workdir, ``/logs/{agent,verifier,artifacts}``, ``/tests``, ``/solution``,
``/tmp``) are the trial's own, and files Harbor uploads or downloads are copied there on the host
without following any symlink the sandbox made. Every ``exec`` is a fresh sandbox (see
:mod:`osmosis_harbor.bwrap` for what it sees and how it is limited); nothing it starts outlives it.

Constructor keywords (``EnvironmentConfig.kwargs``, ``--ek key=value``):

* ``memory_mb``: memory of the trial's commands (default: the task's ``[environment].memory_mb``,
  else 4096);
* ``max_processes``: processes of the trial's commands (default 1024; ``0`` for no limit);
* ``hide_paths`` / ``expose_paths``: more host paths to hide / to show read-only (a list, or one
  comma-separated string from the command line);
* ``bwrap``: the bubblewrap executable;
* ``policy_relay``: a loopback ``host:port`` (the ``harbor`` backend passes its policy gateway's for
  a ``no-network`` task): the trial's commands get a unix socket relayed to it, at
  :data:`~osmosis_harbor.relay.POLICY_SOCKET` (:mod:`osmosis_harbor.relay`), and nothing else;
* ``image``: run the trial on a task image instead of the host's tools (:mod:`osmosis_harbor.image_sandbox`):
  the folder of an image already built (:class:`~osmosis_harbor.images.ImageCache`), or ``"build"``
  to build the task's ``environment/Dockerfile`` now (cached); ``image_cache`` names the cache
  folder, ``bases`` the bases the user gives (``{"python:3.12-slim": "rootfs.tar"}``).

**On a task image** (``image``), the trial is one machine for its whole life, as a container is: its
tree is the image (no host ``/usr`` or ``/etc``) on an overlay of its own; what a command starts keeps
running until the trial ends; commands start in the image's ``WORKDIR`` (the task's ``workdir`` wins)
with its ``Env`` and ``User``, in the trial's own user namespace (its root has every capability
within it and none outside it: ``apt-get install`` works); a command gets the host's
network or, under ``no-network``, the trial's own loopback (and the socket to its policy, which the
relay opens at start when the task begins without network); only what the Dockerfile copies is in
the image (the build context is not uploaded); osmosis's own runtime is shown read-only.

**The verifier's phase.** Harbor starts verifying by uploading the task's tests to ``/tests``. From
then on: ``/tests`` holds only what was uploaded (anything the agent left there is removed first);
every command gets a fresh, empty ``HOME`` the agent never saw, and ``PYTHONNOUSERSITE=1``,
``PYTHONSAFEPATH=1`` and ``PYTHONDONTWRITEBYTECODE=1``, so no interpreter the verifier starts
(``/usr/bin/python3`` included) runs a ``.pth``, ``usercustomize`` or module the agent planted in a
user site folder or in the working folder; and commands run from ``/tests`` unless told otherwise
(on a task image: from its ``WORKDIR``, as Docker's).
A verifier that means to import the agent's code says so (``PYTHONPATH=/app`` in its
``tests/test.sh``). On the host's tools the agent's processes are gone by then (each command is its own
sandbox); on a task image they may still run, as in a container (see below).

Limits, on the host's tools (without ``image``): a task's Dockerfile is not built; every command
runs without capabilities, whatever ``user`` asks, as root of the trial's own user namespace when
osmosis runs as root (host ids from ``OSMOSIS_SANDBOX_ID_BASE``, default 2046820352: never the
host's root; the trial's files are owned by them on the host), else as the user running osmosis;
``/proc/sys`` and ``/sys`` are read-only; background processes do not survive their command;
``network_mode = "allowlist"`` is refused;
``no-network`` gives a private loopback only, plus, with ``policy_relay``, the one socket to the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path, PurePosixPath
from typing import Any

from osmosis_harbor._harbor import prepare_harbor_import

prepare_harbor_import()

from harbor.environments.base import BaseEnvironment, ExecResult  # noqa: E402
from harbor.environments.capabilities import EnvironmentCapabilities  # noqa: E402
from harbor.models.task.config import NetworkMode, NetworkPolicy, TaskOS  # noqa: E402

from osmosis_harbor.bwrap import (  # noqa: E402
    CommandResult,
    CommandTimeout,
    HostLayout,
    Sandbox,
    SandboxStartError,
    check_bwrap,
    find_bwrap,
    python_paths,
    sandbox_id_base,
)
from osmosis_harbor.config import DEFAULT_MAX_PROCESSES, DEFAULT_MEMORY_MB  # noqa: E402
from osmosis_harbor.image_sandbox import ImageSandbox  # noqa: E402
from osmosis_harbor.images import ImageCache, TaskImage, default_cache_dir, has_dockerfile  # noqa: E402
from osmosis_harbor.relay import POLICY_SOCKET, HostRelay, parse_address  # noqa: E402
from osmosis_harbor.runtime import RUNTIME_DIR, runtime_for  # noqa: E402
from osmosis_harbor.safetree import SafeTree  # noqa: E402

__all__ = ["ENVIRONMENT_TYPE", "BubblewrapEnvironment"]

ENVIRONMENT_TYPE = "osmosis-bwrap"
"""What :meth:`BubblewrapEnvironment.type` returns."""

_BUILD_FILES = frozenset({"Dockerfile", "docker-compose.yaml", "docker-compose.yml", "compose.yaml", ".dockerignore"})
_LOG_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
_TESTS = "/tests"
_VERIFIER_ENV = {"PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1", "PYTHONDONTWRITEBYTECODE": "1"}
"""What every command of the verifier's phase gets: no interpreter reads what the agent could write."""


class BubblewrapEnvironment(BaseEnvironment):
    """A Harbor environment whose commands run in bubblewrap sandboxes on this machine."""

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: Any,
        task_env_config: Any,
        logger: Any = None,
        *,
        memory_mb: int | str | None = None,
        max_processes: int | str | None = DEFAULT_MAX_PROCESSES,
        hide_paths: list[str] | tuple[str, ...] | str = (),
        expose_paths: list[str] | tuple[str, ...] | str = (),
        bwrap: str | None = None,
        policy_relay: str | None = None,
        image: str | None = None,
        image_cache: str | None = None,
        bases: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        self._memory_mb = _count(memory_mb)
        self._max_processes = _count(max_processes)
        self._hide = _paths(hide_paths)
        self._expose = _paths(expose_paths)
        self._bwrap = bwrap
        self._policy_target = parse_address(policy_relay) if policy_relay else None
        self._relay: HostRelay | None = None
        role = session_id.rsplit("__", 1)[-1] if "__" in session_id else "env"
        self._root = Path(trial_paths.trial_dir) / "sandbox" / role
        self._tree = SafeTree(self._root)
        self._sandbox: Sandbox | None = None
        self._verifier_home: str | None = None
        """Set when the verifier's phase began (see the module docstring)."""
        self._image_setting = image or None
        self._image_cache = image_cache
        self._bases = {str(k): Path(v) for k, v in (bases or {}).items()}
        self._image: TaskImage | None = None
        self._on_image: ImageSandbox | None = None
        super().__init__(
            environment_dir, environment_name, session_id, trial_paths, task_env_config, logger=logger, **kwargs
        )

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # every exec is a fresh sandbox, so a new network policy simply applies to the next exec
        return EnvironmentCapabilities(disable_internet=True, dynamic_network_policy=True)

    @classmethod
    def preflight(cls) -> None:
        check_bwrap(find_bwrap())

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        if network_policy.network_mode == NetworkMode.ALLOWLIST:
            raise ValueError(f"{ENVIRONMENT_TYPE} cannot enforce network_mode='allowlist'")

    def _validate_definition(self) -> None:
        if self.task_env_config.os != TaskOS.LINUX:
            raise ValueError(f"{ENVIRONMENT_TYPE} runs Linux tasks only, not {self.task_env_config.os.value!r}")
        workdir = self.task_env_config.workdir
        if self._image_setting is None and workdir and HostLayout.detect().is_host_path(workdir):
            raise ValueError(
                f"the task's workdir {workdir!r} is on the read-only host filesystem; "
                f"{ENVIRONMENT_TYPE} needs a workdir outside the host's top-level folders (e.g. /app)"
            )

    @property
    def root(self) -> Path:
        """The host folder shown as ``/`` in the sandbox."""
        return self._root

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox runner (created at :meth:`start`)."""
        if self._sandbox is None:
            raise RuntimeError("the environment is not started")
        return self._sandbox

    @property
    def policy_socket(self) -> str | None:
        """Where the trial's commands find the socket to the policy (no-network with ``policy_relay``), else None."""
        return POLICY_SOCKET if self._relay is not None else None

    @property
    def workdir(self) -> str:
        """The task's working folder: its ``workdir``, else the image's ``WORKDIR`` (on a task image), else ``/app``."""
        if self.task_env_config.workdir:
            return str(self.task_env_config.workdir)
        if self._image is not None:
            return self._image.workdir or "/"
        return "/app"

    def _load_image(self) -> TaskImage:
        setting = self._image_setting
        assert setting is not None
        if setting != "build":
            return TaskImage.load(Path(setting))
        if not has_dockerfile(Path(self.environment_dir)):
            raise SandboxStartError(f"{self.environment_dir} has no Dockerfile, and image='build' asks to build it")
        root = Path(self._image_cache) if self._image_cache else default_cache_dir()
        return ImageCache(root, self._bases, sandbox_id_base()).build(Path(self.environment_dir))

    async def _start_on_image(self, memory: int, trials_root: Path) -> None:
        try:
            self._image = await asyncio.to_thread(self._load_image)
        except (OSError, ValueError, KeyError) as exc:
            raise SandboxStartError(f"cannot read the task's image ({self._image_setting}): {exc}") from None
        cache_root = self._image.folder.parent.parent
        try:
            runtime = await asyncio.to_thread(runtime_for, cache_root)
        except (OSError, RuntimeError) as exc:
            raise SandboxStartError(f"cannot bring osmosis's runtime into the trial: {exc}") from None
        sockets: list[tuple[Path, str]] = []
        self._root.mkdir(parents=True, exist_ok=True)
        sandbox = ImageSandbox(
            self._image,
            self._root,
            runtime,
            runtime_paths=python_paths(),
            expose=self._expose,
            hide=[trials_root, *self._hide],
            memory_mb=memory,
            max_processes=self._max_processes,
            network=not self._network_disabled,
            bwrap=find_bwrap(self._bwrap),
        )
        if self._policy_target is not None and self._network_disabled:
            self._relay = HostRelay(self._policy_target, sandbox.owner)
            try:
                socket = await self._relay.start()
            except OSError as exc:
                self._relay = None
                raise SandboxStartError(f"cannot open the trial's socket to its policy: {exc}") from None
            sockets.append((socket, POLICY_SOCKET))
        sandbox.sockets = sockets
        self._on_image = sandbox
        await sandbox.start()
        self._tree = SafeTree(sandbox.root, sandbox.owner)
        self._tree.mkdir(_parts(self.workdir))
        for folder in _LOG_DIRS:  # the image's USER's, whoever it is (the agent and the verifier write there)
            self._own_folder(folder)

    async def start(self, force_build: bool) -> None:
        memory = self._memory_mb or self.task_env_config.memory_mb or DEFAULT_MEMORY_MB
        trials_root = Path(self.trial_paths.trial_dir).parent
        if self._image_setting is not None:
            await self._start_on_image(memory, trials_root)
            return
        try:
            self._sandbox = Sandbox(
                self._root,
                expose=[*python_paths(), *self._expose],
                hide=[trials_root, *self._hide],
                memory_mb=memory,
                max_processes=self._max_processes,
                bwrap=find_bwrap(self._bwrap),
            )
            self._tree.owner = self._sandbox.owner  # what is copied in belongs to the sandbox's root
            self._sandbox.prepare([self.workdir, *_LOG_DIRS])
        except OSError as exc:
            raise SandboxStartError(f"cannot prepare the sandbox folder {self._root}: {exc}") from None
        if self._policy_target is not None and self._network_disabled:
            self._relay = HostRelay(self._policy_target, self._sandbox.owner)
            try:
                socket = await self._relay.start()
            except OSError as exc:
                self._relay = None
                raise SandboxStartError(f"cannot open the trial's socket to its policy: {exc}") from None
            self._sandbox.sockets = [(socket, POLICY_SOCKET)]
        env_dir = Path(self.environment_dir)
        if env_dir.is_dir():
            target = "/tests" if not self._enable_environment_dir_upload else self.workdir
            for entry in sorted(env_dir.iterdir()):
                if entry.name in _BUILD_FILES:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    self._tree.write_tree([*_parts(target), entry.name], entry)
                elif entry.is_file() and not entry.is_symlink():
                    self._tree.write_file([*_parts(target), entry.name], entry)

    async def stop(self, delete: bool) -> None:
        on_image, self._on_image = self._on_image, None
        if on_image is not None:
            await on_image.close()
            self._tree = SafeTree(self._root)
        relay, self._relay = self._relay, None
        if relay is not None:
            await relay.aclose()
        if self._sandbox is not None:
            await self._sandbox.close()
        if delete:
            self._tree.remove()

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | float | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        merged = self._merge_env(env) or {}
        folder = cwd or self.workdir
        if self._verifier_home is not None:
            merged = {**merged, "HOME": self._verifier_home, **_VERIFIER_ENV}
            folder = cwd or (self.workdir if self._on_image is not None else _TESTS)  # an image: its WORKDIR, as Docker
        if self._on_image is not None:
            return await self._exec_on_image(self._on_image, command, folder, merged, timeout_sec, user)
        if not self._tree.exists(_parts(folder)) and not HostLayout.detect().is_host_path(folder):
            self._tree.mkdir(_parts(folder))
        try:
            result = await self.sandbox.run(
                command,
                cwd=folder,
                env=merged,
                network=not self._network_disabled,
                timeout=float(timeout_sec) if timeout_sec else None,
            )
        except CommandTimeout as exc:
            raise RuntimeError(str(exc)) from None
        return _exec_result(result, self.sandbox.memory_mb)

    async def _exec_on_image(
        self,
        sandbox: ImageSandbox,
        command: str,
        folder: str,
        env: dict[str, str],
        timeout_sec: int | float | None,
        user: str | int | None,
    ) -> ExecResult:
        if self._tree.exists(_parts(folder)) is None:
            self._tree.mkdir(_parts(folder))
        try:
            result = await sandbox.run(
                command,
                cwd=folder,
                env=env,
                timeout=float(timeout_sec) if timeout_sec else None,
                user=user,
                network=not self._network_disabled,
            )
        except CommandTimeout as exc:
            raise RuntimeError(str(exc)) from None
        return _exec_result(result, sandbox.memory_mb)

    def _is_outside(self, path: str) -> bool:
        """True when ``path`` is not the trial's own (the host's, or the sandbox's machinery)."""
        if self._on_image is not None:
            top = _parts(path)[:1]
            return bool(top) and (top[0] in ("proc", "sys", "dev") or f"/{top[0]}" == RUNTIME_DIR)
        return HostLayout.detect().is_host_path(path)

    def _private(self, path: str, *, write: bool) -> list[str]:
        parts = _parts(path)
        if self._on_image is not None:
            if self._is_outside(path):
                raise PermissionError(f"cannot {'write to' if write else 'read'} {path}: not the trial's own files")
            return parts
        if HostLayout.detect().is_host_path(path):
            verb = "write to" if write else "read"
            raise PermissionError(f"cannot {verb} {path}: it is on the sandbox's read-only host filesystem")
        return parts

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        self._tree.write_file(self._private(target_path, write=True), source_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        parts = self._private(target_dir, write=True)
        if parts == [_TESTS.strip("/")] and self._verifier_home is None:
            self._begin_verification()
        self._tree.write_tree(parts, source_dir)

    @property
    def verifying(self) -> bool:
        """True once the verifier's phase began."""
        return self._verifier_home is not None

    def _begin_verification(self) -> None:
        """The verifier's phase begins: a ``/tests`` with nothing of the agent's, a fresh ``HOME``."""
        import secrets

        self._tree.discard([_TESTS.strip("/")])
        self._tree.mkdir([_TESTS.strip("/")])
        home = f"/osmosis-verifier-home-{secrets.token_hex(6)}"  # a name the agent could not guess
        if self._on_image is None:
            self._tree.mkdir([home.strip("/")], mode=0o700)
        else:  # the agent's daemons may still run: nothing of theirs in the verifier's logs, a HOME of its own
            self._tree.discard(_parts("/logs/verifier"))
            self._own_folder("/logs/verifier")
            self._own_folder(home, mode=0o700)
        self._verifier_home = home

    def _own_folder(self, folder: str, mode: int = 0o755) -> None:
        """A folder of the trial on an image, made (or taken over) for the image's ``USER``."""
        assert self._on_image is not None
        owner = self._on_image.owner
        with contextlib.suppress(ValueError):  # (an image without that user: its commands will say so)
            user = self._on_image.user()
            owner = (owner[0] + user.uid, owner[1] + user.gid)
        SafeTree(self._tree.root, owner).mkdir(_parts(folder), mode=mode)  # (what it makes is the user's)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        self._tree.read_file(self._private(source_path, write=False), target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        parts = self._private(source_dir, write=False)
        if self._tree.exists(parts) != "dir":
            raise FileNotFoundError(f"{source_dir} is not a folder in the sandbox")
        Path(target_dir).mkdir(parents=True, exist_ok=True)
        self._tree.read_tree(parts, target_dir)

    async def is_dir(self, path: str, user: str | int | None = None) -> bool:
        if self._on_image is None and HostLayout.detect().is_host_path(path):
            return os.path.isdir(path)
        return self._tree.exists(_parts(path)) == "dir"

    async def is_file(self, path: str, user: str | int | None = None) -> bool:
        if self._on_image is None and HostLayout.detect().is_host_path(path):
            return os.path.isfile(path)
        return self._tree.exists(_parts(path)) == "file"


def _exec_result(result: CommandResult, memory_mb: int | None) -> ExecResult:
    """Harbor's result of a sandboxed command (a kill by the memory limit said in its stderr)."""
    stderr = result.stderr
    if result.oom_killed:
        stderr += f"\n[osmosis sandbox: the memory limit ({memory_mb} MB) killed a process]"
    return ExecResult(stdout=result.stdout, stderr=stderr, return_code=result.return_code)


def _count(value: int | str | None) -> int | None:
    """A positive whole number from a keyword (``--ek`` gives strings); 0 or empty means none."""
    if value is None or value == "":
        return None
    number = int(value)
    return number if number > 0 else None


def _paths(value: list[str] | tuple[str, ...] | str) -> list[Path]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return [Path(p.strip()) for p in items if p and p.strip()]


def _parts(path: str) -> list[str]:
    pure = PurePosixPath(path)
    if not pure.is_absolute():
        raise ValueError(f"sandbox paths must be absolute, got {path!r}")
    parts = [p for p in pure.parts[1:] if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"sandbox paths must not contain '..': {path!r}")
    return parts
