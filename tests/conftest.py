"""Shared fixtures: the example rollout importable as ``rollouts_multiply_plain``, workspaces."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "rollouts" / "multiply-plain"

# the example's main.py under a unique module name, for tests that run its classes directly
_spec = importlib.util.spec_from_file_location("rollouts_multiply_plain", EXAMPLE / "main.py")
assert _spec is not None
assert _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
sys.modules["rollouts_multiply_plain"] = _module
_spec.loader.exec_module(_module)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A copy of the example workspace (rollouts/multiply-plain, configs/eval) in a temp folder."""
    shutil.copytree(EXAMPLE, tmp_path / "rollouts" / "multiply-plain", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "eval" / "multiply-plain.toml", tmp_path / "configs" / "eval")
    return tmp_path


@pytest.fixture
def osmosis_exe() -> str:
    """The ``osmosis`` console script of this environment."""
    exe = Path(sys.executable).parent / "osmosis"
    assert exe.exists(), f"osmosis is not installed next to {sys.executable}"
    return str(exe)


@pytest.fixture
def clean_env() -> dict[str, str]:
    """The environment for CLI subprocesses, without debug switches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env["COLUMNS"] = "200"
    return env
