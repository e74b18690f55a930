"""The repository's example rollouts: their docstring examples run and hold."""

from __future__ import annotations

import doctest
import importlib.util
from pathlib import Path

import pytest

ROLLOUTS = Path(__file__).resolve().parents[1] / "rollouts"
MODULES = sorted(p for p in ROLLOUTS.glob("*/*.py") if ">>> " in p.read_text())


@pytest.mark.parametrize("path", MODULES, ids=[p.parent.name for p in MODULES])
def test_the_docstring_examples_of_an_example_rollout_hold(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"rollout_{path.parent.name.replace('-', '_')}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    failed, attempted = doctest.testmod(module, report=True)
    assert attempted > 0, f"{path}: no docstring example ran"
    assert failed == 0, f"{path}: {failed} docstring example(s) failed (printed above)"
