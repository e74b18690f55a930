"""The examples in the docstrings run (doctest), so what a user copies works."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [  # the modules whose docstrings hold examples (contains, exact, regex, weighted show none)
    "base",
    "cas_pool",
    "extract",
    "json_match",
    "judge",
    "math_equiv",
    "normalize",
    "numeric",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"osmosis_graders.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0  # an empty case would pass with nothing run
    assert result.failed == 0
