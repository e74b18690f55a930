"""The test matrix. Run it with `scripts/test` (which finds Python >= 3.12 and installs nox and uv).

Sessions:
  tests-3.12, tests-3.13   the core alone, on every supported Python installed here
  package                   the built wheel installed alone: template apply, run, validate
  lint                      ruff (lint + format check)
  types                     mypy --strict on osmosis_core
  plugin-<name>             the core plus one plugin from plugins/, that plugin's tests
  bench                     the benchmarks in bench/ (not run by default)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import nox

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = False
nox.options.reuse_venv = "yes"

ROOT = Path(__file__).parent
SUPPORTED = ("3.12", "3.13")


def _installed(version: str) -> bool:
    exe = shutil.which(f"python{version}")
    if exe is None:
        return False
    return subprocess.run([exe, "-c", "pass"], capture_output=True).returncode == 0


PYTHONS = [v for v in SUPPORTED if _installed(v)] or [SUPPORTED[0]]
PLUGINS = sorted(p.name for p in (ROOT / "plugins").glob("osmosis-*") if (p / "pyproject.toml").is_file())
TEST_DEPS = ["pytest>=8", "pytest-timeout>=2.3"]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The core's tests on its own (no plugin installed)."""
    session.install("-e", ".", *TEST_DEPS)
    session.run("pytest", "tests", *session.posargs)


@nox.session(python=PYTHONS[0])
def package(session: nox.Session) -> None:
    """The built wheel, installed alone as a user would: apply the template, run it, check the guides."""
    tmp = Path(session.create_tmp())
    dist = tmp / "dist"
    session.install("build>=1.2", "uv")
    session.run("python", "-m", "build", "--wheel", "--installer", "uv", "--outdir", str(dist), str(ROOT))
    [wheel] = sorted(dist.glob("osmosis_core-*.whl"))[-1:]
    session.install(str(wheel))
    workspace = tmp / "workspace"
    shutil.rmtree(workspace, ignore_errors=True)
    session.run("osmosis", "template", "apply", "multiply-plain", str(workspace))
    session.chdir(workspace)
    session.run("osmosis", "run", "configs/eval/multiply-plain.toml", "--stub-policy", "--limit", "5")
    session.run("osmosis", "validate", "configs/training/multiply-plain.toml")


@nox.session(python=PYTHONS[0])
def lint(session: nox.Session) -> None:
    """ruff: lint rules and formatting."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHONS[0])
def types(session: nox.Session) -> None:
    """mypy --strict on the core."""
    session.install("-e", ".", "mypy>=1.11", *TEST_DEPS)
    session.run("mypy", "osmosis_core")


@nox.session(python=PYTHONS[0])
@nox.parametrize("plugin", PLUGINS or [None])
def plugin(session: nox.Session, plugin: str | None) -> None:
    """The core with one plugin installed alone: discovery, then that plugin's tests."""
    if plugin is None:
        session.skip("no plugins in plugins/ yet")
    session.install("-e", ".", "-e", f"plugins/{plugin}", *TEST_DEPS)
    _pip_check(session)
    session.run("osmosis", "plugins", "--json")
    session.run("pytest", f"plugins/{plugin}/tests", *session.posargs)


@nox.session(python=PYTHONS[0])
def plugins_all(session: nox.Session) -> None:
    """Every plugin installed together: one resolvable environment, no name clashes, all tests."""
    if not PLUGINS:
        session.skip("no plugins in plugins/ yet")
    session.install("-e", ".", *[arg for p in PLUGINS for arg in ("-e", f"plugins/{p}")], *TEST_DEPS)
    _pip_check(session)
    session.run("python", "-c", _NO_CONFLICTS)
    session.run("pytest", *(f"plugins/{p}/tests" for p in PLUGINS), *session.posargs)


def _pip_check(session: nox.Session) -> None:
    """The installed set is consistent (uv's equivalent of pip check)."""
    session.run("uv", "pip", "check", "--python", str(Path(session.bin) / "python"), external=True)


_NO_CONFLICTS = """
from osmosis_core.plugins.registry import PluginRegistry
registry = PluginRegistry()
failed = [p for p in registry.plugins if p.status != "active"]
assert not failed, failed
assert not registry.conflicts(), registry.conflicts()
print("plugins:", ", ".join(f"{p.name} ({p.provider})" for p in registry.plugins))
"""


@nox.session(python=PYTHONS[0], default=False)
def bench(session: nox.Session) -> None:
    """The benchmarks, with every plugin installed: overhead and throughput ratios (printed, not asserted)."""
    session.install("-e", ".", *[arg for p in PLUGINS for arg in ("-e", f"plugins/{p}")])
    for script in sorted((ROOT / "bench").glob("*.py")):
        session.run("python", str(script), *session.posargs)
