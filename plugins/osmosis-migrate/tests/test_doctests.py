"""The examples in the plugin's docstrings run as written."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import osmosis_migrate

MODULES = sorted(m.name for m in pkgutil.walk_packages(osmosis_migrate.__path__, "osmosis_migrate."))


@pytest.mark.parametrize("name", ["osmosis_migrate", *MODULES])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_package_and_its_entry_module_load_no_migration_machinery():
    """`osmosis --help` loads every plugin's entry module (and so its package): tomlkit and libcst
    load only when a migration runs."""
    import subprocess
    import sys

    code = (
        "import sys, osmosis_migrate, osmosis_migrate.plugin\n"
        "print([m for m in ('tomlkit', 'libcst', 'osmosis_migrate.workspace') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_public_names_type_checkers_read_are_the_ones_the_package_hands_out():
    from osmosis_core.testing import check_lazy_exports

    check_lazy_exports("osmosis_migrate")
