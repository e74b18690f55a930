"""How a process osmosis starts learns that its parent died, so that nothing outlives a run.

Two independent signals (the worker pool's zygote and workers, and the ``--stub-policy`` server,
each use one or both):

* a **lifeline pipe**: the parent holds the only write end of a pipe whose read end the child
  watches; when the parent dies, however it dies (``kill -9`` included), the kernel closes the
  write end and the child reads end-of-file. Every other copy of the write end must be closed in
  the child (a forked child inherits them all);
* a **parent-death signal** (Linux ``prctl(PR_SET_PDEATHSIG)``): a worker is killed when its
  zygote dies, and the ``--stub-policy`` server (which ``exec``\\ s) when the run dies.

A server started as a command (``osmosis serve --watch-stdin``, the scripted policy server's
``--watch-stdin``) has its standard input as the lifeline: :func:`signal_when_parent_gone` sends it
SIGTERM at end-of-file, so it stops the way SIGTERM stops it (``osmosis serve`` drains).

>>> import os
>>> read_end, write_end = os.pipe()
>>> os.close(write_end)               # what the kernel does when the parent dies
>>> parent_gone(read_end)
True
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import signal
import sys
import threading

__all__ = ["parent_gone", "set_parent_death_signal", "signal_when_parent_gone"]

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM, *, expected_parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only).

    :param expected_parent: the parent's pid as the child knows it; if the parent is already gone
        (it died before the call), ``sig`` is sent to ourselves right away.
    :returns: whether the platform supports it.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
    return True


def parent_gone(read_end: int) -> bool:
    """True when the lifeline pipe's write end is closed everywhere (the parent died): end-of-file."""
    ready, _, _ = select.select([read_end], [], [], 0)
    if not ready:
        return False
    try:
        return os.read(read_end, 1) == b""
    except BlockingIOError:
        return False


def signal_when_parent_gone(fd: int = 0, sig: int = signal.SIGTERM) -> threading.Thread:
    """Send ``sig`` to this process once ``fd`` (by default standard input, a pipe whose write end
    the parent holds) reaches end-of-file: the parent died, ``kill -9`` included. A thread blocks
    reading it (and drops what it reads); a parent already gone is seen at once. The process stops
    as ``sig`` stops it, through its own handler.
    """

    def watch() -> None:
        with contextlib.suppress(OSError):  # closed, or not readable: as good as end-of-file
            while os.read(fd, 65536):
                pass
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=watch, name="osmosis-lifeline", daemon=True)
    thread.start()
    return thread
