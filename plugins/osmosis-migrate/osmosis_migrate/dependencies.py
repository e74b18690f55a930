"""Rewriting a project's dependency on osmosis-ai into osmosis-core and the plugins its extras meant.

``pyproject.toml`` files are edited with tomlkit, so comments and formatting survive;
``requirements*.txt`` files line by line.

>>> text = '[project]\\ndependencies = ["osmosis-ai[server,strands]>=0.3.1,<0.4"]\\n'
>>> new, notes, unmapped = migrate_pyproject("p/pyproject.toml", text)
>>> print(new, end="")
[project]
dependencies = ["osmosis-core>=0.2", "osmosis-server>=0.2", "osmosis-strands>=0.2"]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from osmosis_migrate.names import CORE_DISTRIBUTION, EXTRA_DISTRIBUTIONS, EXTRA_NOT_OFFERED
from osmosis_migrate.records import Finding

__all__ = ["OSMOSIS_FLOOR", "migrate_pyproject", "migrate_requirements", "replacement_requirements"]

OSMOSIS_FLOOR = ">=0.2"
"""The version floor written for osmosis-core and its plugins (the one the starter templates use)."""

_ORDER = (
    CORE_DISTRIBUTION,
    "osmosis-server",
    "osmosis-strands",
    "osmosis-openai-agents",
    "osmosis-harbor",
    "osmosis-graders",
)
_REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[(?P<extras>[^\]]*)\])?(?P<rest>[^;#]*)(?P<marker>;[^#]*)?"
)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def replacement_requirements(
    requirement: str, needed: Iterable[str], where: str, line: int | None
) -> tuple[list[str], list[Finding], list[Finding]] | None:
    """The requirements that replace one ``osmosis-ai[...]`` requirement (None when it is not one).

    ``needed`` are distributions the project's migrated imports use (added even when no extra
    asked for them). Returns ``(requirements, notes, unmapped)``.
    """
    match = _REQUIREMENT.match(requirement)
    if match is None or _normal(match["name"]) != "osmosis-ai":
        return None
    extras = [e.strip() for e in (match["extras"] or "").split(",") if e.strip()]
    marker = (match["marker"] or "").strip()
    distributions = {CORE_DISTRIBUTION, *needed}
    unmapped: list[Finding] = []
    for extra in extras:
        key = _normal(extra)
        distributions.update(EXTRA_DISTRIBUTIONS.get(key, EXTRA_DISTRIBUTIONS.get(extra, ())))
        if key in EXTRA_NOT_OFFERED:
            unmapped.append(Finding(where, line, f"osmosis-ai[{extra}]", EXTRA_NOT_OFFERED[key]))
        elif key not in EXTRA_DISTRIBUTIONS:
            unmapped.append(Finding(where, line, f"osmosis-ai[{extra}]", "an extra osmosis has no counterpart for"))
    ordered = [d for d in _ORDER if d in distributions] + sorted(distributions - set(_ORDER))
    suffix = f"; {marker[1:].strip()}" if marker else ""
    out = [f"{d}{OSMOSIS_FLOOR}{suffix}" for d in ordered]
    why = "osmosis-core and the plugins that carry what its extras and the migrated imports use"
    if (match["rest"] or "").strip():
        why += f" (osmosis-ai's version {match['rest'].strip()} does not apply)"
    notes = [Finding(where, line, f"{requirement.strip()} -> {', '.join(out)}", why)]
    return out, notes, unmapped


def migrate_pyproject(rel: str, text: str, needed: Iterable[str] = ()) -> tuple[str, list[Finding], list[Finding]]:
    """``text`` with every ``osmosis-ai`` requirement replaced (``[project] dependencies``,
    ``[project.optional-dependencies]``, ``[dependency-groups]``)."""
    needed = list(needed)
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        if "osmosis-ai" in text or "osmosis_ai" in text:
            return text, [], [Finding(rel, None, "pyproject.toml", f"not valid TOML ({exc}); fix it and migrate again")]
        return text, [], []
    notes: list[Finding] = []
    unmapped: list[Finding] = []
    arrays: list[Any] = []
    project = doc.get("project")
    if isinstance(project, dict):
        arrays.append(project.get("dependencies"))
        optional = project.get("optional-dependencies")
        if isinstance(optional, dict):
            arrays.extend(optional.values())
    groups = doc.get("dependency-groups")
    if isinstance(groups, dict):
        arrays.extend(groups.values())
    changed = False
    for array in arrays:
        if not isinstance(array, list):
            continue
        present = {_normal(m["name"]) for item in array if isinstance(item, str) and (m := _REQUIREMENT.match(item))}
        index = 0
        while index < len(array):
            item = array[index]
            replacement = replacement_requirements(item, needed, rel, None) if isinstance(item, str) else None
            if replacement is None:
                index += 1
                continue
            new, more_notes, more_unmapped = replacement
            new = [r for r in new if _normal(_REQUIREMENT.match(r)["name"]) not in present]  # type: ignore[index]
            notes += more_notes
            unmapped += more_unmapped
            changed = True
            if new:
                array[index] = new[0]
                for offset, extra in enumerate(new[1:], start=1):
                    array.insert(index + offset, extra)
            else:
                del array[index]
            present.update(_normal(_REQUIREMENT.match(r)["name"]) for r in new)  # type: ignore[index]
            index += max(len(new), 1) if new else 0
    sources = doc.get("tool", {}).get("uv", {}).get("sources", {}) if isinstance(doc.get("tool"), dict) else {}
    if isinstance(sources, dict) and any(_normal(k) == "osmosis-ai" for k in sources):
        unmapped.append(
            Finding(rel, None, "[tool.uv.sources] osmosis-ai", "a source for osmosis-ai, left as it is: remove it")
        )
    return (tomlkit.dumps(doc) if changed else text), notes, unmapped


def migrate_requirements(rel: str, text: str, needed: Iterable[str] = ()) -> tuple[str, list[Finding], list[Finding]]:
    """A ``requirements.txt`` with each ``osmosis-ai`` line replaced by one line per distribution."""
    needed = list(needed)
    out: list[str] = []
    notes: list[Finding] = []
    unmapped: list[Finding] = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        body = line.rstrip("\r\n")
        replacement = replacement_requirements(body, needed, rel, number) if not body.lstrip().startswith("-") else None
        if replacement is None:
            out.append(line)
            continue
        new, more_notes, more_unmapped = replacement
        ending = line[len(body) :] or "\n"
        comment = body[body.index("#") :] if "#" in body else ""
        out.extend(f"{r}{'  ' + comment if comment and i == 0 else ''}{ending}" for i, r in enumerate(new))
        notes += more_notes
        unmapped += more_unmapped
    return "".join(out), notes, unmapped
