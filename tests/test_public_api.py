"""The public surfaces: ``osmosis_core`` (rollout authors), ``osmosis_core.plugin`` (plugin
authors: the seam and the hooks), ``osmosis_core.http``, ``.wire``, ``.sampling`` and ``.templates``
(each a plugin's tools under a name of its own), ``osmosis_core.frontend`` (commands that run or
read runs) and ``osmosis_core.testing``; everything else is private to the core, and import-linter
fails a plugin that imports it."""

from __future__ import annotations

import importlib
import inspect
import itertools
import pkgutil
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import osmosis_core
from osmosis_core.deprecation import PUBLIC_MODULES
from osmosis_core.testing import check_lazy_exports

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {*PUBLIC_MODULES, "osmosis_core.testing"} - {"osmosis_core"}
"""The modules a plugin may import besides ``osmosis_core``: the homes a moved name is sent to, and the test tools."""
FACADES = {"osmosis_core.plugin", "osmosis_core.frontend", "osmosis_core.testing"}
"""The modules that hand out engine names (lazily): the only ones but the engine and the CLI that may import them."""
PLUGIN_CONTRACT = "Plugins use the public API only"


@pytest.mark.parametrize(
    ("module_name", "own"),
    [
        ("osmosis_core", set()),
        ("osmosis_core.plugin", set()),
        ("osmosis_core.http", set()),
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
    """Using ``osmosis_core.plugin.local_backend`` (or a frontend name) does not put it on
    ``osmosis_core``: the rollout author's surface is the same whatever ran before."""
    code = (
        "import osmosis_core, osmosis_core.plugin as p, osmosis_core.frontend as f\n"
        "p.local_backend, p.get_registry, f.read_dataset, f.load_rollout\n"
        "names = ('local_backend', 'get_registry', 'read_dataset', 'load_rollout')\n"
        "leaked = [n for n in names if n in vars(osmosis_core)]\n"
        "assert not leaked, leaked\n"
        "assert 'local_backend' in vars(p)  # cached where it was asked for\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def _contracts() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]


def test_every_private_module_of_the_core_is_forbidden_to_plugins():
    contract = next(c for c in _contracts()["contracts"] if c["name"].startswith(PLUGIN_CONTRACT))
    modules = {f"osmosis_core.{m.name}" for m in pkgutil.iter_modules(osmosis_core.__path__)}
    assert set(contract["forbidden_modules"]) == modules - PUBLIC


def test_every_module_of_the_core_but_the_engine_the_cli_and_the_facades_is_kept_from_importing_the_engine():
    contract = next(c for c in _contracts()["contracts"] if c["name"].startswith("The engine imports the public"))
    modules = {f"osmosis_core.{m.name}" for m in pkgutil.iter_modules(osmosis_core.__path__)}
    # 0.1's module names, each forwarding to its new home
    forwarding = {m for m in modules if "__getattr__ = moved_module(" in _source(m)}
    engine = {"osmosis_core._engine", "osmosis_core.cli", "osmosis_core._reexport", "osmosis_core.plugins"}
    assert set(contract["source_modules"]) == modules - engine - FACADES - forwarding
    assert contract["forbidden_modules"] == ["osmosis_core._engine", "osmosis_core.cli"]


def _source(module: str) -> str:
    path = ROOT / (module.replace(".", "/") + ".py")
    return path.read_text(encoding="utf-8") if path.exists() else ""


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


PLUGIN_SURFACES = [
    "osmosis_core.plugin",
    "osmosis_core.http",
    "osmosis_core.wire",
    "osmosis_core.sampling",
    "osmosis_core.templates",
]
USED_OUTSIDE = {
    "osmosis_core.plugin.local_backend": "the factory LocalBackend.from_setup's deprecation tells plugins to register",
    "osmosis_core.http.client_session": "the loop's aiohttp session, for a plugin needing more than requests",
    "osmosis_core.sampling.DISTRIBUTION_PARAMS": "on osmosis_core.plugin in 0.2's development builds",
    "osmosis_core.templates.GUIDES_ROOT": "the guides a template plugin layers under its files (as multiply_template)",
}
"""Public names no plugin or example of this repository uses, each kept for the reason given."""


def _documented(module: object, name: str) -> bool:
    """Its own docstring (a class, a function), or an attribute docstring or a mention in its module's docstring."""
    value = getattr(module, name)
    own = value.__dict__.get("__doc__") if isinstance(value, type) else getattr(value, "__doc__", None)
    if (inspect.isfunction(value) or isinstance(value, type)) and own:
        return True
    if re.search(rf"\b{re.escape(name)}\b", module.__doc__ or ""):  # type: ignore[attr-defined]
        return True
    # a constant: an attribute docstring right under its assignment (which may span lines)
    for path in (ROOT / "osmosis_core").rglob("*.py"):
        lines = path.read_text(encoding="utf-8").splitlines()
        for at, line in enumerate(lines):
            if re.match(rf"{re.escape(name)}\b[^=]*=", line):
                after = next((x for x in lines[at + 1 :] if x and not x[0].isspace() and x[0] not in ")]}"), "")
                if after.startswith('"""'):
                    return True
    return False


@pytest.mark.parametrize("surface", PLUGIN_SURFACES)
def test_every_name_a_plugin_author_is_offered_is_documented_and_used_by_a_plugin_or_an_example(surface):
    """As datasette checks its hooks: a name nobody uses, or nobody explains, is not offered."""
    module = importlib.import_module(surface)
    files = subprocess.run(
        ["git", "ls-files", "plugins", "examples", "rollouts"], capture_output=True, text=True, cwd=ROOT
    )
    paths = [ROOT / f for f in files.stdout.split() if f.endswith(".py") and "/tests/" not in f]
    paths.append(ROOT / "osmosis_core" / "testing" / "example_backend.py")
    text = "\n".join(path.read_text(encoding="utf-8") for path in paths)
    undocumented = [name for name in module.__all__ if not _documented(module, name)]
    unused = [
        name
        for name in module.__all__
        if f"{surface}.{name}" not in USED_OUTSIDE and not re.search(rf"\b{re.escape(name)}\b", text)
    ]
    stale = [
        key for key in USED_OUTSIDE if key.startswith(f"{surface}.") and key.rpartition(".")[2] not in module.__all__
    ]
    assert not stale, f"USED_OUTSIDE names what {surface} no longer offers: {stale}"
    assert not undocumented, f"{surface}: {undocumented} have no docstring"
    assert not unused, f"{surface}: no plugin or example uses {unused}"
    assert len(set(module.__all__)) == len(module.__all__)
    if surface == "osmosis_core.plugin":
        assert len(module.__all__) <= 30, module.__all__


def test_a_name_is_on_one_surface_only():
    """A rollout author's names are on ``osmosis_core``, a plugin author's on ``osmosis_core.plugin``
    (and the modules it names): none is offered twice."""
    surfaces = {s: set(importlib.import_module(s).__all__) for s in ["osmosis_core", *PLUGIN_SURFACES]}
    for one, other in itertools.combinations(surfaces, 2):
        if {one, other} == {"osmosis_core.plugin", "osmosis_core.templates"}:
            assert surfaces[one] & surfaces[other] == {
                "GraderSpec",
                "TemplateSpec",
            }  # the hooks' records, documented once
            continue
        assert not surfaces[one] & surfaces[other], (one, other, surfaces[one] & surfaces[other])
