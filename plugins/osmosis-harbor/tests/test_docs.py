"""The examples in the plugin's docstrings run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "osmosis_harbor",
    "osmosis_harbor.config",
    "osmosis_harbor.tasks",
    "osmosis_harbor.safetree",
    "osmosis_harbor.outcomes",
    "osmosis_harbor.wire",
    "osmosis_harbor.grading",
    "osmosis_harbor.limits",
    "osmosis_harbor.bwrap",
    "osmosis_harbor.relay",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
