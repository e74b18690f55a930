"""A real rollout server on 127.0.0.1 (uvicorn in a thread), and helpers to drive it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

from osmosis_server.serving import bind, url_of

T = TypeVar("T")
TOKEN = "test-token-0123456789abcdefXYZ"
HERE = Path(__file__).resolve().parent
PLUGIN = HERE.parent
REPO = PLUGIN.parent.parent


class Served:
    """``with Served(app) as s:`` serves ``app`` on a free port of 127.0.0.1 until the block ends."""

    def __init__(self, app: Any, port: int = 0) -> None:
        self.app = app
        self.sock = bind("127.0.0.1", port)
        self.url = url_of(self.sock)
        config = uvicorn.Config(app, lifespan="on", log_level="warning", proxy_headers=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def service(self) -> Any:
        return self.app.state.service

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.loop = self.server.servers[0].get_loop()
        return self

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server's loop (a coroutine it returns is awaited) and return its value."""

        async def run() -> T:
            value: Any = fn()
            if asyncio.iscoroutine(value):
                value = await value
            return value  # type: ignore[no-any-return]

        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(60)

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        assert not self.thread.is_alive(), "the server did not stop"


def run[T](coro_fn: Callable[[], Awaitable[T]]) -> T:
    """Run a client-side coroutine on a fresh loop, closing the loop's HTTP session after."""
    from osmosis_core.http import http_scope

    async def main() -> T:
        async with http_scope():
            return await coro_fn()

    return asyncio.run(main())


REFERENCE = os.environ.get("OSMOSIS_AI_PYTHON")
"""A Python with osmosis-ai[server]==0.3.8 (the reference SDK), for the tests marked ``reference``."""


def reference_validate(folder: Path, results: Sequence[Any], admissions: Sequence[Any] = ()) -> dict[str, Any]:
    """What osmosis-ai 0.3.8's own models make of result and admission documents (run by its
    Python, ``reference/ref_validate.py``); fails the test when they refuse one."""
    documents = folder / "documents.json"
    documents.write_text(json.dumps({"results": list(results), "admissions": list(admissions)}))
    assert REFERENCE is not None
    out = subprocess.run(
        [REFERENCE, str(HERE / "reference" / "ref_validate.py"), str(documents)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def osmosis_exe() -> str:
    return str(Path(sys.executable).parent / "osmosis")


class ServeProcess:
    """``osmosis serve ...`` in a child process; waits for its "listening on" line."""

    def __init__(self, args: list[str], *, cwd: Path, env: dict[str, str] | None = None, log: Path) -> None:
        self.log_path = log
        self.log = log.open("w")
        environment = {k: v for k, v in os.environ.items() if k != "OSMOSIS_SERVER_TOKEN"}
        environment.update(env or {})
        self.proc = subprocess.Popen(
            [osmosis_exe(), "serve", *args, "--watch-stdin"],  # stdin: it stops when the tests do, however they end
            cwd=cwd,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        assert self.proc.stdout is not None
        self.stdout: list[str] = []
        self.url = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.stdout.append(line)
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                self.url = match.group(1)
                break
        if not self.url:
            self.proc.kill()
            self.proc.wait()
            self.log.close()
            raise RuntimeError(f"osmosis serve did not start:\n{''.join(self.stdout)}\n{log.read_text()}")
        self._reader = threading.Thread(target=self._drain_stdout, daemon=True)
        self._reader.start()

    def _drain_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.append(line)

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._reader.join(5)
            self.log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)
        if not self.log.closed:
            self.log.close()

    def output(self) -> str:
        return "".join(self.stdout) + self.log_path.read_text()
