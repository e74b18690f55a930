"""Fixtures of the osmosis-trainer tests.

The trainer side has no osmosis-core, so a real rollout server runs as a process of another
Python: ``$OSMOSIS_SERVE_PYTHON`` (a Python with osmosis-server and osmosis-gateway installed; the
``trainer`` nox session builds one), else this Python when it has them. Without either, the tests
that need a server are skipped with that reason, and every other test still runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # for ``import trainer_helpers`` (importlib mode)
REPO = HERE.parent.parent.parent
CONFIG = REPO / "configs" / "training" / "multiply-plain.toml"
# hypothesis keeps a cache; not in the working tree
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(Path(tempfile.gettempdir()) / "osmosis-trainer-hypothesis"))


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OSMOSIS_SERVER_TOKEN", raising=False)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for the module (the torch tests): a tiny model generates 15 times faster
    on one thread than on two when the other core is busy (osmosis serve, another session)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def serve_python() -> str | None:
    """The Python that runs ``osmosis serve`` for these tests, or None (then they are skipped)."""
    configured = os.environ.get("OSMOSIS_SERVE_PYTHON")
    if configured:
        return configured
    probe = "import osmosis_server, osmosis_gateway, osmosis_core.testing"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
        return sys.executable
    return None


class _Child:
    """A child process whose output we read until a line announces its URL; it is ended at close."""

    def __init__(self, args: list[str], *, banner: str, env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        assert self.proc.stdout is not None
        self.url = ""
        deadline = time.monotonic() + 60
        seen: list[str] = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            match = re.search(banner + r"(http://\S+)", line)
            if match:
                self.url = match.group(1)
                break
        if not self.url:
            self.close()
            raise RuntimeError(f"{args[:3]} did not start:\n{''.join(seen)}\n{log.read_text()}")
        # the rest of its output is read (and dropped), so a full pipe never blocks it
        self._reader = threading.Thread(target=self.proc.stdout.read, daemon=True)
        self._reader.start()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.join(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.log.close()


@attrs.frozen
class LiveServer:
    """``osmosis serve configs/training/multiply-plain.toml --traces`` and its scripted policy (the
    calculator of ``osmosis_core.testing`` answering as vLLM: token ids and logprobs)."""

    url: str
    token: str
    policy_url: str
    run_dir: Path


@attrs.frozen
class RolloutServer:
    """``osmosis serve CONFIG`` in a process of its own (``$OSMOSIS_SERVE_PYTHON``)."""

    url: str
    token: str
    run_dir: Path


def _serve_python_or_skip() -> str:
    python = serve_python()
    if python is None:
        pytest.skip(
            "needs a rollout server: set OSMOSIS_SERVE_PYTHON to a Python with osmosis-server and "
            "osmosis-gateway installed (the trainer nox session does)"
        )
    return python


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "PYTHONPATH", "VIRTUAL_ENV"))}


@contextlib.contextmanager
def rollout_server(config: Path, folder: Path, *, traces: bool = True) -> Iterator[RolloutServer]:
    """``osmosis serve CONFIG [--traces]`` on a free port, its run folder in ``folder/run``; ended at exit."""
    python = _serve_python_or_skip()
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    args = [str(Path(python).parent / "osmosis"), "serve", str(config), "--port", "0", "--grace", "1"]
    args += ["--output", str(folder / "run"), "--watch-stdin", *(["--traces"] if traces else [])]
    server = _Child(
        args, banner="listening on ", env={**_clean_env(), "OSMOSIS_SERVER_TOKEN": token}, log=folder / "serve.log"
    )
    try:
        yield RolloutServer(server.url, token, folder / "run")
    finally:
        server.close()


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    python = _serve_python_or_skip()
    folder = tmp_path_factory.mktemp("serve")
    policy = _Child(
        [python, "-m", "osmosis_core.testing.policy_server", "--port", "0", "--flavor", "vllm", "--watch-stdin"],
        banner="listening on ",
        env=_clean_env(),
        log=folder / "policy.log",
    )
    try:
        with rollout_server(CONFIG, folder) as server:
            yield LiveServer(server.url, server.token, policy.url, server.run_dir)
    finally:
        policy.close()


@attrs.frozen
class TokenInServer:
    """``osmosis serve`` of the multiply-plain rollout with the documented token-in configuration
    (``[traces] adapter = "sglang-generate"``, ``tokenizer = <folder>``), and a stand-in SGLang
    router (``tests/token_engine.py``: ``osmosis_core.testing``'s ``ScriptedTokenEngine``) whose
    tokenizer folder the gateway renders with. A rollout's policy URL is the router's, or a bridge's."""

    url: str
    token: str
    run_dir: Path
    engine_url: str
    tokenizer: Path

    def traces(self, prefix: str = "") -> dict[str, dict[str, object]]:
        """The traces written so far, by rollout id (those whose id starts with ``prefix``)."""
        lines = (self.run_dir / "traces.jsonl").read_text().splitlines()
        found = {line["rollout_id"]: line for line in map(json.loads, lines)}
        return {k: v for k, v in found.items() if k.startswith(prefix)}


def token_in_config(folder: Path, tokenizer: Path) -> Path:
    """multiply-plain's config with the token-in ``[traces]`` table of the README (SGLang's ``/generate``)."""
    text = CONFIG.read_text().replace(
        'path = "rollouts/multiply-plain"', f'path = "{REPO / "rollouts" / "multiply-plain"}"'
    )
    text += f'\n[traces]\nadapter = "sglang-generate"\ntokenizer = "{tokenizer}"\n'
    config = folder / "multiply-plain-token-in.toml"
    config.write_text(text)
    return config


@pytest.fixture(scope="module")
def token_in_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenInServer]:
    python = _serve_python_or_skip()
    folder = tmp_path_factory.mktemp("token-in")
    tokenizer = folder / "tokenizer"
    engine = _Child(
        [python, str(HERE / "token_engine.py"), "--tokenizer", str(tokenizer)],
        banner="listening on ",
        env=_clean_env(),
        log=folder / "engine.log",
    )
    try:
        with rollout_server(token_in_config(folder, tokenizer), folder) as server:
            yield TokenInServer(server.url, server.token, server.run_dir, engine.url, tokenizer)
    finally:
        engine.close()


@pytest.fixture
def start_policy(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start a scripted policy of its own (``tests/fault_policy.py``, run by the serve Python):
    ``start_policy(flavor="drifting", faults=[{"rollout_id": ..., "kind": "status", "status": 500,
    "times": 9}])`` gives its OpenAI base URL; every policy started is ended after the test."""
    python = serve_python()
    if python is None:
        pytest.skip("needs a Python with osmosis-core for the scripted policy (OSMOSIS_SERVE_PYTHON)")
    env = _clean_env()
    started: list[_Child] = []

    def start(*, flavor: str = "vllm", faults: Sequence[dict[str, object]] = ()) -> str:
        args = [python, str(HERE / "fault_policy.py"), "--flavor", flavor]
        for fault in faults:
            args += ["--fault", json.dumps(fault)]
        child = _Child(args, banner="listening on ", env=env, log=tmp_path / f"policy-{len(started)}.log")
        started.append(child)
        return child.url

    try:
        yield start
    finally:
        for child in started:
            child.close()
