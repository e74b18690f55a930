"""The bubblewrap sandbox: one fresh ``bwrap`` per command over a per-trial private root.

What a sandboxed command sees:

* ``/`` is the trial's private folder (``<trial>/sandbox/<role>/``), writable and kept between the
  trial's commands, so ``/app``, ``/logs``, ``/tests``, ``/tmp``, ``/root`` and anything the task
  creates are the trial's own;
* only what a trial needs of the host is shown, read-only (an allow-list, not a deny-list): the
  system folders (``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc`` without its credential files
  such as ``/etc/shadow``, ``/etc/ssh``, ``/etc/ssl/private``); the Python that runs osmosis (its
  prefix, standard library and site-packages) and, of any other folder on its import path (an
  editable install's project), only the packages and modules in it, never its other files; the
  rollout code; and ``expose_paths``. Everything else of the host (``/home``, ``/root``, ``/opt``,
  ``/var``, ``/srv``, a workspace with its datasets and runs) does not exist inside, and the run
  folder, every trial folder, the dataset, the tasks' folders and ``hide_paths`` are hidden even
  where an exposed path would show them;
* its own PID, IPC, UTS and cgroup namespaces, no capabilities, a clean environment (only
  ``PATH``, ``HOME=/root``, ``TMPDIR``, the locale and what Harbor passes); the host's
  network (so a policy on 127.0.0.1 is reachable) unless the task asks for none, then only a
  private loopback;
* memory and process limits on the trial's commands (:mod:`osmosis_harbor.limits`); when a
  command ends, times out or is cancelled, everything it started is killed (its own PID namespace,
  ``--die-with-parent``, and the trial's cgroup).

>>> layout = HostLayout.detect()
>>> "usr" in layout.read_only and "home" not in layout.read_only
True
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from osmosis_core import InfraError
from osmosis_harbor.limits import ExecLimits, Limits

__all__ = [
    "PRIVATE_TOPLEVEL",
    "SYSTEM_TOPLEVEL",
    "BubblewrapMissing",
    "CommandResult",
    "CommandTimeout",
    "HostLayout",
    "Sandbox",
    "SandboxStartError",
    "check_bwrap",
    "find_bwrap",
    "is_exposable",
    "python_paths",
    "sandbox_limits",
]

SYSTEM_TOPLEVEL = frozenset({"bin", "etc", "lib", "lib32", "lib64", "libx32", "sbin", "usr"})
"""The host's top-level folders a trial sees (read-only): system programs, libraries, configuration."""

PRIVATE_TOPLEVEL = frozenset({"home", "root", "tmp", "run", "mnt", "media", "boot", "lost+found"})
"""Host top-level folders the trial gets its own (empty) folder in place of."""

_SPECIAL = frozenset({"proc", "dev", "sys"})
_CREDENTIALS = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/sudoers.d",
    "/etc/krb5.keytab",
    "/var/lib/sss",
    "/var/lib/docker",
    "/var/lib/containers",
    "/var/run",
)
"""Host paths hidden inside the read-only host (an empty file or folder is shown instead)."""

_ENV_PASSTHROUGH = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_INSTALL_HINT = (
    "bubblewrap is not installed, and the harbor backend's sandbox needs it: install it with "
    "`apt-get install -y bubblewrap` (Debian/Ubuntu), `dnf install -y bubblewrap` (Fedora/RHEL), "
    "`apk add bubblewrap` (Alpine) or `pacman -S bubblewrap` (Arch); or run trials in a container "
    'engine with [backend.harbor.environment] type = "docker" (or "podman", "daytona")'
)


class BubblewrapMissing(InfraError):
    """``bwrap`` is not installed (the message says how to install it)."""


class SandboxStartError(InfraError):
    """bubblewrap could not set up the sandbox (namespaces, mounts, cgroups)."""


class CommandTimeout(RuntimeError):
    """A sandboxed command ran past its timeout (its whole process tree was killed)."""


def find_bwrap(configured: str | None = None) -> str:
    """The path of ``bwrap``. :raises BubblewrapMissing: with install instructions."""
    name = configured or os.environ.get("OSMOSIS_BWRAP") or "bwrap"
    found = shutil.which(name)
    if found is None:
        raise BubblewrapMissing(_INSTALL_HINT if configured is None else f"{configured!r} not found; {_INSTALL_HINT}")
    return found


@functools.cache
def check_bwrap(path: str) -> None:
    """Run ``bwrap`` once (a trivial sandbox) so a broken setup fails with bwrap's own reason."""
    import subprocess

    args = [path, "--ro-bind", "/", "/", "--unshare-pid", "--cap-drop", "ALL", "--die-with-parent", "true"]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxStartError(f"bubblewrap ({path}) cannot run: {exc}") from None
    if proc.returncode != 0:
        reason = proc.stderr.strip() or f"exit status {proc.returncode}"
        raise SandboxStartError(
            f"bubblewrap ({path}) cannot create a sandbox here: {reason} (it needs user namespaces or root; "
            "see kernel.unprivileged_userns_clone / user.max_user_namespaces)"
        )


