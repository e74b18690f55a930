"""Every ``>>>`` example in the core runs, as written (each module that has one, found by reading
the sources: a new module's examples run without being listed here)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "osmosis_core"


def _modules_with_examples() -> list[str]:
    found = []
    for path in sorted(CORE.rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(CORE.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = _modules_with_examples()


def test_the_core_has_examples_to_run():
    assert len(MODULES) >= 15, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_of_a_core_module_run(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert failed == 0, f"{name}: {failed} of {attempted} examples failed (output above)"
