"""``osmosis serve`` in a child process, and a process's CPU time: what the benches that drive a server
share (bench/server_throughput.py, bench/trainer_rows.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["CONFIG", "Served", "ticks"]

CONFIG = """
[rollout]
path = "{rollout}"
entrypoint = "main.py"

[run]
concurrency = {concurrency}
agent_timeout_sec = 60
grader_timeout_sec = 30
"""
"""A run config of the rollout folder ``{rollout}`` at ``{concurrency}``."""


def ticks(pid: int) -> float:
    """CPU seconds (user + system) of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Served:
    """``osmosis serve CONFIG --port 0 --output OUT [extra...]`` in a child process, its URL read from its
    banner; its stderr goes to ``OUT.log``."""

    def __init__(self, config: Path, out: Path, token: str, *extra: str) -> None:
        exe = Path(sys.executable).parent / "osmosis"
        cmd = [str(exe), "serve", str(config), "--port", "0", "--output", str(out), "--watch-stdin", *extra]
        env = {**os.environ, "OSMOSIS_SERVER_TOKEN": token}
        self.log = (out.parent / f"{out.name}.log").open("w")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env
        )  # stdin: the lifeline (the server stops when this bench dies)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        self.url = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"osmosis serve exited ({self.proc.wait()}); see {self.log.name}")
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                self.url = match.group(1)
                break
        if not self.url:
            raise SystemExit("osmosis serve did not start")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            assert self.proc.stdout is not None
            self.proc.stdout.close()
            self.log.close()
