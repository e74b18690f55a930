"""The advisory lock that gives a run folder one writer at a time.

``osmosis run`` holds an exclusive ``flock`` on ``<run folder>/.osmosis.lock`` for its whole life;
a second run (a ``--resume`` started while the first is still alive, a server writing the same
folder) is refused with one line naming the holder. The kernel drops the lock when the holder
dies, however it dies, so a crashed run never leaves a stale lock behind; a process it forks
(a worker) closes its copy of the lock at once, so the lock never outlives the process that took it.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> with RunLock(folder):
...     RunLock(folder).acquire()
Traceback (most recent call last):
...
osmosis_core.errors.OsmosisError: ...is in use by another osmosis process (pid ...)...
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
import weakref
from pathlib import Path
from types import TracebackType

from osmosis_core.errors import OsmosisError

__all__ = ["LOCK_FILE", "RunLock"]

LOCK_FILE = ".osmosis.lock"

_held: weakref.WeakSet[RunLock] = weakref.WeakSet()


def _drop_in_child() -> None:
    # a forked child (a worker, the zygote) closes its copy at once (see the module docstring)
    for lock in list(_held):
        fd, lock._fd = lock._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_drop_in_child)


class RunLock:
    """An exclusive advisory lock on a run folder (a context manager)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock, or fail at once.

        :raises OsmosisError: another live process holds it (its pid and command are named).
        """
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            raise OsmosisError(
                f"{self.path.parent} is in use by another osmosis process ({holder or 'unknown holder'}); "
                "wait for it to finish, or choose another --output"
            ) from None
        except OSError:
            os.close(fd)
            raise
        info = f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(sys.argv)[:300]}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
        self._fd = fd
        _held.add(self)
        return self

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        fd, self._fd = self._fd, None
        _held.discard(self)
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
