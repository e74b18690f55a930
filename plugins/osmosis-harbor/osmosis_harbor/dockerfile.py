"""What a task's Dockerfile build needs to know before it runs: its bases, its context, its cache key.

Nothing here runs a build (:mod:`osmosis_harbor.images` does): it reads the Dockerfile's ``FROM``
lines (and ``COPY --from`` of an outside image), resolves a base name the way a registry would
(``debian:13.0-slim``, ``debian:trixie-slim`` and ``debian:13-slim`` are one base), and lists the
build context with ``.dockerignore`` applied, as ``docker build`` and ``buildah build`` send it.

>>> resolve_base("debian:13.0-slim") == resolve_base("debian:trixie-slim") == resolve_base("debian:13-slim")
True
>>> resolve_base("ubuntu:24.04").suite, resolve_base("python:3.12-slim")
('noble', None)
>>> rules = Ignore(["*.md", "!README.md", "secrets/**"])
>>> rules.excludes("notes.md"), rules.excludes("README.md"), rules.excludes("secrets/a/key")
(True, False, True)
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

__all__ = ["KNOWN_BASES", "Base", "DockerfileError", "Ignore", "base_names", "context_digest", "resolve_base"]


class DockerfileError(ValueError):
    """A Dockerfile osmosis cannot read (the message names the file and line)."""


@attrs.frozen
class Base:
    """A base image osmosis makes itself from a distribution's package archive (no registry)."""

    distro: str
    """``debian`` or ``ubuntu``."""
    suite: str
    """The release's code name (``bookworm``, ``noble``)."""

    @property
    def name(self) -> str:
        """The canonical tag it is stored under (``docker.io/library/debian:bookworm``)."""
        return f"docker.io/library/{self.distro}:{self.suite}"


_DEBIAN = {"bookworm": ("12",), "trixie": ("13",)}
_UBUNTU = {"jammy": ("22.04",), "noble": ("24.04",)}
KNOWN_BASES: tuple[str, ...] = (
    "debian:bookworm",
    "debian:bookworm-slim",
    "debian:trixie",
    "debian:trixie-slim",
    "ubuntu:22.04",
    "ubuntu:24.04",
)
"""The bases osmosis makes without a registry (with their aliases: ``debian:12``, ``debian:13.1-slim``,
``ubuntu:noble``, ...). Any other base must come from a reachable registry or from the user."""


def _repository(name: str) -> tuple[str, str]:
    """(repository without ``docker.io/library/``, tag) of an image reference; the tag defaults to ``latest``."""
    ref = name.split("@", 1)[0]
    repo, _, tag = ref.rpartition(":") if ":" in ref.rsplit("/", 1)[-1] else (ref, "", "latest")
    for prefix in ("docker.io/library/", "index.docker.io/library/", "library/", "docker.io/"):
        if repo.startswith(prefix):
            repo = repo[len(prefix) :]
            break
    return repo, tag


def resolve_base(name: str) -> Base | None:
    """The base osmosis can make for an image reference, or None (``python:3.12``, ``ghcr.io/...``)."""
    repo, tag = _repository(name)
    version = tag.removesuffix("-slim")
    if repo == "debian":
        for suite, numbers in _DEBIAN.items():
            if version == suite or version.split(".")[0] in numbers:
                return Base("debian", suite)
        if version in ("latest", "stable"):
            return Base("debian", "trixie")
        return None
    if repo == "ubuntu" and not tag.endswith("-slim"):
        for suite, numbers in _UBUNTU.items():
            if version == suite or version in numbers or any(version.startswith(f"{n}.") for n in numbers):
                return Base("ubuntu", suite)
    return None


_FROM = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(?P<image>\S+)(?:\s+AS\s+(?P<stage>\S+))?\s*$", re.IGNORECASE)
_COPY_FROM = re.compile(r"^(?:COPY|ADD)\s+(?:--\S+\s+)*?--from=(?P<image>\S+)", re.IGNORECASE)
_ARG = re.compile(r"^ARG\s+(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:=(?P<value>\S*))?\s*$", re.IGNORECASE)
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}?")


