"""Fixtures of the osmosis-server tests: real servers on 127.0.0.1, real rollouts, the scripted policy."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for ``import server_helpers`` (importlib mode)
# hypothesis keeps a cache; not in the working tree
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(Path(tempfile.gettempdir()) / "osmosis-server-hypothesis"))


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OSMOSIS_SERVER_TOKEN", raising=False)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``serve(backend, **create_app_kwargs)``: a real server for the test (token TOKEN, run folder in tmp_path)."""
    from server_helpers import TOKEN, Served

    from osmosis_server import ServerSettings, create_app

    started: list[Served] = []

    def start(backend: Any, **kwargs: Any) -> Served:
        kwargs.setdefault("token", TOKEN)
        kwargs.setdefault("run_dir", tmp_path / f"run{len(started)}")
        kwargs.setdefault("configure_logging", False)
        kwargs.setdefault("settings", ServerSettings(grace_sec=1.0))
        served = Served(create_app(backend, **kwargs)).__enter__()
        started.append(served)
        return served

    yield start
    for served in reversed(started):
        served.__exit__(None, None, None)
