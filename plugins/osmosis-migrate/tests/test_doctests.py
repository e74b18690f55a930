"""The examples in the plugin's docstrings run as written."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import osmosis_migrate

MODULES = sorted(m.name for m in pkgutil.iter_modules(osmosis_migrate.__path__, "osmosis_migrate."))


@pytest.mark.parametrize("name", ["osmosis_migrate", *MODULES])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
