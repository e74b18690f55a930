"""The public surfaces: ``osmosis_core`` (rollout authors), ``osmosis_core.plugin`` (plugin
authors), ``osmosis_core.frontend`` (commands that run or read runs) and ``osmosis_core.testing``;
everything else is private to the core, and import-linter fails a plugin that imports it."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import osmosis_core
from osmosis_core.testing import check_lazy_exports

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {"osmosis_core.plugin", "osmosis_core.frontend", "osmosis_core.testing"}
PLUGIN_CONTRACT = "Plugins use the public API only"


@pytest.mark.parametrize(
    ("module_name", "own"),
    [
        ("osmosis_core", set()),
        ("osmosis_core.plugin", set()),
        ("osmosis_core.frontend", {"LoadedRun", "RunFiles", "load_run"}),
        ("osmosis_core.testing", set()),
    ],
)
def test_what_type_checkers_read_is_what_the_lazy_loader_hands_out(module_name, own):
    """Each plugin checks its own package the same way (its tests run with only the core installed)."""
    check_lazy_exports(module_name, own=own)


def test_the_check_fails_a_name_missing_from_either_list(tmp_path, monkeypatch):
    package = tmp_path / "lazy_pkg"
    package.mkdir()
    (package / "mod.py").write_text("A = 1\nB = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    init = """\
from typing import TYPE_CHECKING

import lazy_loader

if TYPE_CHECKING:
    from lazy_pkg.mod import A as A
{extra}
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={{"mod": [{names}]}})
"""
    for extra, names, message in [
        ("    from lazy_pkg.mod import B as B", '"A"', "only under TYPE_CHECKING: ['B']"),
        ("", '"A", "B"', "only in lazy_loader.attach: ['B']"),
    ]:
        (package / "__init__.py").write_text(init.format(extra=extra, names=names))
        for name in [m for m in sys.modules if m.startswith("lazy_pkg")]:
            monkeypatch.delitem(sys.modules, name)
        importlib.invalidate_caches()
        with pytest.raises(AssertionError, match=re.escape(message)):
            check_lazy_exports("lazy_pkg")
    (package / "__init__.py").write_text(init.format(extra="", names='"A"'))
    monkeypatch.delitem(sys.modules, "lazy_pkg")
    check_lazy_exports("lazy_pkg")


def test_the_plugin_api_exports_no_engine_machinery():
    import osmosis_core.plugin

    for name in ("build_backend", "ResultWriter", "RunLock", "folder_progress", "config_options", "resolve_config"):
        assert name not in osmosis_core.plugin.__all__


def test_a_name_used_through_plugin_or_frontend_stays_off_the_author_surface():
    """Using ``osmosis_core.plugin.load_rollout`` (or a frontend name) does not put it on
    ``osmosis_core``: the rollout author's surface is the same whatever ran before."""
    code = (
        "import osmosis_core, osmosis_core.plugin as p, osmosis_core.frontend as f\n"
        "p.load_rollout, p.get_registry, f.read_dataset, f.make_console\n"
        "names = ('load_rollout', 'get_registry', 'read_dataset', 'make_console')\n"
        "leaked = [n for n in names if n in vars(osmosis_core)]\n"
        "assert not leaked, leaked\n"
        "assert 'load_rollout' in vars(p)  # cached where it was asked for\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def _contracts() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]


def test_every_private_module_of_the_core_is_forbidden_to_plugins():
    contract = next(c for c in _contracts()["contracts"] if c["name"].startswith(PLUGIN_CONTRACT))
    modules = {f"osmosis_core.{m.name}" for m in pkgutil.iter_modules(osmosis_core.__path__)}
    assert set(contract["forbidden_modules"]) == modules - PUBLIC


def _lint(tmp_path: Path, plugin_source: str) -> subprocess.CompletedProcess[str]:
    contract = next(c for c in _contracts()["contracts"] if c["name"].startswith(PLUGIN_CONTRACT))
    (tmp_path / "osmosis_fake").mkdir(exist_ok=True)
    (tmp_path / "osmosis_fake" / "__init__.py").write_text(textwrap.dedent(plugin_source), encoding="utf-8")
    forbidden = ", ".join(f'"{m}"' for m in contract["forbidden_modules"])
    config = tmp_path / "contracts.toml"
    config.write_text(
        textwrap.dedent(f"""\
        [tool.importlinter]
        root_packages = ["osmosis_core", "osmosis_fake"]
        exclude_type_checking_imports = true

        [[tool.importlinter.contracts]]
        name = "{contract["name"]}"
        type = "forbidden"
        source_modules = ["osmosis_fake"]
        forbidden_modules = [{forbidden}]
        allow_indirect_imports = true
        """),
        encoding="utf-8",
    )
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(lint), "--config", str(config), "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


def test_a_plugin_that_imports_the_engine_fails_the_lint(tmp_path):
    broken = _lint(tmp_path, "from osmosis_core._engine.runner import build_backend\n")
    assert broken.returncode != 0, broken.stdout
    assert "osmosis_fake is not allowed to import osmosis_core._engine" in broken.stdout
    kept = _lint(tmp_path, "from osmosis_core.plugin import hookimpl\nfrom osmosis_core.frontend import RunFiles\n")
    assert kept.returncode == 0, kept.stdout + kept.stderr