def python_paths(*, import_path: bool = False) -> list[Path]:
    """What this interpreter needs inside a sandbox to import what it imports here.

    :param import_path: the folders to put on the trial interpreter's ``sys.path`` (every folder on
        this one's), instead of the paths to show: its prefixes, standard library and
        site-packages whole, and of any other folder on ``sys.path`` (an editable install's
        project root) only the packages and modules in it, not its tests, data or runs.
    """
    if import_path:
        return [Path(p).absolute() for p in sys.path if p and Path(p).is_dir()]
    whole: list[str] = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    whole.append(str(Path(os.path.realpath(sys.executable)).parent.parent))
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            whole.append(sysconfig.get_paths()[key])
    wholes = [Path(p).absolute() for p in whole]
    picked: list[Path] = list(wholes)
    for entry in filter(None, sys.path):
        path = Path(entry).absolute()
        if path.is_file() or any(path.is_relative_to(w) for w in wholes):
            picked.append(path)
        elif path.is_dir():
            picked.extend(_importables(path))
    out: list[Path] = []
    for path in picked:
        if path.exists():
            out.append(path)
            real = Path(os.path.realpath(path))
            if real != path:
                out.append(real)
    return out


def _importables(folder: Path) -> list[Path]:
    """The packages and modules directly in ``folder`` (what importing from it can reach)."""
    found = []
    with contextlib.suppress(OSError):
        for child in folder.iterdir():
            if child.name.startswith("."):
                continue
            if (child.is_dir() and (child / "__init__.py").is_file()) or (
                child.is_file() and child.suffix in (".py", ".so", ".pyd")
            ):
                found.append(child)
    return found


def is_exposable(path: Path) -> bool:
    """False for ``/``, top-level folders and home folders: those are never shown whole."""
    if len(path.parts) <= 2:
        return False
    if path.parts[1] == "home" and len(path.parts) <= 3:
        return False
    with contextlib.suppress(RuntimeError, KeyError):
        if path == Path.home():
            return False
    return True


def _minimal(paths: Iterable[Path]) -> list[Path]:
    """Sorted, de-duplicated paths with those inside another one dropped."""
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: (len(p.parts), str(p))):
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return sorted(kept)


@attrs.frozen
class HostLayout:
    """How the host's top level is shown: read-only folders and symlinks (``/bin -> usr/bin``)."""

    read_only: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]

    @classmethod
    @functools.cache
    def detect(cls) -> HostLayout:
        read_only, links = [], []
        for entry in sorted(os.scandir("/"), key=lambda e: e.name):
            name = entry.name
            if name not in SYSTEM_TOPLEVEL:
                continue
            if entry.is_symlink():
                links.append((name, os.readlink(entry.path)))
            elif entry.is_dir(follow_symlinks=False):
                read_only.append(name)
        return cls(tuple(read_only), tuple(links))

    def is_host_path(self, path: str) -> bool:
        """True when ``path`` lies on the read-only host (not in the trial's own folders)."""
        parts = Path(path).parts
        if len(parts) < 2:
            return False
        top = parts[1]
        return top in self.read_only or top in _SPECIAL or any(top == name for name, _ in self.symlinks)


@functools.cache
def sandbox_limits() -> Limits:
    """How this process limits sandboxes (detected once)."""
    return Limits.detect()


@attrs.frozen
class CommandResult:
    """How a sandboxed command ended."""

    return_code: int
    stdout: str
    stderr: str
    oom_killed: bool = False


