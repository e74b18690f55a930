"""The public surfaces: ``osmosis_core`` (rollout authors), ``osmosis_core.plugin`` (plugin
authors), ``osmosis_core.frontend`` (commands that run or read runs) and ``osmosis_core.testing``;
everything else is private to the core, and import-linter fails a plugin that imports it."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import osmosis_core

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = {"osmosis_core.plugin", "osmosis_core.frontend", "osmosis_core.testing"}
PLUGIN_CONTRACT = "Plugins use the public API only"


def _lazy_names(module_name: str) -> tuple[dict[str, str], dict[str, str]]:
    """(name -> module) from the ``if TYPE_CHECKING:`` imports, and from the ``lazy_loader.attach`` table."""
    module = importlib.import_module(module_name)
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    typed: dict[str, str] = {}
    lazy: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                assert imp.module
                for alias in imp.names:
                    if alias.asname == alias.name:  # `import X as X`: a re-export (else for annotations only)
                        typed[alias.name] = imp.module
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and "attach" in ast.unparse(node.value.func)
        ):
            package = (
                ast.literal_eval(node.value.args[0]) if isinstance(node.value.args[0], ast.Constant) else module_name
            )
            table = ast.literal_eval(next(k.value for k in node.value.keywords if k.arg == "submod_attrs"))
            lazy.update({name: f"{package}.{sub}" for sub, names in table.items() for name in names})
    return typed, lazy


@pytest.mark.parametrize(
    ("module_name", "own"),
    [
        ("osmosis_core", set()),
        ("osmosis_core.plugin", set()),
        ("osmosis_core.frontend", {"LoadedRun", "RunFiles", "load_run"}),
    ],
)
def test_what_type_checkers_read_is_what_the_lazy_loader_hands_out(module_name, own):
    typed, lazy = _lazy_names(module_name)
    assert typed
    assert typed == lazy
    module = importlib.import_module(module_name)
    assert module.__all__ == sorted({*typed, *own})
    assert set(module.__all__) <= set(dir(module))
    for name, home in typed.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), (module_name, name)


def test_the_plugin_api_exports_no_engine_machinery():
    import osmosis_core.plugin

    for name in ("build_backend", "ResultWriter", "RunLock", "folder_progress", "config_options", "resolve_config"):
        assert name not in osmosis_core.plugin.__all__


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
