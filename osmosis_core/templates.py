"""Starter templates (``osmosis template list|apply``) and reusable grader specs.

A template is a folder of files copied into the user's folder as they are. A plugin registers
one with :func:`~osmosis_core.hookspecs.osmosis_register_templates` (an example is there).
"""

from __future__ import annotations

import fnmatch
import itertools
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from osmosis_core.backend import load_object
from osmosis_core.errors import OsmosisError

__all__ = [
    "GUIDES_ROOT",
    "MULTIPLY_DATASET",
    "GraderSpec",
    "TemplateError",
    "TemplateSpec",
    "multiply_template",
]

_SKIP = ("__pycache__", "*.pyc", ".DS_Store", ".venv", "runs")
_TEXT_SUFFIXES = frozenset({".md", ".toml", ".txt", ".py"})


def examples_root() -> Path:
    """Where the example rollouts live: inside the installed wheel, else the source checkout."""
    package = Path(__file__).resolve().parent
    shipped = package / "_examples"
    return shipped if shipped.is_dir() else package.parent


MULTIPLY_DATASET = examples_root() / "rollouts" / "multiply-plain" / "data" / "multiply.jsonl"
"""The multiply examples' dataset: one file every multiply template copies (``extra_files``)."""

GUIDES_ROOT = Path(__file__).resolve().parent / "guides"
"""The coding-assistant guides every starter template carries: ``AGENTS.md`` and
``.agents/skills/<skill>/SKILL.md`` (create a rollout, evaluate it, debug a run, prepare training)."""


class TemplateError(OsmosisError):
    """A template cannot be applied (a file would be overwritten or escape the target folder)."""


@attrs.frozen
class TemplateSpec:
    """A starter template.

    :param name: what users type in ``osmosis template apply NAME``.
    :param root: the folder whose files are copied (paths inside stay as they are).
    :param description: one line for ``osmosis template list``.
    :param include: glob patterns (relative to ``root``) of the files to copy; all by default.
    :param next_steps: commands to show after applying, one per line.
    :param layers: more folders whose files are all copied too, under ``root``'s (a file in
        ``root`` wins). Shared files live once in a layer, e.g. :data:`GUIDES_ROOT`. In a
        layer's text files ``{{template}}`` becomes the template's name and ``{{KEY}}`` the
        value of ``variables[KEY]``.
    :param variables: values for a layer's placeholders, e.g. ``{"dataset": "data/multiply.jsonl"}``.
    :param extra_files: target path (relative to the folder applied into) -> a file kept elsewhere,
        for a file several templates share, e.g. ``{"data/multiply.jsonl": MULTIPLY_DATASET}``.
    """

    name: str
    root: Path
    description: str = ""
    include: tuple[str, ...] = ("**",)
    next_steps: str = ""
    layers: tuple[Path, ...] = ()
    variables: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    extra_files: Mapping[str, Path] = attrs.field(factory=dict, hash=False)

    def render(self, text: str) -> str:
        """A layer file's text with this template's placeholders filled in."""
        for key, value in {**self.variables, "template": self.name}.items():
            text = text.replace("{{" + key + "}}", value)
        return text

    def files(self) -> list[Path]:
        """The template's files, relative to ``root``, sorted.

        ``include`` patterns are anchored at ``root``: ``*`` and ``?`` stay within one folder
        name, ``**`` crosses folders. Only the folders a pattern can reach are walked.
        """
        root = Path(self.root)
        if not root.is_dir():
            raise TemplateError(f"template {self.name!r}: its folder {root} does not exist")
        found: set[Path] = set()
        for pattern in self.include:
            regex = _glob_regex(pattern)
            fixed = itertools.takewhile(lambda part: not any(c in part for c in "*?["), pattern.split("/"))
            start = root.joinpath(*fixed)
            candidates = [start] if start.is_file() else (start.rglob("*") if start.is_dir() else [])
            for path in candidates:
                rel = path.relative_to(root)
                skipped = path.is_dir() or any(fnmatch.fnmatch(part, skip) for part in rel.parts for skip in _SKIP)
                if not skipped and regex.fullmatch(rel.as_posix()):
                    found.add(rel)
        return sorted(found)


