"""The examples in the docstrings run (doctest), so what a user copies works."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "base",
    "cas_pool",
    "contains",
    "exact",
    "extract",
    "json_match",
    "judge",
    "math_equiv",
    "normalize",
    "numeric",
    "regex",
    "weighted",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"osmosis_graders.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
