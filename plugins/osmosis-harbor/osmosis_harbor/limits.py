"""Memory and process limits for a trial's sandboxed commands: cgroups when possible, else rlimits.

Each trial environment gets its own cgroup, created *under this process's own cgroup* in every
controller (so whatever limits or accounts for this process still covers the sandbox), and
removed when the environment stops (or, at the latest, when this process exits):

* cgroup v1 (``/sys/fs/cgroup/{memory,pids}``): ``memory.limit_in_bytes`` and ``pids.max``;
* cgroup v2 (``/sys/fs/cgroup``, with ``memory`` and ``pids`` delegated): ``memory.max``, ``pids.max``;
* neither writable (not root, no delegation): ``ulimit -v`` (address space) and ``ulimit -u``
  (processes of the sandbox's user: its root has its own ids, so it binds as root too) in the
  launcher shell.

The cgroup also gives a sure way to kill everything a command started (:meth:`ExecLimits.kill`).

>>> limits = Limits.detect()
>>> limits.kind in ("cgroup-v1", "cgroup-v2", "rlimit")
True
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

import attrs

__all__ = ["ExecLimits", "Limits"]

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_counter = itertools.count()


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    found: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def _sweep(parents: Iterable[Path]) -> None:
    """Remove empty sandbox cgroups left by a process that was killed (its pid is gone)."""
    for parent in parents:
        for child in parent.glob("osmosis-sandbox-*-*"):
            pid = child.name.split("-")[2]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):
                    child.rmdir()


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


@attrs.frozen(eq=False)
class ExecLimits:
    """The limits of a trial's commands: the cgroup folders they run in (empty with rlimits)."""

    dirs: tuple[Path, ...]
    ulimit: str
    """Shell ``ulimit`` commands for the launcher when no cgroup applies."""

    def launcher(self, argv: list[str]) -> list[str]:
        """``argv`` started through a shell that first joins the cgroups (or sets rlimits)."""
        script = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; '
        script += self.ulimit + 'exec "$@"'
        procs = [str(d / "cgroup.procs") for d in self.dirs]
        return ["/bin/sh", "-c", script, "osmosis-sandbox", str(len(procs)), *procs, *argv]

    def kill(self) -> None:
        """SIGKILL every process still in these cgroups."""
        for d in self.dirs:
            with contextlib.suppress(OSError):
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)

    def peak_memory_mb(self) -> float | None:
        """The command's peak memory, when a memory cgroup measured it."""
        for d in self.dirs:
            for name in ("memory.max_usage_in_bytes", "memory.peak"):
                with contextlib.suppress(OSError, ValueError):
                    return int((d / name).read_text()) / (1 << 20)
        return None

    def oom_kills(self) -> int:
        """How many processes the memory limit has killed so far."""
        total = 0
        for d in self.dirs:
            for name in ("memory.oom_control", "memory.events"):
                with contextlib.suppress(OSError, ValueError):
                    for line in (d / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            total += int(value)
        return total

    def remove(self) -> None:
        """Remove the cgroups once their processes are gone (kills stragglers; retries briefly)."""
        for d in self.dirs:
            for attempt in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self.kill()
                    time.sleep(0.005 * (attempt + 1))
        _LIVE.discard(self)


@attrs.frozen
class Limits:
    """How this process can limit a command: which cgroup parents it may create children in."""

    kind: str
    """``cgroup-v1``, ``cgroup-v2`` or ``rlimit``."""
    parents: tuple[tuple[str, Path], ...] = ()
    """(controller, this process's own cgroup folder) pairs."""

    @classmethod
    def detect(cls) -> Limits:
        """Find writable memory and pids cgroups of this process, else fall back to rlimits."""
        own = _own_cgroups()
        v1 = []
        for controller in ("memory", "pids"):
            if controller in own:
                parent = _CGROUP_ROOT / controller / own[controller].lstrip("/")
                if _writable_dir(parent) and (parent / "cgroup.procs").exists():
                    v1.append((controller, parent))
        if len(v1) == 2:
            _sweep(parent for _, parent in v1)
            return cls("cgroup-v1", tuple(v1))
        if "" in own and (_CGROUP_ROOT / "cgroup.controllers").is_file():
            parent = _CGROUP_ROOT / own[""].lstrip("/")
            try:
                enabled = (parent / "cgroup.subtree_control").read_text().split()
            except OSError:
                enabled = []
            if {"memory", "pids"} <= set(enabled) and _writable_dir(parent):
                _sweep([parent])
                return cls("cgroup-v2", (("", parent),))
        return cls("rlimit")

    def create(self, memory_mb: int | None, max_processes: int | None) -> ExecLimits:
        """A fresh cgroup (or rlimit set) for a trial's commands."""
        if self.kind == "rlimit" or (memory_mb is None and max_processes is None):
            ulimit = ""
            if memory_mb is not None:
                ulimit += f"ulimit -v {memory_mb * 1024} 2>/dev/null; "
            if max_processes is not None:
                # bash says -u, dash (Debian's /bin/sh) -p; binds the trial's own uid, never the host's root
                ulimit += f"{{ ulimit -u {max_processes} || ulimit -p {max_processes}; }} 2>/dev/null; "
            return ExecLimits((), ulimit)
        name = f"osmosis-sandbox-{os.getpid()}-{next(_counter)}"
        made: list[Path] = []
        try:
            for controller, parent in self.parents:
                d = parent / name
                d.mkdir()
                made.append(d)
                if controller in ("memory", "") and memory_mb is not None:
                    limit = str(memory_mb << 20)
                    if controller == "memory":
                        (d / "memory.limit_in_bytes").write_text(limit)
                        with contextlib.suppress(OSError):  # no swap accounting: RAM is limited alone
                            (d / "memory.memsw.limit_in_bytes").write_text(limit)
                    else:
                        (d / "memory.max").write_text(limit)
                        with contextlib.suppress(OSError):
                            (d / "memory.swap.max").write_text("0")
                if controller in ("pids", "") and max_processes is not None:
                    (d / "pids.max").write_text(str(max_processes))
        except OSError:
            for d in made:
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        limits = ExecLimits(tuple(made), "")
        _LIVE.add(limits)
        return limits


_LIVE: set[ExecLimits] = set()
"""Cgroups not yet removed; whatever is left at exit is removed then (never left behind)."""


@atexit.register
def _remove_leftovers() -> None:
    for limits in list(_LIVE):
        limits.remove()