def multiply_template(
    name: str, root: Path, description: str, *, extra_files: Mapping[str, Path] | None = None
) -> TemplateSpec:
    """A template of the multiply examples: ``root``'s files with the guides (:data:`GUIDES_ROOT`), the
    shared dataset at ``data/multiply.jsonl`` and ``configs/eval/<name>.toml`` as the next step.

    >>> spec = multiply_template("multiply-mine", Path("template"), "My multiply agent.")
    >>> spec.next_steps
    'osmosis run configs/eval/multiply-mine.toml --stub-policy'
    """
    return TemplateSpec(
        name,
        root,
        description=description,
        next_steps=f"osmosis run configs/eval/{name}.toml --stub-policy",
        layers=(GUIDES_ROOT,),
        variables={"dataset": "data/multiply.jsonl"},
        extra_files={"data/multiply.jsonl": MULTIPLY_DATASET, **(extra_files or {})},
    )


_GLOB = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob anchored at the start: ``**`` spans folders, ``*`` and ``?`` do not."""
    parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern)  # the wildcards, and the literal text between them
    return re.compile("".join(_GLOB.get(part) or re.escape(part) for part in parts))


def _sources(spec: TemplateSpec) -> dict[Path, tuple[Path, bool]]:
    """relative path -> (source file, from a layer)."""
    plan: dict[Path, tuple[Path, bool]] = {}
    for layer in spec.layers:
        for rel in TemplateSpec(spec.name, Path(layer)).files():
            plan[rel] = (Path(layer) / rel, True)
    for target, source in spec.extra_files.items():
        if not Path(source).is_file():
            raise TemplateError(f"template {spec.name!r}: {source} (for {target}) does not exist")
        plan[Path(target)] = (Path(source), False)
    for rel in spec.files():
        plan[rel] = (Path(spec.root) / rel, False)
    return dict(sorted(plan.items()))


def apply_template(spec: TemplateSpec, dest: Path, *, force: bool = False) -> list[Path]:
    """Copy the template's files into ``dest``; return the paths written (relative to ``dest``).

    Nothing is written unless every file can be: an existing file is overwritten only with
    ``force``, and no path may resolve outside ``dest`` (``..`` or a symlink that leads out).
    """
    dest = Path(dest)
    base = dest.resolve()
    sources = _sources(spec)
    if not sources:
        raise TemplateError(f"template {spec.name!r} has no files")
    plan: list[tuple[Path, Path, bool]] = []
    existing: list[str] = []
    for rel, (source, from_layer) in sources.items():
        if rel.is_absolute() or ".." in rel.parts:
            raise TemplateError(f"template {spec.name!r}: refusing the path {rel} (outside the target folder)")
        target = (dest / rel).resolve()
        if not target.is_relative_to(base):
            raise TemplateError(
                f"template {spec.name!r}: {rel} would be written to {target}, outside {base}; nothing was written"
            )
        if target.exists():
            existing.append(rel.as_posix())
        plan.append((source, target, from_layer))
    if existing and not force:
        shown = ", ".join(existing[:5]) + (f" and {len(existing) - 5} more" if len(existing) > 5 else "")
        raise TemplateError(
            f"{len(existing)} file(s) already exist in {dest}: {shown}; nothing was written (use --force to overwrite)"
        )
    for source, target, from_layer in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        if from_layer and source.suffix in _TEXT_SUFFIXES:
            target.write_text(spec.render(source.read_text(encoding="utf-8")), encoding="utf-8")
        else:
            shutil.copyfile(source, target)
    return list(sources)


@attrs.frozen
class GraderSpec:
    """A reusable grader a plugin registers, named in a run config as ``grader = "NAME"``."""

    name: str
    factory: type[Any] | str
    description: str = ""

    def resolve(self) -> type[Any]:
        """The grader class, imported if it was given as a path."""
        return load_object(self.factory) if isinstance(self.factory, str) else self.factory
