"""A trial on a task's own image: one overlay and one sandbox that live as long as the trial.

:class:`ImageSandbox` starts, per trial, one process tree that holds everything:

* ``unshare --mount`` makes a mount namespace of its own, in which a kernel overlay is mounted over
  the image's read-only rootfs (:mod:`osmosis_harbor.images`), with the trial's writes in its upper
  folder (``<trial>/sandbox/<role>/upper``): the rootfs is never written, and the mount exists only
  in that namespace, so it goes with the trial's processes, even after ``kill -9`` of osmosis;
* bubblewrap shows the overlay as ``/`` (the image is the whole tree: no host ``/usr`` or ``/etc``),
  with a fresh ``/proc`` (``/proc/sys`` read-only) and ``/dev`` (no device can be made), ``/sys``
  read-only, ``/etc/hosts``, ``/etc/hostname`` and ``/etc/resolv.conf`` made for the trial, and
  read-only: osmosis's runtime and this Python below ``/.osmosis`` (:mod:`osmosis_harbor.runtime`),
  and the rollout code at its own path; its own PID, IPC, UTS and cgroup namespaces, and with ``network=False`` its own
  network namespace (a loopback only, plus the one socket to its policy);
* inside, a holder process that lives until the trial ends: this Python through the runtime's
  loader, as the host's uid 0 without a single capability, so no trial process can signal, trace or
  replace it (the trial's ``/etc/ld.so.preload`` is masked by an empty file, and the overlay forbids
  renaming ``/etc`` away: ``redirect_dir=off``).

Each command enters that sandbox's namespaces through descriptors opened once at start (never
``/proc/<pid>`` again: a pid can be reused) with ``nsenter``, which opens the trial's root as its
root and working folder before it enters any namespace (no step stands in the host's tree) and
takes the user's ids in the trial's user namespace, whose ids 0-65535 are the unprivileged host ids
of :func:`~osmosis_harbor.bwrap.sandbox_id_base` that own the rootfs's files: as the image's root a
command has every capability within that namespace and none outside it (``apt-get`` works,
``mknod`` of a device, ``/proc/sys`` writes, mounts over the sandbox's do not). It starts in the
image's ``WORKDIR`` with its ``Env`` (the runtime's ``env`` sets the folder and the loader's
variables, after the switch), and may leave processes behind: a daemon the agent starts is still
there for the verifier, as in a container. A command that times out or is cancelled is killed with
its process group; everything goes when the trial ends (:meth:`ImageSandbox.close`: the holder's
PID namespace dies, the cgroup is killed, the overlay unmounted with its namespace).

Needs root (the overlay, the id-mapped user namespace), bubblewrap, and util-linux.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from osmosis_harbor.bwrap import (
    _LOADER_VARIABLES,
    CommandResult,
    CommandTimeout,
    SandboxStartError,
    UserNamespace,
    _kill_tree,
    _tool,
    find_bwrap,
    is_exposable,
    sandbox_id_base,
    sandbox_limits,
)
from osmosis_harbor.images import TaskImage
from osmosis_harbor.limits import ExecLimits, Limits
from osmosis_harbor.runtime import RUNTIME_DIR, Runtime, relocated

__all__ = ["ImageSandbox", "ImageUser"]

_PRELOAD = "/etc/ld.so.preload"
_OUTPUT_LIMIT = 64 << 20
_LOCALE = frozenset({"LANG", "LANGUAGE"})
_NAMESPACES = ("mnt", "uts", "ipc", "pid", "net")
_NSENTER = {"mnt": "mount", "uts": "uts", "ipc": "ipc", "pid": "pid", "net": "net"}
_HOLDER = "import sys; print('ready', flush=True); sys.stdin.buffer.read()"
_START_TIMEOUT = 30.0


@attrs.frozen
class ImageUser:
    """A user of the image, from its ``/etc/passwd`` and ``/etc/group``."""

    uid: int
    gid: int
    home: str

    @classmethod
    def find(cls, root: Path, spec: str) -> ImageUser:
        """``spec`` as Docker's ``USER`` takes it (``name``, ``uid``, ``name:group``, ``uid:gid``, or empty: root).

        :raises ValueError: a name the image does not know.
        """
        name, _, group = (spec or "0").partition(":")
        passwd = _table(root / "etc/passwd")
        groups = _table(root / "etc/group")
        entry = next((e for e in passwd if name in (e[0], e[2])), None)
        if entry is None and not name.isdigit():
            raise ValueError(f"the image has no user {name!r} (its /etc/passwd)")
        uid = int(entry[2]) if entry is not None else int(name)
        gid = int(entry[3]) if entry is not None and len(entry) > 3 and entry[3].isdigit() else uid
        if group:
            found = next((g for g in groups if group in (g[0], g[2])), None)
            if found is None and not group.isdigit():
                raise ValueError(f"the image has no group {group!r} (its /etc/group)")
            gid = int(found[2]) if found is not None else int(group)
        home = entry[5] if entry is not None and len(entry) > 5 and entry[5] else ("/root" if uid == 0 else "/")
        return cls(uid, gid, home)


def _check_maskable(rootfs: Path, *, fresh: bool = False) -> None:
    """The image's ``/etc`` is a folder and its ``/etc/ld.so.preload`` a plain file or absent, so the
    sandbox's empty one can be mounted there (a link would lead the mount, and the loader, elsewhere).
    ``fresh``: a trial's upper layer, where ``/etc`` may also be absent."""
    etc = rootfs / "etc"
    if fresh and not os.path.lexists(etc):
        return
    if os.path.islink(etc) or not etc.is_dir():
        raise SandboxStartError(f"the image's /etc is not a plain folder ({rootfs}): osmosis cannot run a trial on it")
    preload = etc / "ld.so.preload"
    if os.path.lexists(preload) and (os.path.islink(preload) or not preload.is_file()):
        raise SandboxStartError(f"the image's {_PRELOAD} is not a plain file ({rootfs}): osmosis cannot mask it")


