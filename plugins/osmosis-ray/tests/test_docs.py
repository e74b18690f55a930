"""The examples in the plugin's docstrings run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "osmosis_ray",
    "osmosis_ray.plugin",
    "osmosis_ray.config",
    "osmosis_ray.cluster",
    "osmosis_ray.dispatch",
    "osmosis_ray.failures",
    "osmosis_ray.shipping",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
