"""Console output that a closed reader cannot stop: ``osmosis run ... | head -1`` keeps running.

:func:`survive_closed_output` replaces ``sys.stdout`` and ``sys.stderr`` with text streams over
the same file descriptors whose writes never raise ``BrokenPipeError``: on the first EPIPE the
descriptor is pointed at ``/dev/null`` (``dup2``), so that write and every later one (``print``,
``click.echo``, rich, a worker process forked afterwards, Python's flush at exit) succeed and go
nowhere. What was already written stays written; the command goes on and exits with its own status.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from collections.abc import Buffer
from typing import Any, TextIO

__all__ = ["survive_closed_output"]


class _QuietRaw(io.RawIOBase):
    """Writes to a file descriptor; once its reader has gone (EPIPE), to ``/dev/null`` instead."""

    def __init__(self, descriptor: int) -> None:
        super().__init__()
        self.descriptor = descriptor

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.descriptor

    def isatty(self) -> bool:
        return os.isatty(self.descriptor)

    def write(self, data: Buffer) -> int:
        try:
            return os.write(self.descriptor, data)
        except OSError as exc:
            if exc.errno != errno.EPIPE:  # (BrokenPipeError; ESHUTDOWN would be a socket's)
                raise
            _to_devnull(self.descriptor)
            return memoryview(data).nbytes

    def close(self) -> None:  # the descriptor is the process's standard stream: never closed here
        with contextlib.suppress(Exception):
            self.flush()
        super().close()


def _to_devnull(descriptor: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
    finally:
        os.close(devnull)


def _quiet(stream: TextIO) -> TextIO:
    if not isinstance(stream, io.TextIOWrapper):  # (None, a test's capture, or already replaced)
        return stream
    try:
        descriptor = stream.fileno()
        stream.flush()
    except (OSError, ValueError):  # no descriptor, or closed
        return stream
    raw = _QuietRaw(descriptor)
    # buffered as the stream was: Python's stderr writes through to its descriptor (no buffer), so a
    # line printed to it during a run reaches a log or a pipe then, not at exit after the summary
    buffer: Any = raw if isinstance(stream.buffer, io.RawIOBase) else io.BufferedWriter(raw)
    return io.TextIOWrapper(
        buffer,
        encoding=stream.encoding,
        errors=stream.errors,
        newline=None if os.name == "nt" else "\n",  # as Python's own standard streams
        line_buffering=stream.line_buffering,
        write_through=getattr(stream, "write_through", False),
    )


def survive_closed_output() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` immune to a reader that went away (see the module)."""
    sys.stdout = _quiet(sys.stdout)
    sys.stderr = _quiet(sys.stderr)