@attrs.define
class Sandbox:
    """Runs commands in fresh bubblewrap sandboxes over one private root folder.

    :param root: the private folder shown as ``/`` (created by :meth:`prepare`).
    :param expose: host paths bound read-only at their own path (this Python, the rollout code).
    :param hide: host paths to hide (an empty folder is shown instead).
    :param memory_mb: memory limit of all its commands together (None: none).
    :param max_processes: process limit of all its commands together (None: none).
    """

    root: Path
    expose: Sequence[Path] = ()
    hide: Sequence[Path] = ()
    memory_mb: int | None = None
    max_processes: int | None = None
    bwrap: str = attrs.field(factory=find_bwrap)
    path_env: str = attrs.field(factory=lambda: f"{Path(sys.executable).parent}:{_DEFAULT_PATH}")
    layout: HostLayout = attrs.field(factory=HostLayout.detect)
    limits: Limits = attrs.field(factory=sandbox_limits)
    _cgroup: ExecLimits | None = attrs.field(default=None, init=False)

    def _limits_for_run(self) -> ExecLimits:
        if self._cgroup is None:
            try:
                self._cgroup = self.limits.create(self.memory_mb, self.max_processes)
            except OSError as exc:
                raise SandboxStartError(f"cannot create the sandbox's cgroup: {exc}") from None
        return self._cgroup

    async def close(self) -> None:
        """Release the sandbox's cgroups (every command has ended by now)."""
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is not None and cgroup.dirs:
            await asyncio.to_thread(cgroup.remove)

    def prepare(self, private_dirs: Iterable[str] = ()) -> None:
        """Create the private root with the host's top-level symlinks and the given folders."""
        self.root.mkdir(parents=True, exist_ok=True)
        for name, target in self.layout.symlinks:
            link = self.root / name
            if not link.is_symlink() and not link.exists():
                link.symlink_to(target)
        for name in ("tmp", "root", "home"):
            (self.root / name).mkdir(exist_ok=True)
        os.chmod(self.root / "tmp", 0o1777)
        os.chmod(self.root / "root", 0o700)
        for rel in private_dirs:
            (self.root / rel.lstrip("/")).mkdir(parents=True, exist_ok=True)

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The whole environment of a sandboxed command: a clean base plus ``env`` (nothing else leaks in).

        It is handed to bwrap as its own environment, never on its command line, so a key in it
        does not show in ``ps`` or in ``/proc/<pid>/cmdline``.
        """
        base = {"PATH": self.path_env, "HOME": "/root", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"}
        for key in _ENV_PASSTHROUGH:
            if key in os.environ:
                base[key] = os.environ[key]
        return {**base, **{str(k): str(v) for k, v in env.items()}}

    def argv(self, command: str, *, cwd: str, network: bool) -> list[str]:
        """The ``bwrap`` command line that runs ``command`` with bash in a fresh sandbox."""
        args = [self.bwrap, "--bind", str(self.root), "/"]
        for name in self.layout.read_only:
            args += ["--ro-bind", f"/{name}", f"/{name}"]
        if os.path.isdir("/sys"):
            args += ["--ro-bind", "/sys", "/sys"]
        for secret in _CREDENTIALS:
            if os.path.lexists(secret) and not os.path.islink(secret):
                args += ["--tmpfs", secret] if os.path.isdir(secret) else ["--ro-bind", "/dev/null", secret]
        exposed = self.exposed()
        for path in exposed:
            args += ["--ro-bind", str(path), str(path)]
        for hidden in _minimal(self.hide):
            if hidden.exists() and (
                self.layout.is_host_path(str(hidden)) or any(hidden.is_relative_to(e) for e in exposed)
            ):
                args += ["--tmpfs", str(hidden)] if hidden.is_dir() else ["--ro-bind", "/dev/null", str(hidden)]
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not network:
            args.append("--unshare-net")
        args += ["--hostname", "sandbox", "--cap-drop", "ALL", "--die-with-parent", "--new-session"]
        args += ["--chdir", cwd, "--", _shell(), "-c", command]
        return args

    def exposed(self) -> list[Path]:
        """The host paths bound read-only at their own path (never ``/``, a top-level or a home folder)."""
        return [p for p in _minimal(p for p in self.expose if is_exposable(p)) if p.exists()]

    async def run(
        self,
        command: str,
        *,
        cwd: str = "/",
        env: Mapping[str, str] | None = None,
        network: bool = True,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run ``command`` (bash) in a fresh sandbox; kill its whole tree on timeout or cancel.

        :raises CommandTimeout: past ``timeout`` seconds.
        :raises SandboxStartError: when bubblewrap cannot set the sandbox up.
        """
        limits = self._limits_for_run()
        kills = limits.oom_kills()
        argv = limits.launcher(self.argv(command, cwd=cwd, network=network))
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=self.environment(env or {}),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxStartError(f"cannot start bubblewrap ({self.bwrap}): {exc}") from None
        try:
            try:
                if timeout is None:
                    out, err = await proc.communicate()
                else:
                    out, err = await asyncio.wait_for(proc.communicate(), timeout)
            except TimeoutError:
                raise CommandTimeout(f"Command timed out after {timeout:g} seconds") from None
        finally:
            if proc.returncode is None:
                await asyncio.shield(_kill_tree(proc, limits))
        stderr = err.decode("utf-8", "replace")
        code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        if code == 125 and limits.dirs and not out:
            raise SandboxStartError(f"cannot move the sandbox into its cgroup: {stderr.strip()}")
        if code == 1 and stderr.startswith("bwrap: ") and not out:
            raise SandboxStartError(f"bubblewrap could not start the sandbox: {stderr.strip()}")
        return CommandResult(code, out.decode("utf-8", "replace"), stderr, limits.oom_kills() > kills)


async def _kill_tree(proc: asyncio.subprocess.Process, limits: ExecLimits) -> None:
    """SIGKILL the launcher's session (bwrap), then anything left in the cgroups; reap."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    limits.kill()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), 10)


@functools.cache
def _shell() -> str:
    return "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
