"""scripts/install's work, run by the interpreter it installs into (standard library only).

Every osmosis distribution this clone holds (osmosis-core at its root, one per plugins/ folder) is
installed from its folder, never from a package index: each one the chosen set needs, named or
depended on (osmosis-harbor brings osmosis-gateway, osmosis-strands osmosis-openai), is handed to
the installer as a direct reference, ``osmosis-gateway @ file:///.../plugins/osmosis-gateway``.
pip and uv take a requirement given that way as the only candidate for its name, so a dependency
``osmosis-gateway>=0.2`` is met by the clone's folder even when an index offers a higher version
of that name, which may be anybody's code (issue 25). The third-party dependencies come from the
installer's index as usual. After the install, every osmosis distribution of the environment that
bears one of the clone's names is checked to have come from the clone's folder.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

__all__ = ["Distribution", "clone_distributions", "main", "needed"]

ROOT = Path(__file__).resolve().parent.parent
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def normalize(name: str) -> str:
    """A project name as indexes compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


class Distribution:
    """One distribution of the clone: its name, folder and pyproject.toml's dependencies."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pyproject = folder / "pyproject.toml"
        with self.pyproject.open("rb") as file:
            project = tomllib.load(file)["project"]
        self.name = normalize(project["name"])
        self.dependencies: list[str] = list(project.get("dependencies", []))
        self.extras: dict[str, list[str]] = {
            normalize(extra): list(requirements)
            for extra, requirements in project.get("optional-dependencies", {}).items()
        }

    def requirements(self, extras: set[str]) -> list[str]:
        """Its dependencies, with those of ``extras``."""
        found = list(self.dependencies)
        for extra in sorted(extras):
            if extra not in self.extras:
                raise SystemExit(f"error: {self.name} has no extra {extra!r} ({self.pyproject})")
            found += self.extras[extra]
        return found


def clone_distributions(root: Path = ROOT) -> dict[str, Distribution]:
    """osmosis-core (the root) and every plugins/*/pyproject.toml, by normalized name."""
    folders = [root, *sorted(p.parent for p in (root / "plugins").glob("*/pyproject.toml"))]
    found: dict[str, Distribution] = {}
    for folder in folders:
        distribution = Distribution(folder)
        found[distribution.name] = distribution
    return found


def _parse(requirement: str) -> tuple[str, set[str]]:
    match = _REQUIREMENT.match(requirement)
    if match is None:
        raise SystemExit(f"error: not a requirement: {requirement!r}")
    extras = {normalize(e) for e in (match.group(2) or "").split(",") if e.strip()}
    return normalize(match.group(1)), extras


def chosen(argument: str, distributions: dict[str, Distribution]) -> tuple[str, set[str]]:
    """The distribution (and extras) an argument names: ``osmosis-harbor``, ``harbor``,
    ``osmosis-core[x]``, or a folder of the clone (``.``, ``plugins/osmosis-harbor``)."""
    path = Path(argument)
    if path.is_dir():
        folder = path.resolve()
        for name, distribution in distributions.items():
            if distribution.folder == folder:
                return name, set()
        raise SystemExit(
            f"error: {argument} is not one of this clone's distributions ({ROOT} and its plugins/ folders); "
            "install other projects with pip"
        )
    if _REQUIREMENT.fullmatch(argument) is None:
        raise SystemExit(
            f"error: {argument!r}: name a distribution (and extras), not a version: the clone's is the one it has"
        )
    name, extras = _parse(argument)
    for candidate in (name, f"osmosis-{name}"):
        if candidate in distributions:
            return candidate, extras
    raise SystemExit(f"error: this clone has no distribution {argument!r}; it has: {', '.join(sorted(distributions))}")


def needed(
    roots: dict[str, set[str]], distributions: dict[str, Distribution]
) -> tuple[dict[str, set[str]], dict[str, str]]:
    """Every clone distribution ``roots`` need, directly or not, with the extras asked of it, and
    for each one not named what first needed it."""
    wanted: dict[str, set[str]] = {}
    why: dict[str, str] = {}
    todo: list[tuple[str, set[str], str | None]] = [(name, extras, None) for name, extras in roots.items()]
    while todo:
        name, extras, needed_by = todo.pop()
        known = wanted.get(name)
        if known is not None and extras <= known:
            continue
        if known is None and needed_by is not None and name not in roots:
            why[name] = needed_by
        wanted[name] = (known or set()) | extras
        for requirement in distributions[name].requirements(wanted[name]):
            dependency, more = _parse(requirement)
            if dependency in distributions:
                todo.append((dependency, more, name))
    return wanted, why


