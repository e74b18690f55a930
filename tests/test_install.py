"""Installing from a clone: scripts/install takes every osmosis distribution from the clone, never from
an index (even one offering a higher version of the name), and scripts/demo's second run installs
nothing.

The tests marked ``install`` make virtualenvs and install into them, with third-party dependencies
from the configured index (the uv and pip caches make them quick after the first time); the
``package`` nox session runs them, the core sessions the rest.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
INSTALL = REPO / "scripts" / "install"
DOCUMENTED = ("osmosis-core", "osmosis-strands", "osmosis-harbor")  # issue 25: `pip install` these, from a clone


def _load_install() -> ModuleType:
    spec = importlib.util.spec_from_file_location("osmosis_scripts_install", REPO / "scripts" / "_install.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


install = _load_install()


def _needed(*names: str) -> tuple[dict[str, set[str]], dict[str, str]]:
    distributions = install.clone_distributions()
    roots = dict(install.chosen(name, distributions) for name in names)
    return install.needed(roots, distributions)


def test_each_distribution_brings_the_clones_osmosis_distributions_it_depends_on():
    wanted, why = _needed("osmosis-core", "osmosis-strands", "osmosis-harbor")
    assert sorted(wanted) == [
        "osmosis-core",
        "osmosis-gateway",
        "osmosis-harbor",
        "osmosis-openai",
        "osmosis-strands",
        "osmosis-trainer",
    ]
    assert why == {
        "osmosis-gateway": "osmosis-harbor",
        "osmosis-openai": "osmosis-strands",
        "osmosis-trainer": "osmosis-gateway",
    }
    assert sorted(_needed("openai-agents")[0]) == ["osmosis-core", "osmosis-openai", "osmosis-openai-agents"]
    assert sorted(_needed("plugins/osmosis-gateway")[0]) == ["osmosis-core", "osmosis-gateway", "osmosis-trainer"]
    assert sorted(_needed("trainer")[0]) == ["osmosis-trainer"]  # a trainer's image: no osmosis-core
    # every osmosis name a pyproject.toml depends on is one the clone holds (none can come from an index)
    distributions = install.clone_distributions()
    assert len(distributions) == 1 + len(list((REPO / "plugins").glob("*/pyproject.toml")))
    for distribution in distributions.values():
        for requirement in distribution.dependencies:
            name = install.normalize(re.match(r"[A-Za-z0-9._-]+", requirement).group())  # type: ignore[union-attr]
            assert not name.startswith("osmosis") or name in distributions, (distribution.pyproject, requirement)


def test_a_name_folder_or_version_the_clone_does_not_hold_is_refused_with_what_it_has(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "_install.py"), "osmosis-gatewy"], capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "this clone has no distribution 'osmosis-gatewy'" in proc.stderr
    assert "osmosis-gateway" in proc.stderr
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "_install.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert f"{tmp_path} is not one of this clone's distributions" in proc.stderr
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "_install.py"), "osmosis-gateway>=99"], capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "'osmosis-gateway>=99': name a distribution (and extras), not a version" in proc.stderr


# -- against an index that offers an impostor -------------------------------------------------------------


def _impostor_wheel(folder: Path) -> Path:
    """``osmosis_gateway-99.0-py3-none-any.whl``: a stranger's distribution under the gateway's name."""
    files = {
        "osmosis_gateway/__init__.py": "IMPOSTOR = True\n",
        "osmosis_gateway-99.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: osmosis-gateway\nVersion: 99.0\n",
        "osmosis_gateway-99.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    wheel = folder / "osmosis_gateway-99.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(text.encode())}")
        record.append("osmosis_gateway-99.0.dist-info/RECORD,,")
        archive.writestr("osmosis_gateway-99.0.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.fixture
def impostor_index(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A PEP 503 simple index on 127.0.0.1 offering osmosis-gateway 99.0 (its URL, and the paths asked)."""
    root = tmp_path / "index"
    project = root / "simple" / "osmosis-gateway"
    project.mkdir(parents=True)
    wheel = _impostor_wheel(project)
    page = '<html><body><a href="{0}">{1}</a></body></html>\n'
    (project / "index.html").write_text(page.format(wheel.name, wheel.name))
    (root / "simple" / "index.html").write_text(page.format("osmosis-gateway/", "osmosis-gateway"))
    asked: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            asked.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", asked
    finally:
        server.shutdown()
        server.server_close()


def _uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    assert Path(found).is_file(), "uv is needed (the package session installs it)"
    return found


def _venv(path: Path, *, seed: bool = False) -> Path:
    """A fresh virtualenv of this Python (``seed``: with pip in it); its python."""
    subprocess.run(
        [_uv(), "venv", "-q", *(["--seed"] if seed else []), "--python", sys.executable, str(path)], check=True
    )
    return path / "bin" / "python"


def _installed_gateway(python: Path) -> dict[str, str]:
    probe = (
        "import importlib.metadata as m, json, osmosis_gateway\n"
        "d = m.distribution('osmosis-gateway')\n"
        "print(json.dumps({'version': d.version, 'file': osmosis_gateway.__file__,\n"
        "    'url': json.loads(d.read_text('direct_url.json'))['url'],\n"
        "    'impostor': hasattr(osmosis_gateway, 'IMPOSTOR')}))"
    )
    return json.loads(subprocess.run([str(python), "-c", probe], check=True, capture_output=True, text=True).stdout)


