"""One version source per distribution, and pins between them that agree.

Each distribution of this repository (osmosis-core and every ``plugins/osmosis-*``) writes its
version once, as ``__version__`` in its package's ``__init__.py``; hatch reads it from there
(``[tool.hatch.version]``, ``dynamic = ["version"]``). Every requirement on a first-party
distribution (a plugin's on osmosis-core, an agent plugin's on osmosis-openai, a starter
template's) is the same ``>=MAJOR.MINOR`` of that distribution's current version.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = [ROOT, *sorted(p for p in (ROOT / "plugins").glob("osmosis-*") if (p / "pyproject.toml").is_file())]
VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)


def _pyproject(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))


def _written_version(folder: Path) -> tuple[str, str]:
    """(distribution name, the version its ``__init__.py`` writes), after checking hatch reads it there."""
    project = _pyproject(folder)
    name = project["project"]["name"]
    where = f"{folder.relative_to(ROOT) / 'pyproject.toml'}"
    assert "version" not in project["project"], f"{where}: a static version; write it in __version__ only"
    assert "version" in project["project"].get("dynamic", []), f'{where}: dynamic = ["version"] is missing'
    init = f"{name.replace('-', '_')}/__init__.py"
    assert project["tool"]["hatch"]["version"] == {"path": init}, f"{where}: [tool.hatch.version] path should be {init}"
    written = VERSION_LINE.findall((folder / init).read_text(encoding="utf-8"))
    assert len(written) == 1, f'{folder.relative_to(ROOT) / init}: one `__version__ = "..."` line expected'
    return name, str(Version(written[0]))


VERSIONS = dict(_written_version(folder) for folder in DISTRIBUTIONS)


@pytest.mark.parametrize("folder", DISTRIBUTIONS, ids=lambda p: p.name if p != ROOT else "osmosis-core")
def test_each_distribution_writes_its_version_once(folder):
    name, version = _written_version(folder)
    assert VERSIONS[name] == version


def _requirement_files() -> list[Path]:
    """Every pyproject.toml that may require a first-party distribution: the distributions', the
    example rollouts' and the starter templates' (not the osmosis-ai workspaces migrate reads)."""
    found = [folder / "pyproject.toml" for folder in DISTRIBUTIONS]
    found += sorted((ROOT / "rollouts").glob("*/pyproject.toml"))
    found += sorted((ROOT / "plugins").glob("osmosis-*/osmosis_*/template/**/pyproject.toml"))
    return found


def test_every_pin_on_a_first_party_distribution_is_its_compatible_series():
    """A distribution pins ``~=0.2.0``: this minor series (under 0.x a minor release may break a
    plugin), as sqlfluff pins its in-repo plugins. A rollout project (the examples, the templates)
    states a floor, ``>=0.2``, as ``osmosis migrate`` writes it: its author moves it."""
    distributions = {folder / "pyproject.toml" for folder in DISTRIBUTIONS}
    pins = []
    for path in _requirement_files():
        for line in tomllib.loads(path.read_text(encoding="utf-8")).get("project", {}).get("dependencies", []):
            requirement = Requirement(line)
            if requirement.name in VERSIONS:
                pins.append((path.relative_to(ROOT), requirement))
    assert {r.name for _, r in pins} >= {"osmosis-core", "osmosis-openai"}, pins  # the check sees the pins
    for where, requirement in pins:
        current = Version(VERSIONS[requirement.name])
        plugin = ROOT / where in distributions
        expected = f"~={current.major}.{current.minor}.0" if plugin else f">={current.major}.{current.minor}"
        assert str(requirement.specifier) == expected, f"{where}: {requirement} (expected {requirement.name}{expected})"
        assert current in requirement.specifier
        assert (Version(f"{current.major}.{current.minor + 1}.0") in requirement.specifier) is not plugin


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_an_installed_distribution_reports_the_version_its_package_writes(name):
    """``osmosis_x.__version__`` is what the installed metadata says (an editable install made
    before the version changed is caught here: reinstall it)."""
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed here")
    package = importlib.import_module(name.replace("-", "_"))
    assert package.__version__ == installed == VERSIONS[name]


CONSTRAINTS = ROOT / "test-constraints.txt"


def test_the_test_tools_are_pinned_once_in_the_constraints_file():
    """The dependency groups (core and plugins) name their tools; test-constraints.txt, which the
    noxfile passes to every install, holds each one's version, once."""
    pinned: dict[str, str] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            assert requirement.name not in pinned, f"{CONSTRAINTS.name}: {requirement.name} pinned twice"
            assert requirement.specifier, f"{CONSTRAINTS.name}: {line} has no version"
            pinned[requirement.name] = str(requirement.specifier)
    named = set()
    for folder in DISTRIBUTIONS:
        where = folder.relative_to(ROOT) / "pyproject.toml"
        for group, entries in _pyproject(folder).get("dependency-groups", {}).items():
            for entry in entries:
                if isinstance(entry, dict):  # {include-group = "..."}
                    continue
                requirement = Requirement(entry)
                assert not requirement.specifier, (
                    f"{where} [{group}]: {entry}: its version belongs in {CONSTRAINTS.name}"
                )
                assert requirement.name in pinned, f"{where} [{group}]: {requirement.name} is not in {CONSTRAINTS.name}"
                named.add(requirement.name)
    assert {"pytest", "pytest-timeout", "hypothesis", "mypy", "ruff"} <= named
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert 'os.environ["UV_CONSTRAINT"] = str(ROOT / "test-constraints.txt")' in noxfile