def _installer(choice: str) -> list[str]:
    """The command that installs into this interpreter: uv (much faster) when there is one, else pip."""
    if choice in ("auto", "uv"):
        uv = shutil.which("uv") or next(
            (str(p) for p in (Path(sys.prefix) / "bin" / "uv", ROOT / ".venv" / "bin" / "uv") if p.is_file()), None
        )
        if uv is not None:
            # --no-sources: the clone's folders are named below, as for pip (uv would otherwise make
            # the workspace members the pyproject.tomls' [tool.uv.sources] name editable)
            return [uv, "pip", "install", "--python", sys.executable, "--no-sources"]
        if choice == "uv":
            raise SystemExit("error: --installer uv: no uv on PATH, in this environment or in the clone's .venv")
    return [sys.executable, "-m", "pip", "install"]


def _origin(name: str) -> tuple[str, str | None]:
    """The installed version of ``name`` and the URL it was installed from (None: an index)."""
    distribution = metadata.distribution(name)
    direct = distribution.read_text("direct_url.json")
    return distribution.version, json.loads(direct).get("url") if direct else None


def check(distributions: dict[str, Distribution], installed_now: set[str]) -> list[str]:
    """One line per clone distribution installed here; raises when one of ``installed_now`` did not
    come from the clone, warns for another that did not."""
    lines, wrong = [], []
    for name, distribution in sorted(distributions.items()):
        try:
            version, url = _origin(name)
        except metadata.PackageNotFoundError:
            continue
        expected = distribution.folder.as_uri()
        if url == expected:
            lines.append(f"  {name} {version}  from {distribution.folder}")
            continue
        origin = url or "a package index"
        message = f"{name} {version} here came from {origin}, not from this clone ({distribution.folder})"
        if name in installed_now:
            wrong.append(message)
        else:
            print(f"warning: {message}; `scripts/install {name}` replaces it", file=sys.stderr)
    if wrong:
        raise SystemExit("error: " + "\nerror: ".join(wrong))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/install",
        usage="scripts/install [--python PYTHON] [-e] [--all] [--installer {auto,uv,pip}] [NAME ...] [-- ARG ...]",
        description="Install osmosis-core and plugins from this clone, with the osmosis distributions they "
        "depend on, never from a package index (their third-party dependencies come from your index). Into "
        "the active virtualenv, else the interpreter --python PYTHON names, else the clone's .venv.",
        epilog="Arguments after -- go to the installer (pip install, or uv pip install).",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="distributions (osmosis-strands, or strands) or their folders; default osmosis-core",
    )
    parser.add_argument("--all", action="store_true", help="every distribution of the clone")
    parser.add_argument("-e", "--editable", action="store_true", help="editable installs (for development)")
    parser.add_argument(
        "--installer", choices=("auto", "uv", "pip"), default="auto", help="default: uv when there is one, else pip"
    )
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = parser.parse_args(argv)

    distributions = clone_distributions()
    roots: dict[str, set[str]] = {}
    for argument in (list(distributions) if args.all else args.names) or ["osmosis-core"]:
        name, extras = chosen(argument, distributions)
        roots.setdefault(name, set()).update(extras)
    wanted, why = needed(roots, distributions)

    requirements: list[str] = []
    for name in sorted(wanted):
        folder = distributions[name].folder
        suffix = f"[{','.join(sorted(wanted[name]))}]" if wanted[name] else ""
        requirements += ["-e", f"{folder}{suffix}"] if args.editable else [f"{name}{suffix} @ {folder.as_uri()}"]
    command = _installer(args.installer)
    if command[0] != sys.executable:
        # uv keeps what it built from a folder until its pyproject.toml changes: build each anew,
        # as pip does, so that changed sources are what is installed
        command += [arg for name in sorted(wanted) for arg in ("--reinstall-package", name)]
    named = ", ".join(sorted(roots))
    brought = "".join(f", {name} (for {why[name]})" for name in sorted(why))
    print(f"installing {named}{brought} from {ROOT} into {sys.prefix}", file=sys.stderr)
    status = subprocess.run([*command, *requirements, *extra], check=False).returncode
    if status != 0:
        return status
    lines = check(distributions, set(wanted))
    print("installed from this clone:\n" + "\n".join(lines), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
