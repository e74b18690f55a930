"""The scripted policy server in a child process (``osmosis run --stub-policy``, benchmarks).

A separate process keeps the stand-in's CPU off the run's own core. It never outlives the process
that started it: the child watches its standard input, whose other end only this process holds,
and exits at end-of-file (the parent died, even by ``kill -9``); on Linux it also has a
parent-death signal.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from types import TracebackType
from typing import IO

__all__ = ["StubPolicyProcess"]

BANNER_PREFIX = "osmosis stub policy listening on "


class StubPolicyProcess:
    """Start ``python -m osmosis_core.testing.policy_server`` and learn its URL.

    >>> with StubPolicyProcess(latency=0.0) as stub:       # doctest: +SKIP
    ...     print(stub.url)
    http://127.0.0.1:40123/v1
    """

    def __init__(self, *, latency: float = 0.0, startup_timeout: float = 20.0, flavor: str = "openai") -> None:
        self.latency = latency
        self.flavor = flavor
        """How the stand-in answers token requests (``openai``, ``vllm``, ``drifting``)."""
        self.startup_timeout = startup_timeout
        self.url = ""
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None

    def start(self) -> StubPolicyProcess:
        """Start the child and wait until it listens."""
        cmd = [
            sys.executable,
            "-m",
            "osmosis_core.testing.policy_server",
            "--port",
            "0",
            "--latency",
            str(self.latency),
            "--flavor",
            self.flavor,
            "--watch-stdin",
        ]
        # stderr goes to a file, not a pipe nobody drains (a full pipe would block the server)
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives as long as the child
        # its own session: a terminal's Ctrl-C reaches the run, which stops its rollouts first and the
        # stand-in after, instead of the stand-in dropping the connections of rollouts in flight
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, start_new_session=True
        )
        assert self._proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        line = ""
        while time.monotonic() < deadline:
            line = self._proc.stdout.readline()
            if line.startswith(BANNER_PREFIX) or not line:
                break
        if not line.startswith(BANNER_PREFIX):
            self.stop()
            self._stderr.seek(0)
            err = self._stderr.read()[-2000:]
            raise RuntimeError(f"the stub policy server did not start: {err.strip() or line.strip() or 'no output'}")
        self.url = line[len(BANNER_PREFIX) :].strip()
        return self

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after 5 s)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()  # end-of-file: the child's signal to stop
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> StubPolicyProcess:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
