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
* never the host's root: when osmosis runs as root, every command runs as root of the trial's own
  user namespace, whose ids 0-65535 are the unprivileged host ids ``id_base``-``id_base+65535``
  (:func:`sandbox_id_base`), so files it makes are owned by those ids on the host and it has no
  power over anything of the host's (bubblewrap sets the sandbox up as root, then the command joins
  that namespace and drops every capability: :class:`UserNamespace`). Otherwise (osmosis run by a
  user) bubblewrap's own user namespace runs it as that user;
* ``/proc/sys`` and ``/sys`` read-only, a fresh ``/proc`` and ``/dev`` (no device can be made);
* its own PID, IPC, UTS and cgroup namespaces, no capabilities, a clean environment (only
  ``PATH``, ``HOME=/root``, ``TMPDIR``, the locale and what Harbor passes); the host's
  network (so a policy on 127.0.0.1 is reachable) unless the task asks for none, then only a
  private loopback and the one unix socket to its policy (:mod:`osmosis_harbor.relay`);
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
import grp
import os
import pwd
import shutil
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from osmosis_core import InfraError
from osmosis_harbor.limits import ExecLimits, Limits
from osmosis_harbor.safetree import SafeTree

__all__ = [
    "DEFAULT_ID_BASE",
    "ID_COUNT",
    "PRIVATE_TOPLEVEL",
    "SYSTEM_TOPLEVEL",
    "BubblewrapMissing",
    "CommandResult",
    "CommandTimeout",
    "HostLayout",
    "Sandbox",
    "SandboxStartError",
    "UserNamespace",
    "check_bwrap",
    "check_id_range",
    "find_bwrap",
    "is_exposable",
    "python_paths",
    "sandbox_id_base",
    "sandbox_limits",
]

DEFAULT_ID_BASE = 0x7A000000
"""The host uid and gid a sandbox's root is when osmosis runs as root (2046820352; its ids 0-65535 are
this and the 65535 after it): above every range ``useradd`` hands out in ``/etc/subuid`` by default and
systemd's container ranges, below 2**31. ``OSMOSIS_SANDBOX_ID_BASE`` sets another."""
ID_COUNT = 65536
"""How many ids a sandbox's user namespace maps (0-65535: root, system users, ``nobody``)."""

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

_LOADER_VARIABLES = frozenset(
    {
        "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LD_AUDIT", "LD_DEBUG", "LD_DEBUG_OUTPUT",
        "LD_DYNAMIC_WEAK", "LD_HWCAP_MASK", "LD_LIBRARY_PATH", "LD_ORIGIN_PATH", "LD_PRELOAD", "LD_PROFILE",
        "LD_SHOW_AUXV", "LD_USE_LOAD_BIAS", "LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE", "NIS_PATH", "NLSPATH",
        "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR",
    }
)  # fmt: skip
"""glibc's list of variables a privileged program ignores (``UNSECURE_ENVVARS``, less ``TMPDIR``): a
command's own (from Harbor or the task) never reach bwrap or nsenter, which run as root; the command
gets them (through ``env``)."""
_ENV_PASSTHROUGH = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_INSTALL_HINT = (
    "bubblewrap is not installed, and the harbor backend's sandbox needs it: install it with "
    "`apt-get install -y bubblewrap` (Debian/Ubuntu), `dnf install -y bubblewrap` (Fedora/RHEL), "
    "`apk add bubblewrap` (Alpine) or `pacman -S bubblewrap` (Arch); or run trials in a container "
    'engine with [backend.harbor.environment] type = "docker" (or "podman", "daytona")'
)