def _clone_gateway_version() -> str:
    text = (REPO / "plugins" / "osmosis-gateway" / "osmosis_gateway" / "__init__.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)  # type: ignore[union-attr]


def _assert_the_clones_gateway(python: Path, venv: Path) -> None:
    gateway = _installed_gateway(python)
    assert not gateway["impostor"], gateway
    assert gateway["version"] == _clone_gateway_version(), gateway
    assert gateway["url"] == (REPO / "plugins" / "osmosis-gateway").as_uri(), gateway
    assert Path(gateway["file"]).is_relative_to(venv), gateway  # installed, not read from the clone


def _environment(**more: str) -> dict[str, str]:
    """This environment without the active virtualenv and the test matrix's settings for uv (its
    constraints, its bytecode compilation), with ``more``."""
    dropped = {"VIRTUAL_ENV", "UV_CONSTRAINT", "UV_COMPILE_BYTECODE"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(more)
    return env


@pytest.mark.install
@pytest.mark.timeout(900)  # a machine whose caches are cold downloads every dependency
def test_the_documented_command_installs_the_clones_gateway_not_a_higher_versioned_impostor(tmp_path, impostor_index):
    """``scripts/install osmosis-core osmosis-strands osmosis-harbor`` (uv) with an index that offers
    osmosis-gateway 99.0: the gateway harbor depends on is the clone's."""
    index, asked = impostor_index
    venv = tmp_path / "venv"
    python = _venv(venv)
    env = _environment(UV_EXTRA_INDEX_URL=index)
    # the index is live and wins for the name: a plain install by name would take the impostor
    offered = subprocess.run(
        [_uv(), "pip", "install", "--dry-run", "--python", str(python), "osmosis-gateway"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert "osmosis-gateway==99.0" in offered.stdout + offered.stderr, offered.stderr
    assert "/simple/osmosis-gateway/" in asked
    proc = subprocess.run(
        [str(INSTALL), "--python", str(python), "--installer", "uv", *DOCUMENTED],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "osmosis-gateway (for osmosis-harbor)" in proc.stderr
    _assert_the_clones_gateway(python, venv)
    listed = subprocess.run(
        [str(python), "-c", "import osmosis_harbor, osmosis_strands, osmosis_openai; print('ok')"],
        capture_output=True,
        text=True,
    )
    assert listed.stdout.strip() == "ok", listed.stderr


@pytest.mark.install
@pytest.mark.timeout(900)  # a machine whose caches are cold downloads every dependency
def test_with_pip_the_gateway_by_name_is_the_clones_not_a_higher_versioned_impostor(tmp_path, impostor_index):
    """The same with the environment's pip (``--installer pip``): a name maps to the clone's folder."""
    index, _ = impostor_index
    venv = tmp_path / "venv"
    python = _venv(venv, seed=True)
    env = _environment(PIP_EXTRA_INDEX_URL=index, PIP_DISABLE_PIP_VERSION_CHECK="1")
    offered = subprocess.run(
        [str(python), "-m", "pip", "install", "--dry-run", "--no-deps", "osmosis-gateway"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert "Would install osmosis-gateway-99.0" in offered.stdout, offered.stdout + offered.stderr
    proc = subprocess.run(
        [str(INSTALL), "--python", str(python), "--installer", "pip", "osmosis-gateway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_the_clones_gateway(python, venv)


# -- scripts/demo a second time ------------------------------------------------------------------------------

SHIM = """import os, sys
with open(os.environ["OSMOSIS_SHIM_LOG"], "a") as log:
    log.write("{name} " + " ".join(sys.argv[1:]) + "\\n")
sys.exit(97)
"""


def _shims(folder: Path) -> Path:
    """``pip`` and ``uv`` that only log their arguments and fail: as modules (``python -m pip``) and as
    commands on PATH."""
    for name in ("pip", "uv"):
        package = folder / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "__main__.py").write_text(SHIM.format(name=name))
        command = folder / "bin" / name
        command.parent.mkdir(exist_ok=True)
        command.write_text(f'#!/bin/sh\necho "{name} $*" >> "$OSMOSIS_SHIM_LOG"\nexit 97\n')
        command.chmod(0o755)
    return folder


@pytest.mark.install
@pytest.mark.timeout(900)  # a machine whose caches are cold downloads every dependency
def test_a_second_demo_installs_nothing_and_a_changed_pyproject_installs_again(tmp_path):
    clone = tmp_path / "clone"
    shutil.copytree(
        REPO,
        clone,
        ignore=shutil.ignore_patterns(".git", ".venv", ".nox", "runs", "__pycache__", "*.egg-info", "build", "dist"),
    )
    env = _environment()
    env.pop("PYTHONPATH", None)
    first = subprocess.run(
        [str(clone / "scripts" / "demo"), "--limit", "2"], env=env, capture_output=True, text=True, timeout=600
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert "mean reward" in first.stdout

    shims = _shims(tmp_path / "shims")
    log = tmp_path / "installs.log"
    log.touch()
    watched = {
        **env,
        "OSMOSIS_SHIM_LOG": str(log),
        "PYTHONPATH": str(shims),
        "PATH": f"{shims / 'bin'}{os.pathsep}{env['PATH']}",
    }
    second = subprocess.run(
        [str(clone / "scripts" / "demo"), "--limit", "2"], env=watched, capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stdout + second.stderr
    assert "mean reward" in second.stdout
    assert log.read_text() == ""  # neither pip nor uv was run

    with (clone / "pyproject.toml").open("a") as pyproject:
        pyproject.write("# changed\n")
    for _ in range(2):  # the failed install leaves no stamp: the next run tries again
        log.write_text("")
        changed = subprocess.run(
            [str(clone / "scripts" / "demo"), "--limit", "2"], env=watched, capture_output=True, text=True, timeout=600
        )
        assert changed.returncode != 0
        assert log.read_text().startswith("uv pip install"), log.read_text()
