"""Fixtures of the osmosis-gateway tests: real HTTP on 127.0.0.1 (scripted upstream, real gateway)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for ``import gateway_helpers`` (importlib mode)


@pytest.fixture(autouse=True)
def _quiet_harbor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARBOR_TELEMETRY", "0")


@pytest.fixture
def clean_env() -> dict[str, str]:
    """The environment for CLI subprocesses, without debug switches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env["COLUMNS"] = "200"
    return env