_USERNS_HINT = (
    "the harbor backend's sandbox runs a trial as root of its own user namespace, never as the host's "
    "root; user namespaces must be available (sysctl user.max_user_namespaces > 0; in a container, "
    "one that allows them), with unshare, nsenter and setpriv (util-linux); or run trials in a "
    'container engine with [backend.harbor.environment] type = "docker" (or "podman", "daytona")'
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
    """Run ``bwrap`` once (a trivial sandbox shaped like a trial's) so a broken setup fails with its reason."""
    base = sandbox_id_base()
    args = [path, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--die-with-parent"]
    userns = UserNamespace.create(base) if base is not None else None
    args += ["--cap-drop", "ALL", "--", "true"] if userns is None else ["--", *userns.enter(), "true"]
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=30, pass_fds=(userns.fd,) if userns is not None else ()
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxStartError(f"bubblewrap ({path}) cannot run: {exc}") from None
    finally:
        if userns is not None:
            userns.close()
    if proc.returncode != 0:
        reason = proc.stderr.strip() or f"exit status {proc.returncode}"
        hint = (
            "it needs user namespaces or root; see kernel.unprivileged_userns_clone / user.max_user_namespaces"
            if base is None
            else _USERNS_HINT
        )
        raise SandboxStartError(f"bubblewrap ({path}) cannot create a sandbox here: {reason} ({hint})")


def sandbox_id_base() -> int | None:
    """The host uid (and gid) a sandbox's root is, when osmosis runs as root; None otherwise.

    As root, a trial must not run as the host's root: it runs as root of its own user namespace,
    whose ids 0-65535 are the host ids from this one on (``OSMOSIS_SANDBOX_ID_BASE``, default
    :data:`DEFAULT_ID_BASE`). Run by a user, bubblewrap makes its own user namespace and the trial
    runs as that user: None.

    :raises SandboxStartError: ``OSMOSIS_SANDBOX_ID_BASE`` is not a whole number.
    """
    if os.geteuid() != 0:
        return None
    raw = os.environ.get("OSMOSIS_SANDBOX_ID_BASE", "").strip()
    if not raw:
        return DEFAULT_ID_BASE
    try:
        return int(raw)
    except ValueError:
        raise SandboxStartError(f"OSMOSIS_SANDBOX_ID_BASE={raw!r} is not a whole number (a host uid)") from None


@functools.cache
def check_id_range(base: int) -> None:
    """Refuse a sandbox id range that is not free: a host user or group, or a subordinate range, in it.

    :raises SandboxStartError: naming what overlaps, and how to choose another range.
    """
    end = base + ID_COUNT
    fix = "set OSMOSIS_SANDBOX_ID_BASE to the first of 65536 free host ids"
    if not 65536 <= base <= 2**31 - ID_COUNT:
        raise SandboxStartError(f"the sandbox's host ids {base}-{end - 1} are not between 65536 and 2**31-1; {fix}")
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            lines = Path(path).read_text().splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            owner, _, rest = line.strip().partition(":")
            first, _, count = rest.partition(":")
            if first.isdigit() and count.isdigit() and int(first) < end and base < int(first) + int(count):
                raise SandboxStartError(
                    f"{path}:{number} gives {owner} the host ids {first}-{int(first) + int(count) - 1}, which "
                    f"overlap the sandbox's {base}-{end - 1}; {fix}"
                )
    for user in pwd.getpwall():
        if base <= user.pw_uid < end:
            raise SandboxStartError(f"the host user {user.pw_name} has uid {user.pw_uid}, in the sandbox's; {fix}")
    for group in grp.getgrall():
        if base <= group.gr_gid < end:
            raise SandboxStartError(f"the host group {group.gr_name} has gid {group.gr_gid}, in the sandbox's; {fix}")


class UserNamespace:
    """A user namespace whose ids 0-65535 are the host ids ``base``-``base+65535``.

    Made by root, which may write any id map (no ``newuidmap`` or ``/etc/subuid`` entry needed):
    ``unshare --user`` starts a process in a new namespace, this process writes its maps and keeps
    the namespace open as a file descriptor; the process then exits. bubblewrap sets a sandbox up as
    the host's root (it opens the folders it shows, wherever they are), then the command joins the
    namespace with ``nsenter`` and drops every capability with ``setpriv`` (:meth:`enter`): the
    sandbox's mount, PID, network and other namespaces belong to the host's, so even a capability
    regained in this one would give it no power over them.
    """

    def __init__(self, fd: int, base: int) -> None:
        self.fd = fd
        self.base = base

    @classmethod
    def create(cls, base: int) -> UserNamespace:
        """:raises SandboxStartError: no user namespace can be made here (with why)."""
        check_id_range(base)
        unshare = _tool("unshare")
        try:
            proc = subprocess.Popen(
                [unshare, "--user", "/bin/sh", "-c", "echo ready; read x"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise SandboxStartError(f"cannot start {unshare}: {exc}") from None
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            if proc.stdout.readline() != b"ready\n":
                proc.wait(10)
                reason = proc.stderr.read().decode(errors="replace").strip() or f"exit status {proc.returncode}"
                raise SandboxStartError(f"cannot create a user namespace: {reason} ({_USERNS_HINT})")
            try:
                for name in ("uid_map", "gid_map"):
                    with open(f"/proc/{proc.pid}/{name}", "w") as out:
                        out.write(f"0 {base} {ID_COUNT}\n")
                fd = os.open(f"/proc/{proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise SandboxStartError(f"cannot map the sandbox's user namespace: {exc} ({_USERNS_HINT})") from None
        finally:
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        return cls(fd, base)

    def enter(self) -> list[str]:
        """The command-line prefix, run as root inside a bubblewrap sandbox given :attr:`fd`, that runs
        the rest as this namespace's root (uid 0 there, :attr:`base` on the host) without capabilities."""
        return [
            *(_tool("nsenter"), f"--user=/proc/self/fd/{self.fd}", "--"),
            *(_tool("setpriv"), "--inh-caps=-all", "--bounding-set=-all", "--"),
        ]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _tool(name: str) -> str:
    """The path of a system program, also inside a sandbox (under a read-only system folder)."""
    found = next((p for p in (f"/usr/bin/{name}", f"/bin/{name}", f"/usr/sbin/{name}") if os.path.exists(p)), None)
    if found is None:
        raise SandboxStartError(f"{name} (util-linux) is not installed, and the sandbox needs it: {_USERNS_HINT}")
    return found


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
    :param id_base: the host id its root is (its own user namespace, see :func:`sandbox_id_base`);
        None: bubblewrap's own user namespace, as the user running osmosis (not root).
    :param sockets: host unix sockets bound read-only into every command, as ``(host path, sandbox
        path)`` (a no-network trial's path to its policy: :mod:`osmosis_harbor.relay`).
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
    id_base: int | None = attrs.field(factory=sandbox_id_base)
    sockets: Sequence[tuple[Path, str]] = ()
    _cgroup: ExecLimits | None = attrs.field(default=None, init=False)
    _userns: UserNamespace | None = attrs.field(default=None, init=False)
    _shown: tuple[list[Path], list[Path], list[tuple[str, ...]]] | None = attrs.field(default=None, init=False)
    """(exposed, hidden, folders on the way to an exposed path), worked out at the first command."""

    @property
    def owner(self) -> tuple[int, int] | None:
        """The host (uid, gid) of the sandbox's root, which owns its private folder (None: this process's)."""
        return None if self.id_base is None else (self.id_base, self.id_base)

    async def _user_namespace(self) -> UserNamespace | None:
        if self.id_base is not None and self._userns is None:
            self._userns = await asyncio.to_thread(UserNamespace.create, self.id_base)
        return self._userns

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
        userns, self._userns = self._userns, None
        if userns is not None:
            userns.close()

    def prepare(self, private_dirs: Iterable[str] = ()) -> None:
        """Create the private root with the host's top-level symlinks and the given folders (its root owns them)."""
        self.root.mkdir(parents=True, exist_ok=True)
        made = [self.root]
        for name, target in self.layout.symlinks:
            link = self.root / name
            if not link.is_symlink() and not link.exists():
                link.symlink_to(target)
                made.append(link)
        for rel in ("tmp", "root", "home", *(r.strip("/") for r in private_dirs)):
            folder = self.root
            for part in Path(rel).parts:
                folder = folder / part
                if not folder.is_dir():
                    folder.mkdir()
                    made.append(folder)
        os.chmod(self.root / "tmp", 0o1777)
        os.chmod(self.root / "root", 0o700)
        if self.owner is not None:
            for path in made:
                os.lchown(path, *self.owner)

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The whole environment of a sandboxed command: a clean base plus ``env`` (nothing else leaks in).

        It is handed to bwrap as its own environment, never on its command line, so a key in it
        does not show in ``ps`` or in ``/proc/<pid>/cmdline`` (as root, only the dynamic loader's
        variables, such as ``LD_LIBRARY_PATH``, travel on it: see :data:`_LOADER_VARIABLES`).
        """
        base = {"PATH": self.path_env, "HOME": "/root", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"}
        for key in _ENV_PASSTHROUGH:
            if key in os.environ:
                base[key] = os.environ[key]
        return {**base, **{str(k): str(v) for k, v in env.items()}}

    def argv(
        self,
        command: str,
        *,
        cwd: str,
        network: bool,
        userns: UserNamespace | None = None,
        env_args: Sequence[str] = (),
    ) -> list[str]:
        """The ``bwrap`` command line that runs ``command`` with bash in a fresh sandbox.

        :param userns: the user namespace the command joins (as its root, without capabilities) once
            bubblewrap has set the sandbox up; its descriptor must be passed to bwrap.
        :param env_args: ``NAME=value`` settings the command gets through ``env`` (the dynamic loader's
            variables, which no program running as the host's root may see).
        """
        args = [self.bwrap, "--bind", str(self.root), "/"]
        for name in self.layout.read_only:
            args += ["--ro-bind", f"/{name}", f"/{name}"]
        if os.path.isdir("/sys"):
            args += ["--ro-bind", "/sys", "/sys"]
        exposed = self.exposed()
        for path in exposed:
            args += ["--ro-bind", str(path), str(path)]
        for secret in _CREDENTIALS:  # after the exposed paths: one of them cannot show a secret again
            shown = self.layout.is_host_path(secret) or any(Path(secret).is_relative_to(e) for e in exposed)
            if shown and os.path.lexists(secret) and not os.path.islink(secret):  # (else bwrap would make its way)
                args += ["--tmpfs", secret] if os.path.isdir(secret) else ["--ro-bind", "/dev/null", secret]
        for hidden in self._worked_out()[1]:
            if hidden.exists() and (
                self.layout.is_host_path(str(hidden)) or any(hidden.is_relative_to(e) for e in exposed)
            ):
                args += ["--tmpfs", str(hidden)] if hidden.is_dir() else ["--ro-bind", "/dev/null", str(hidden)]
        args += ["--proc", "/proc", "--dev", "/dev"]
        if os.path.isdir("/proc/sys"):  # the kernel's settings: never writable from a trial
            args += ["--ro-bind", "/proc/sys", "/proc/sys"]
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not network:
            args.append("--unshare-net")
        for host, inside in self.sockets:
            args += ["--ro-bind", str(host), inside]
        args += ["--hostname", "sandbox", "--die-with-parent", "--new-session", "--chdir", cwd, "--"]
        if userns is None:
            args[-1:-1] = ["--cap-drop", "ALL"]
        else:  # bwrap keeps root for nsenter, which joins the namespace; setpriv drops its capabilities
            args += userns.enter()
        if env_args:
            args += [_tool("env"), *env_args]
        return [*args, _shell(), "-c", command]

    def _make_mountpoints(self) -> None:
        """Make the folders on the way to each exposed path in the private root, as real folders of the
        sandbox's root (bwrap would make them the host root's, and would follow a symlink the trial
        left in their place): checked before every command, since the trial may move its own."""
        tree = SafeTree(self.root, self.owner)
        exposed, _, ways = self._worked_out()
        for parts in ways:
            tree.mkdir(parts)
        for path in exposed:  # and no symlink where bwrap makes the mount point itself
            if not self.layout.is_host_path(str(path)) and tree.exists(path.parts[1:]) == "other":
                tree.discard(path.parts[1:])
        for _, inside in self.sockets:  # a real folder on the way, and bwrap makes the mount point itself
            parts = Path(inside).parts[1:]
            tree.mkdir(parts[:-1])
            if tree.exists(parts) not in (None, "file"):
                tree.discard(parts)

    def _worked_out(self) -> tuple[list[Path], list[Path], list[tuple[str, ...]]]:
        if self._shown is None:
            exposed = [p for p in _minimal(p for p in self.expose if is_exposable(p)) if p.exists()]
            parents = {p.parent for p in exposed if not self.layout.is_host_path(str(p))}
            ways = [q.parts[1:] for q in parents if not any(o != q and o.is_relative_to(q) for o in parents)]
            self._shown = (exposed, _minimal(self.hide), sorted(ways))
        return self._shown

    def exposed(self) -> list[Path]:
        """The host paths bound read-only at their own path (never ``/``, a top-level or a home folder)."""
        return list(self._worked_out()[0])

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
        userns = await self._user_namespace()
        environment = self.environment(env or {})
        env_args: list[str] = []
        if userns is not None:  # bwrap and nsenter run as root: none of the loader's variables reach them
            env_args = [f"{k}={environment.pop(k)}" for k in sorted(environment) if k in _LOADER_VARIABLES]
        argv = self.argv(command, cwd=cwd, network=network, userns=userns, env_args=env_args)
        try:
            self._make_mountpoints()
        except OSError as exc:
            raise SandboxStartError(f"cannot prepare the sandbox folder {self.root}: {exc}") from None
        try:
            proc = await asyncio.create_subprocess_exec(
                *limits.launcher(argv),
                env=environment,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                pass_fds=(userns.fd,) if userns is not None else (),
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
        if code == 1 and stderr.startswith(("bwrap: ", "nsenter: ", "setpriv: ")) and not out:
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
