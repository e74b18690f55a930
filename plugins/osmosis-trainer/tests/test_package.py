"""The distribution a trainer's image installs: Python 3.10+, no osmosis-core, light to import, its
public names and docstring examples."""

from __future__ import annotations

import doctest
import importlib
import importlib.metadata
import importlib.util
import os
import pkgutil
import subprocess
import sys

import pytest

import osmosis_trainer
import osmosis_trainer.skyrl
import osmosis_trainer.slime
import osmosis_trainer.verl
from osmosis_trainer.skyrl import SKYRL_NAMES
from osmosis_trainer.verl import VERL_NAMES

MODULES = sorted(
    f"osmosis_trainer.{m.name}" for m in pkgutil.iter_modules(osmosis_trainer.__path__) if not m.name.startswith("__")
)


@pytest.mark.skipif(
    os.environ.get("OSMOSIS_TRAINER_ALONE") != "1", reason="only where osmosis-trainer is installed alone (nox trainer)"
)
def test_the_trainer_side_runs_where_osmosis_core_is_not_installed():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("osmosis_core")
    assert sys.version_info >= (3, 10)


def test_no_module_imports_osmosis_core_or_a_plugin():
    """Whether osmosis-core is installed or not: every module of the package imported, none of the
    rollout runtime (or any other osmosis distribution) comes with it."""
    code = (
        "import importlib, sys\n"
        f"for name in {MODULES!r}: importlib.import_module(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith('osmosis')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['osmosis_trainer']"


def test_the_distribution_declares_python_3_10_and_no_osmosis_dependency():
    metadata = importlib.metadata.metadata("osmosis-trainer")
    assert metadata["Requires-Python"] == ">=3.10"
    assert metadata["Version"] == osmosis_trainer.__version__ == "0.2.0"
    requires = importlib.metadata.requires("osmosis-trainer") or []
    assert not [r for r in requires if r.startswith("osmosis")], requires
    assert {"Programming Language :: Python :: 3.10", "Programming Language :: Python :: 3.13"} <= set(
        metadata.get_all("Classifier") or []
    )


def test_importing_the_package_and_the_client_module_stays_light():
    """Nor do the SkyRL, verl and slime adapters' packages import their trainer, torch or Ray (their
    conversions are pure); slime's generate function imports no slime at all."""
    code = (
        "import sys, osmosis_trainer, osmosis_trainer.client, osmosis_trainer.skyrl, osmosis_trainer.verl, "
        "osmosis_trainer.slime; "
        "osmosis_trainer.RolloutRequest; osmosis_trainer.RolloutStatus; osmosis_trainer.repeat_prompts; "
        "print([m for m in ('aiohttp', 'cattrs', 'msgspec', 'stamina', 'skyrl', 'verl', 'slime', 'torch', 'ray') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = (
        "import sys, osmosis_trainer.slime as s, osmosis_trainer.verl as v; s.generate; s.samples_of; "
        "v.agent_loop_fields; print([m for m in ('verl', 'slime', 'torch', 'ray') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:
        return False


def _skyrl_installed() -> bool:
    return _installed("skyrl")


def test_every_public_name_resolves_and_is_listed():
    assert list(osmosis_trainer.__all__) == sorted(osmosis_trainer.__all__)
    assert set(osmosis_trainer.__all__) <= set(dir(osmosis_trainer))
    for name in osmosis_trainer.__all__:
        assert getattr(osmosis_trainer, name) is not None, name
    for module in MODULES:
        imported = importlib.import_module(module)
        for name in getattr(imported, "__all__", ()):
            if module == "osmosis_trainer.skyrl" and name in SKYRL_NAMES and not _skyrl_installed():
                continue  # the next test
            if module == "osmosis_trainer.verl" and name in VERL_NAMES and not _installed("verl"):
                continue  # the test after
            assert hasattr(imported, name), (module, name)


@pytest.mark.skipif(_skyrl_installed(), reason="SkyRL is installed here")
@pytest.mark.parametrize("name", sorted(SKYRL_NAMES))
def test_the_skyrl_adapter_without_skyrl_says_what_to_install(name):
    """``import osmosis_trainer.skyrl`` needs nothing more (its conversions are pure); the names that
    subclass SkyRL's classes say they need SkyRL, by name."""
    with pytest.raises(ModuleNotFoundError, match=f"osmosis_trainer.skyrl.{name} needs SkyRL installed"):
        getattr(osmosis_trainer.skyrl, name)
    assert osmosis_trainer.skyrl.generator_output is not None


@pytest.mark.skipif(_installed("verl"), reason="verl is installed here")
@pytest.mark.parametrize("name", sorted(VERL_NAMES))
def test_the_verl_adapter_without_verl_says_what_to_install(name):
    with pytest.raises(ModuleNotFoundError, match=f"osmosis_trainer.verl.{name} needs verl installed"):
        getattr(osmosis_trainer.verl, name)
    assert osmosis_trainer.verl.agent_loop_fields is not None


@pytest.mark.together  # osmosis-core's checker (its testing helpers), with osmosis-core installed beside
def test_the_public_names_type_checkers_read_are_the_ones_the_package_hands_out():
    from osmosis_core.testing import check_lazy_exports

    check_lazy_exports("osmosis_trainer")


ADAPTER_CONVERSIONS = ("osmosis_trainer.skyrl.convert", "osmosis_trainer.verl.convert", "osmosis_trainer.slime.convert")


@pytest.mark.parametrize("module", ["osmosis_trainer", *MODULES, *ADAPTER_CONVERSIONS])
def test_the_docstring_examples_run(module):
    failed, tried = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert not failed, module
    examples = (
        "osmosis_trainer",
        "osmosis_trainer.rows",
        "osmosis_trainer.groups",
        "osmosis_trainer.trace",
        "osmosis_trainer.sglang",
        "osmosis_trainer.bridge",
    )
    if module in (*examples, *ADAPTER_CONVERSIONS):
        assert tried, module