def _instructions(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, instruction) with continuation lines joined and comments dropped."""
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        yield start, " ".join(pending)
        pending = []
    if pending:
        yield start, " ".join(pending)


def base_names(dockerfile: Path) -> list[tuple[str, int]]:
    """The outside images a Dockerfile builds on, with the line naming each (stages it names itself excluded).

    :raises DockerfileError: no ``FROM``, or a base that depends on a build argument with no default.
    """
    try:
        text = dockerfile.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DockerfileError(f"{dockerfile}: cannot be read: {exc}") from None
    args: dict[str, str] = {}
    stages: set[str] = set()
    found: list[tuple[str, int]] = []

    def expand(value: str, number: int) -> str:
        def one(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if args.get(name):
                return args[name]
            if default is not None:
                return default
            raise DockerfileError(f"{dockerfile}:{number}: the base image uses ${name}, which has no default value")

        return _VARIABLE.sub(one, value)

    seen_from = False
    for number, line in _instructions(text):
        arg = _ARG.match(line)
        if arg and not seen_from:
            args[arg.group("name")] = (arg.group("value") or "").strip("\"'")
            continue
        match = _FROM.match(line)
        if match:
            seen_from = True
            image = expand(match.group("image"), number)
            if image.lower() != "scratch" and image not in stages:
                found.append((image, number))
            if match.group("stage"):
                stages.add(match.group("stage"))
            continue
        copy = _COPY_FROM.match(line)
        if copy:
            image = expand(copy.group("image"), number)
            if image not in stages and not image.isdigit():
                found.append((image, number))
    if not seen_from:
        raise DockerfileError(f"{dockerfile}: has no FROM line")
    return found


class Ignore:
    """``.dockerignore`` rules: the last pattern that matches a path decides; ``!`` keeps it."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self._rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in patterns:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            keep = line.startswith("!")
            pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
            if pattern in ("", "."):
                continue
            self._rules.append((keep, re.compile(_glob_to_regex(pattern))))

    @classmethod
    def of(cls, context: Path) -> Ignore:
        """The rules of ``context/.dockerignore`` (none when there is no such file)."""
        file = context / ".dockerignore"
        return cls(file.read_text(encoding="utf-8").splitlines() if file.is_file() else [])

    def excludes(self, relative: str) -> bool:
        """True when the context path ``relative`` (``a/b.txt``) is left out of the build."""
        excluded = False
        parts = relative.split("/")
        for keep, rule in self._rules:
            # a rule that matches a folder matches everything under it, as Docker's does
            if any(rule.fullmatch("/".join(parts[: i + 1])) for i in range(len(parts))):
                excluded = not keep
        return excluded


def _glob_to_regex(pattern: str) -> str:
    """Go's ``filepath.Match`` with Docker's ``**`` (any number of folders)."""
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            if pattern.startswith("/", i):
                i += 1
                out[-1] = "(?:.*/)?"
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", i)
            if end == -1:
                out.append(re.escape(char))
            else:
                out.append("[" + pattern[i + 1 : end].replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def context_digest(context: Path) -> str:
    """sha256 of the build context as a build sees it: every path ``.dockerignore`` keeps, its kind,
    mode bits and content (a symlink: its target), in a fixed order."""
    ignore = Ignore.of(context)
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(context):
        dirs.sort()
        base = Path(folder)
        for name in sorted(files) + [d for d in dirs if (base / d).is_symlink()]:
            path = base / name
            relative = path.relative_to(context).as_posix()
            if ignore.excludes(relative) and relative not in ("Dockerfile", ".dockerignore"):
                continue
            info = path.lstat()
            digest.update(f"{relative}\0{stat.S_IFMT(info.st_mode)}\0{stat.S_IMODE(info.st_mode):o}\0".encode())
            if stat.S_ISLNK(info.st_mode):
                digest.update(os.readlink(path).encode())
            elif stat.S_ISREG(info.st_mode):
                with path.open("rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
            digest.update(b"\0")
    return digest.hexdigest()