def _unlinked_file(folder: Path) -> int:
    """A file descriptor of a new, already removed file in ``folder`` (a command's output goes there)."""
    try:
        return os.open(folder, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError:  # a file system without O_TMPFILE
        fd, name = tempfile.mkstemp(dir=folder, prefix=".output-")
        os.unlink(name)
        return fd


def _read_all(fd: int) -> bytes:
    """What a command wrote, up to :data:`_OUTPUT_LIMIT` bytes (the rest is cut, and says so)."""
    size = os.fstat(fd).st_size
    cut = size > _OUTPUT_LIMIT
    size = min(size, _OUTPUT_LIMIT)
    chunks, offset = [], 0
    while offset < size:
        chunk = os.pread(fd, min(size - offset, 1 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    if cut:
        chunks.append(f"\n[osmosis sandbox: output cut at {_OUTPUT_LIMIT >> 20} MiB]\n".encode())
    return b"".join(chunks)


def _table(path: Path) -> list[list[str]]:
    """The lines of a trial's ``/etc/passwd`` or ``/etc/group``, split: read without following any
    symlink the trial made below its root (a link to a host file, a fifo: nothing), at most 4 MiB."""
    try:
        text = _read_plain(path).decode(errors="replace")
    except OSError:
        return []
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def _read_plain(path: Path) -> bytes:
    """A regular file under a trusted root (``.../etc/passwd`` of a trial: its last two parts are the
    trial's), opened one component at a time with ``O_NOFOLLOW``."""
    *top, folder, name = path.parts
    fd = os.open(os.path.join(*top), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        child = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        os.close(fd)
        fd = child
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(file).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.read(file, 4 << 20)
    finally:
        os.close(file)


@attrs.define
class ImageSandbox:
    """One trial's sandbox on a task image (see the module docstring).

    :param image: the built image (its rootfs is the overlay's lower layer).
    :param folder: the trial's own folder for the overlay's upper layer and the generated files.
    :param runtime: osmosis's runtime, shown at :data:`~osmosis_harbor.runtime.RUNTIME_DIR`.
    :param runtime_paths: this Python's folders (:func:`~osmosis_harbor.bwrap.python_paths`), shown
        read-only below :data:`~osmosis_harbor.runtime.RUNTIME_PY`.
    :param expose: host paths shown read-only at their own path (the rollout code): refused where the
        image has the same path.
    :param hide: host paths hidden where an exposed one would show them (the run's and trials' folders, the dataset).
    :param network: the host's network (True) or a private loopback (False), for commands that do not say.
    :param sockets: host unix sockets shown read-only, as ``(host path, sandbox path)``.
    """

    image: TaskImage
    folder: Path
    runtime: Runtime
    runtime_paths: Sequence[Path] = ()
    expose: Sequence[Path] = ()
    hide: Sequence[Path] = ()
    memory_mb: int | None = None
    max_processes: int | None = None
    network: bool = True
    hostname: str = "sandbox"
    sockets: Sequence[tuple[Path, str]] = ()
    bwrap: str = attrs.field(factory=find_bwrap)
    limits: Limits = attrs.field(factory=sandbox_limits)
    id_base: int | None = attrs.field(factory=sandbox_id_base)
    _holder: asyncio.subprocess.Process | None = attrs.field(default=None, init=False)
    _held: dict[str, int] = attrs.field(factory=dict, init=False)
    """Descriptors of the sandbox's namespaces and root, opened once at start: commands enter these,
    never ``/proc/<pid>`` again (a holder the trial killed could have its pid reused by a host process)."""
    _userns: UserNamespace | None = attrs.field(default=None, init=False)
    _cgroup: ExecLimits | None = attrs.field(default=None, init=False)
    _shell: str = attrs.field(default="/bin/sh", init=False)

    @property
    def owner(self) -> tuple[int, int]:
        assert self.id_base is not None
        return (self.id_base, self.id_base)

    @property
    def root(self) -> Path:
        """The trial's ``/`` as the host reaches it: a descriptor of this process's, opened at start
        through the holder (the overlay is mounted in its namespace alone)."""
        if "root" not in self._held:
            raise RuntimeError("the image sandbox is not started")
        return Path(f"/proc/self/fd/{self._held['root']}")

    @property
    def upper(self) -> Path:
        """The trial's writes (the overlay's upper layer), kept in its folder."""
        return self.folder / "upper"

    def _prepare(self) -> list[str]:
        """The trial's folders and files, and the overlay's mount options."""
        if self.id_base is None:
            raise SandboxStartError("a trial on a task image needs root (its overlay and its user namespace)")
        _check_maskable(self.image.rootfs)
        shown = [p for p in self.expose if is_exposable(p) and os.path.lexists(self.image.rootfs / p.relative_to("/"))]
        if shown:
            raise SandboxStartError(
                f"the rollout code at {shown[0]} is shown in trials at its own path, which the image has too "
                f"({self.image.task}): it would hide the image's own files; move the rollout folder (or set "
                "[backend.harbor] code_dir) outside the image's folders"
            )
        for name in ("upper", "work", "merged", "etc"):
            (self.folder / name).mkdir(parents=True, exist_ok=True)
        lower = self.image.rootfs
        top = lower.stat()
        os.chown(self.upper, top.st_uid, top.st_gid)  # the merged root is the upper's folder
        os.chmod(self.upper, stat.S_IMODE(top.st_mode))
        hosts = f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{self.hostname}\n"
        resolv = ""
        if self.network:
            with contextlib.suppress(OSError):
                resolv = Path("/etc/resolv.conf").read_text()
        empty = self.folder / "etc" / "ld.so.preload"
        empty.write_text("")
        os.chmod(empty, 0o444)
        for name, text in (("hosts", hosts), ("hostname", f"{self.hostname}\n"), ("resolv.conf", resolv)):
            path = self.folder / "etc" / name
            path.write_text(text)
            os.chown(path, *self.owner)
        for path in (lower, self.upper, self.folder / "work"):
            if any(c in str(path) for c in ",:\\\n"):
                raise SandboxStartError(f"an overlay cannot use a folder whose path has ',', ':' or '\\': {path}")
        _check_maskable(self.upper, fresh=True)  # (an upper kept from an earlier start could hold a link)
        layers = f"lowerdir={lower},upperdir={self.upper},workdir={self.folder / 'work'}"
        # redirect_dir=off: a folder holding a mount (/etc, with its masked ld.so.preload) cannot be renamed away
        return [f"{layers},redirect_dir=off", str(self.folder / "merged")]

    def _holder_argv(self, info_fd: int) -> list[str]:
        overlay, merged = self._prepare()
        mount = 'mount -t overlay osmosis-trial -o "$1" "$2" && shift 2 && exec "$@"'
        args = [_tool("unshare"), "--mount", "--propagation", "private", "--", "/bin/sh", "-c", mount, "sh"]
        args += [overlay, merged, self.bwrap, "--bind", merged, "/", "--proc", "/proc", "--dev", "/dev"]
        if os.path.isdir("/proc/sys"):
            args += ["--ro-bind", "/proc/sys", "/proc/sys"]
        if os.path.isdir("/sys"):
            args += ["--ro-bind", "/sys", "/sys"]
        for name in ("hosts", "hostname", "resolv.conf"):
            args += ["--bind", str(self.folder / "etc" / name), f"/etc/{name}"]
        # the dynamic loader reads /etc/ld.so.preload of the root it runs in, even when started by
        # path: the runtime's programs run privileged in the trial's tree, so it is always empty there
        args += ["--ro-bind", str(self.folder / "etc" / "ld.so.preload"), _PRELOAD]
        # osmosis's runtime: a tmpfs of the host root's (read-only once made) with the loader, its libraries,
        # env, and this Python's folders at their own paths below /.osmosis/py
        args += ["--perms", "0755", "--tmpfs", RUNTIME_DIR]
        args += ["--ro-bind", str(self.runtime.folder / "lib"), f"{RUNTIME_DIR}/lib"]
        args += ["--ro-bind", str(self.runtime.folder / "bin"), f"{RUNTIME_DIR}/bin"]
        made: set[str] = set()
        for path in sorted({p for p in self.runtime_paths if p.exists()}):
            target = Path(relocated(path))
            for parent in reversed(target.parents[: len(target.parents) - 2]):
                if str(parent) not in made:
                    made.add(str(parent))
                    args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", str(path), str(target)]
        exposed = sorted({p for p in self.expose if is_exposable(p) and p.exists()})
        self._make_mountpoints([*exposed, *(Path(inside) for _, inside in self.sockets)])
        for path in exposed:
            args += ["--ro-bind", str(path), str(path)]
        shown = sorted({p for p in self.runtime_paths if p.exists()})
        for hidden in sorted(set(self.hide)):  # where a shown folder holds it: the run's, the dataset, the tasks
            places = [str(hidden)] if any(hidden.is_relative_to(e) for e in exposed) else []
            places += [relocated(hidden)] if any(hidden.is_relative_to(p) for p in shown) else []
            for place in places if hidden.exists() else []:
                args += ["--tmpfs", place] if hidden.is_dir() else ["--ro-bind", "/dev/null", place]
        for host, inside in self.sockets:
            args += ["--ro-bind", str(host), inside]
        # a network namespace of its own (a loopback) that a command enters when it may not use the host's
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--unshare-net"]
        args += ["--remount-ro", RUNTIME_DIR]
        args += ["--hostname", self.hostname, "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
        # the holder: this Python through the runtime's loader, as the host's uid 0 without a single
        # capability (no trial process can signal, trace or replace it); it reads nothing of the image's
        args += ["--cap-drop", "ALL", "--chdir", "/", "--", *self.runtime.python(), "-I", "-S", "-c", _HOLDER]
        return args

    def _make_mountpoints(self, paths: Sequence[Path]) -> None:
        """The folders on the way to each path shown in the trial, made in the upper layer before the
        overlay is mounted: as the image has them (owner, mode), else the trial root's ``0755`` (bwrap
        would make them the host root's ``0700``, which the trial's root could not pass)."""
        lower = self.image.rootfs
        for path in paths:
            for depth in range(2, len(path.parts)):
                relative = Path(*path.parts[1:depth])
                below, above = lower / relative, self.upper / relative
                if os.path.lexists(above):
                    continue
                if os.path.islink(below):
                    break  # the image's own link: leave the way to bwrap
                if os.path.isdir(below):
                    info = below.stat()
                    above.mkdir()
                    os.chown(above, info.st_uid, info.st_gid)
                    os.chmod(above, stat.S_IMODE(info.st_mode))
                else:
                    above.mkdir(mode=0o755)
                    os.chown(above, *self.owner)
                    os.chmod(above, 0o755)

    async def start(self) -> None:
        """Mount the overlay and start the trial's holder. :raises SandboxStartError: with bwrap's reason."""
        if self.id_base is None:
            raise SandboxStartError("a trial on a task image needs root (its overlay and its user namespace)")
        self._userns = await asyncio.to_thread(UserNamespace.create, self.id_base)
        try:
            self._cgroup = self.limits.create(self.memory_mb, self.max_processes)
        except OSError as exc:
            raise SandboxStartError(f"cannot create the sandbox's cgroup: {exc}") from None
        info_read, info_write = os.pipe()
        try:
            try:
                argv = self._holder_argv(info_write)
            except OSError as exc:
                raise SandboxStartError(f"cannot prepare the trial's folder {self.folder}: {exc}") from None
            try:
                self._holder = await asyncio.create_subprocess_exec(
                    *self._cgroup.launcher(argv),
                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},  # no locale file is read
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                    pass_fds=(info_write,),
                )
            except OSError as exc:
                raise SandboxStartError(f"cannot start the trial's sandbox ({self.bwrap}): {exc}") from None
        finally:
            os.close(info_write)
        try:
            assert self._holder.stdout is not None
            ready = await asyncio.wait_for(self._holder.stdout.readline(), _START_TIMEOUT)
            info = await asyncio.to_thread(os.read, info_read, 4096)
        except TimeoutError:
            ready, info = b"", b""
        finally:
            os.close(info_read)
        if ready.strip() != b"ready":
            reason = await self._holder_failure()
            await self.close()
            raise SandboxStartError(f"the trial's sandbox on its image did not start: {reason}")
        try:
            self._hold(int(json.loads(info.decode())["child-pid"]))
        except (ValueError, KeyError, OSError) as exc:
            await self.close()
            raise SandboxStartError(f"bubblewrap reported no sandbox process ({exc})") from None
        bash = await asyncio.to_thread(os.path.lexists, self.root / "bin/bash")
        self._shell = "/bin/bash" if bash else "/bin/sh"

    def _hold(self, pid: int) -> None:
        """Open the sandbox's namespaces and root (the holder is still the trial's only process: no
        command has run yet, so the pid is surely the sandbox's)."""
        for name in _NAMESPACES:
            self._held[name] = os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        if os.stat(f"/proc/{pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            raise OSError(f"process {pid} is not in a mount namespace of its own")
        self._held["root"] = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    async def _holder_failure(self) -> str:
        holder = self._holder
        if holder is None or holder.stderr is None:
            return "no process"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(holder.wait(), 5)
        err = b""
        with contextlib.suppress(TimeoutError):
            err = await asyncio.wait_for(holder.stderr.read(), 2)
        text = err.decode(errors="replace").strip()
        return text[-2000:] or f"exit status {holder.returncode}"

    def user(self, spec: str | int | None = None) -> ImageUser:
        """The user a command runs as: ``spec``, else the image's ``USER``, else root."""
        chosen = str(spec) if spec is not None and str(spec) != "" else self.image.user
        return ImageUser.find(self.root, chosen)

    def environment(self, user: ImageUser, env: Mapping[str, str]) -> dict[str, str]:
        """A command's environment: the image's ``Env``, ``HOME`` of its user, then ``env``."""
        base = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME": self.hostname}
        return {**base, **self.image.env, "HOME": user.home, **{str(k): str(v) for k, v in env.items()}}

    async def run(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | int | None = None,
        network: bool | None = None,
    ) -> CommandResult:
        """Run ``command`` in the trial (what it leaves running stays, as in a container).

        :param network: the host's network (True) or the trial's own loopback (False); default :attr:`network`.

        :raises CommandTimeout: past ``timeout`` seconds (its process group is killed).
        :raises SandboxStartError: the trial's sandbox is gone.
        """
        if "root" not in self._held or self._userns is None or self._cgroup is None:
            raise SandboxStartError("the trial's sandbox is not running")
        try:
            who = self.user(user)
        except ValueError as exc:
            raise SandboxStartError(str(exc)) from None
        environment = self.environment(who, env or {})
        # what the loader or the locale would read from a path reaches only the command, once unprivileged
        late = [k for k in sorted(environment) if k in _LOADER_VARIABLES or k in _LOCALE or k.startswith("LC_")]
        loader = [f"{k}={environment.pop(k)}" for k in late]
        folder = cwd or self.image.workdir or "/"
        held = self._held
        argv = [_tool("nsenter"), *(f"--{_NSENTER[n]}=/proc/self/fd/{held[n]}" for n in ("mnt", "uts", "ipc", "pid"))]
        if not (self.network if network is None else network):
            argv.append(f"--net=/proc/self/fd/{held['net']}")
        # root and working folder: the trial's root, held open (nsenter opens --wd before it enters any
        # namespace; a path such as "/" would be the host's), so no step of it ever stands in the host's tree
        root = f"/proc/self/fd/{held['root']}"
        # the user's ids in the trial's user namespace (nsenter sets them without a lookup; it drops the
        # supplementary groups), then the runtime's env (the folder, the loader's variables) and the shell:
        # nothing between the host's side and the command reads a file of the trial's
        argv += [f"--user=/proc/self/fd/{self._userns.fd}", f"--setuid={who.uid}", f"--setgid={who.gid}"]
        argv += [f"--root={root}", f"--wd={root}", "--", *self.runtime.command("env"), f"--chdir={folder}", *loader]
        argv += [self._shell, "-c", command]
        kills = self._cgroup.oom_kills()
        # files, not pipes: a daemon the command leaves behind keeps writing where it was told to,
        # and the command is over when its own process ends (as ``docker exec``), not when that daemon does
        outputs = [_unlinked_file(self.folder) for _ in range(2)]
        try:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self._cgroup.launcher(argv),
                    env=environment,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=outputs[0],
                    stderr=outputs[1],
                    start_new_session=True,
                    pass_fds=(self._userns.fd, *held.values()),
                )
            except OSError as exc:
                raise SandboxStartError(f"cannot enter the trial's sandbox: {exc}") from None
            try:
                try:
                    await asyncio.wait_for(proc.wait(), timeout)
                except TimeoutError:
                    raise CommandTimeout(f"Command timed out after {timeout:g} seconds") from None
            finally:
                if proc.returncode is None:  # its process group only: what it started as a daemon stays
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    with contextlib.suppress(Exception):
                        await asyncio.shield(asyncio.wait_for(proc.wait(), 10))
            out, err = (_read_all(fd) for fd in outputs)
        finally:
            for fd in outputs:
                os.close(fd)
        stderr = err.decode("utf-8", "replace")
        code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        if code in (1, 125) and stderr.startswith(("nsenter: ", "setpriv: ")) and not out:
            raise SandboxStartError(f"cannot enter the trial's sandbox: {stderr.strip()}")
        return CommandResult(code, out.decode("utf-8", "replace"), stderr, self._cgroup.oom_kills() > kills)

    async def close(self) -> None:
        """End the trial: its holder (and with it every process and the overlay's mount), its cgroup."""
        holder, self._holder = self._holder, None
        held, self._held = self._held, {}
        for fd in held.values():
            os.close(fd)
        if holder is not None:
            if holder.stdin is not None:
                holder.stdin.close()
            try:
                await asyncio.wait_for(holder.wait(), 5)
            except TimeoutError:
                pass
            if self._cgroup is not None:
                await _kill_tree(holder, self._cgroup)
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is not None:
            cgroup.kill()
            if cgroup.dirs:
                await asyncio.to_thread(cgroup.remove)
        userns, self._userns = self._userns, None
        if userns is not None:
            userns.close()
