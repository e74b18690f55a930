"""Planning and applying the migration of a whole workspace (the folder holding ``rollouts/`` and ``configs/``).

:func:`plan_migration` reads the folder and returns every change without writing anything;
:func:`apply_migration` writes them, each changed file first copied to ``<file>.orig`` (it refuses,
before writing anything, when a backup already exists or a file changed since the plan).
Nothing is written outside the folder, and symlinks are never followed.
"""

from __future__ import annotations

import ast
import os
import re
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import attrs

from osmosis_core.migrate.dependencies import migrate_pyproject, migrate_requirements
from osmosis_core.migrate.python_source import LEFTOVER_MARK, PythonAnalysis, migrate_python
from osmosis_core.migrate.records import FileChange, Finding, MigrateError, MigrationPlan
from osmosis_core.migrate.run_config import MIGRATED_MARK, RolloutFacts, migrate_run_config

__all__ = ["apply_migration", "plan_migration"]

_SKIP_DIRS = frozenset({"__pycache__", "node_modules", "runs", "build", "dist", "site-packages"})

TEST_SH = """#!/bin/bash
# The verifier of this Harbor task (added by osmosis migrate): the rollout's Grader scores the sample.
# osmosis-harbor uploads osmosis-grade.sh, with the grader and the row's label, next to this file when
# verification starts; it writes /logs/verifier/reward.json (the reference SDK generated this at run time).
exec bash /tests/osmosis-grade.sh
"""

INSTRUCTION_MD = ""
"""osmosis-harbor appends the row's prompt to the task's instruction; osmosis-ai replaced it, so it starts empty."""


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(
            name
            for name in dirnames
            if not name.startswith(".")
            and name not in _SKIP_DIRS
            and not name.endswith(".egg-info")
            and not (here / name).is_symlink()
            and not (here / name / "pyvenv.cfg").exists()
        )
        for name in sorted(filenames):
            path = here / name
            if not path.is_symlink():
                yield path


def _read(path: Path) -> str | None:
    """The file's text with its own line endings, or None when it is not UTF-8."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except (UnicodeDecodeError, OSError):
        return None


def _same_endings(old: str, new: str) -> str:
    if "\r\n" in old:
        return new.replace("\r\n", "\n").replace("\n", "\r\n")
    return new


def _configs_need_decorator() -> bool:
    """True unless osmosis's config bases already turn annotated subclasses into attrs classes."""
    import attrs as attrs_module

    from osmosis_core.workflow import AgentWorkflowConfig

    class _Probe(AgentWorkflowConfig):
        probe_field: int = 1

    return "probe_field" not in {a.name for a in attrs_module.fields(_Probe)}


@attrs.define
class _Planner:
    root: Path
    changes: dict[str, FileChange] = attrs.field(factory=dict)
    notes: list[Finding] = attrs.field(factory=list)
    unmapped: list[Finding] = attrs.field(factory=list)
    analyses: dict[Path, PythonAnalysis] = attrs.field(factory=dict)
    migrated_entrypoints: set[Path] = attrs.field(factory=set)
    reference: bool = False
    already: bool = False

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def change(self, path: Path, old: str | None, new: str, *, executable: bool = False) -> None:
        if old is not None:
            new = _same_endings(old, new)
            if new == old:
                return
        self.changes[self.rel(path)] = FileChange(self.rel(path), old, new, executable)

    def plan(self) -> MigrationPlan:
        files = list(_walk(self.root))
        names = {self.rel(p) for p in files}
        self.already = any(n.endswith(".orig") and n[: -len(".orig")] in names for n in names)
        configs = self._configs(files)
        entrypoints = {self.root / "rollouts" / r / e for r, e in configs.values() if _segment(r) and _relative(e)}
        entrypoints.update(p for p in files if p.name == "main.py" and p.parent.parent == self.root / "rollouts")
        self._python([p for p in files if p.suffix == ".py"], entrypoints)
        self._dependencies(files)
        for path in configs:
            self._config(path)
        self._harbor_tasks(configs)
        self._other_files(files)
        return MigrationPlan(
            root=self.root,
            changes=tuple(self.changes[k] for k in sorted(self.changes)),
            notes=tuple(self.notes),
            unmapped=tuple(self.unmapped),
            is_reference_workspace=self.reference,
            already_migrated=self.already,
        )

    # -- configs/eval and configs/training ---------------------------------------------------------

    def _configs(self, files: list[Path]) -> dict[Path, tuple[str, str]]:
        found: dict[Path, tuple[str, str]] = {}
        for path in files:
            if path.suffix != ".toml" or path.parent.parent != self.root / "configs":
                continue
            kind = path.parent.name
            text = _read(path) or ""
            if kind == "benchmark" and "[experiment]" in text:
                self.reference = True
                self.unmapped.append(
                    Finding(
                        self.rel(path),
                        None,
                        "benchmark config",
                        "benchmarks are a platform feature osmosis does not offer",
                    )
                )
            if kind not in ("eval", "training"):
                continue
            if MIGRATED_MARK in text.partition("\n")[0]:
                self.already = True
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError:
                if "[experiment]" in text:
                    found[path] = ("", "main.py")
                continue
            experiment = data.get("experiment")
            if isinstance(experiment, dict):
                self.reference = True
                rollout = experiment.get("rollout")
                entry = experiment.get("entrypoint") or "main.py"
                found[path] = (
                    rollout if isinstance(rollout, str) else "",
                    entry if isinstance(entry, str) else "main.py",
                )
        return found

    def _config(self, path: Path) -> None:
        text = _read(path)
        if text is None:
            return
        rel = self.rel(path)
        new, notes, unmapped = migrate_run_config(rel, text, root=self.root, rollout_facts=self._facts)
        self.notes += notes
        self.unmapped += unmapped
        if new is None:
            return
        self.change(path, text, new)
        from osmosis_core.config import config_from_dict
        from osmosis_core.errors import ConfigError

        try:
            config_from_dict(tomllib.loads(new), source=path)
        except (ConfigError, tomllib.TOMLDecodeError) as exc:
            self.unmapped.append(Finding(rel, None, "the migrated config", f"does not load yet: {exc}"))

    def _facts(self, rollout: str, entrypoint: str) -> RolloutFacts:
        folder = f"rollouts/{rollout}"
        if not _segment(rollout) or not _relative(entrypoint):
            return RolloutFacts(name=rollout, folder=folder, exists=False)
        directory = self.root / "rollouts" / rollout
        entry = directory / entrypoint
        analysis = self.analyses.get(entry)
        fields: set[str] = set()
        for path, info in self.analyses.items():
            if path.is_relative_to(directory):
                fields.update(info.workflow_config_fields)
        backend = analysis.backend if analysis is not None else None
        return RolloutFacts(
            name=rollout,
            folder=folder,
            exists=directory.is_dir(),
            entrypoint_exists=entry.is_file(),
            backend=backend,
            workflow_config_fields=frozenset(fields),
            task_dir=self._task_dir(directory, backend.harbor.get("task_dir"))
            if backend and backend.kind == "harbor"
            else None,
        )

    def _task_dir(self, rollout_dir: Path, hint: PurePosixPath | None) -> str | None:
        if hint is not None:
            candidate = rollout_dir / hint
            if (candidate / "task.toml").is_file() and candidate.resolve().is_relative_to(self.root):
                return self.rel(candidate)
        found = [p.parent for p in _walk(rollout_dir) if p.name == "task.toml"]
        return self.rel(found[0]) if len(found) == 1 else None

    # -- Python sources ----------------------------------------------------------------------------

    def _python(self, files: list[Path], entrypoints: set[Path]) -> None:
        decorate = None
        for path in files:
            is_entry = path in entrypoints
            text = _read(path)
            if text is None:
                continue
            if "osmosis_ai" not in text and not is_entry:
                continue
            if decorate is None:
                decorate = _configs_need_decorator()
            if LEFTOVER_MARK in text or "(osmosis migrate)" in text:
                self.already = True
            result = migrate_python(self.rel(path), text, entrypoint=is_entry, decorate_configs=decorate)
            self.analyses[path] = result.analysis
            if result.references:
                self.reference = True
                if is_entry:
                    self.migrated_entrypoints.add(path)
            self.change(path, text, result.new_text)
            self.notes += result.notes
            self.unmapped += result.unmapped

    # -- dependencies ------------------------------------------------------------------------------

    def _dependencies(self, files: list[Path]) -> None:
        projects = {p.parent for p in files if p.name == "pyproject.toml"}
        needed: dict[Path, set[str]] = {}
        for path, analysis in self.analyses.items():
            owner = next((d for d in path.parents if d in projects), None)
            if owner is not None and owner.is_relative_to(self.root):
                needed.setdefault(owner, set()).update(analysis.distributions)
        for path in files:
            is_requirements = re.fullmatch(r"requirements.*\.txt", path.name) is not None
            if path.name != "pyproject.toml" and not is_requirements:
                continue
            text = _read(path)
            if text is None or not re.search(r"osmosis[-_.]ai", text, re.IGNORECASE):
                continue
            self.reference = True
            owner = next((d for d in path.parents if d in projects), path.parent)
            migrate = migrate_requirements if is_requirements else migrate_pyproject
            new, notes, unmapped = migrate(self.rel(path), text, sorted(needed.get(owner, set())))
            self.notes += notes
            self.unmapped += unmapped
            if new != text:
                self.change(path, text, new)
                lock = path.parent / "uv.lock"
                if lock.is_file():
                    self.unmapped.append(
                        Finding(
                            self.rel(lock), None, "uv.lock", f"stale: run `uv lock` in {self.rel(path.parent) or '.'}"
                        )
                    )

    # -- Harbor tasks ------------------------------------------------------------------------------

    def _harbor_tasks(self, configs: dict[Path, tuple[str, str]]) -> None:
        seen: set[str] = set()
        for rollout, entrypoint in configs.values():
            facts = self._facts(rollout, entrypoint)
            entry = self.root / "rollouts" / rollout / entrypoint
            if facts.task_dir is None or facts.task_dir in seen or entry not in self.migrated_entrypoints:
                continue
            seen.add(facts.task_dir)
            task = self.root / facts.task_dir
            test = task / "tests" / "test.sh"
            if not test.exists():
                self.change(test, None, TEST_SH, executable=True)
                self.notes.append(
                    Finding(
                        self.rel(test), None, "new file", "the task's verifier, handing over to the rollout's Grader"
                    )
                )
            instruction = task / "instruction.md"
            if not instruction.exists():
                self.change(instruction, None, INSTRUCTION_MD)
                self.notes.append(
                    Finding(
                        self.rel(instruction),
                        None,
                        "new file (empty)",
                        "osmosis-harbor appends each row's prompt to the task's instruction",
                    )
                )

    # -- anything else that names osmosis-ai -------------------------------------------------------

    def _other_files(self, files: list[Path]) -> None:
        for path in files:
            if not (path.name.startswith("Dockerfile") or path.suffix in (".sh", ".cfg") or path.name == "Makefile"):
                continue
            text = _read(path) or ""
            for number, line in enumerate(text.splitlines(), start=1):
                if re.search(r"osmosis[-_]ai", line, re.IGNORECASE):
                    self.unmapped.append(
                        Finding(
                            self.rel(path),
                            number,
                            line.strip()[:80],
                            "names osmosis-ai: install osmosis-core and the plugins your rollout imports instead",
                        )
                    )


def _segment(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name


def _relative(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(parts) and not PurePosixPath(path).is_absolute() and ".." not in parts


def plan_migration(root: Path | str) -> MigrationPlan:
    """Everything ``osmosis migrate`` would change in ``root``; nothing is written.

    :raises MigrateError: ``root`` is not a folder.
    """
    folder = Path(root)
    if not folder.is_dir():
        raise MigrateError(f"{folder}: not a folder")
    return _Planner(folder.resolve()).plan()


def _check_python(change: FileChange) -> None:
    if change.rel.endswith(".py"):
        try:
            ast.parse(change.new)
        except SyntaxError as exc:  # a bug of the migration: never write a file that no longer parses
            raise MigrateError(f"{change.rel}:{exc.lineno}: the migrated text does not parse ({exc.msg})") from None


def apply_migration(plan: MigrationPlan) -> list[Path]:
    """Write ``plan``'s changes: every changed file is first copied to ``<file>.orig``.

    Checks everything before writing anything.

    :raises MigrateError: a ``.orig`` backup exists already, a file changed since the plan, or a path
        would leave the workspace.
    """
    root = plan.root.resolve()
    problems: list[str] = []
    for change in plan.changes:
        path = root / change.rel
        if not path.parent.resolve().is_relative_to(root) or path.is_symlink():
            problems.append(f"{change.rel}: outside the workspace (or a symlink)")
            continue
        _check_python(change)
        if change.old is None:
            if path.exists():
                problems.append(f"{change.rel}: exists now; it did not when the migration was planned")
            continue
        if _read(path) != change.old:
            problems.append(f"{change.rel}: changed since the migration was planned")
        backup = path.with_name(path.name + ".orig")
        if backup.exists() or backup.is_symlink():
            problems.append(f"{change.rel}.orig exists (an earlier migration's backup?): move it away first")
    if problems:
        raise MigrateError("nothing was written:\n  " + "\n  ".join(problems))
    written: list[Path] = []
    for change in plan.changes:
        path = root / change.rel
        if change.old is not None:
            backup = path.with_name(path.name + ".orig")
            with open(path, "rb") as source, open(backup, "xb") as copy:
                copy.write(source.read())
            os.chmod(backup, path.stat().st_mode & 0o7777)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, change)
        written.append(path)
    return written


def _write(path: Path, change: FileChange) -> None:
    mode = path.stat().st_mode & 0o7777 if path.exists() else (0o755 if change.executable else 0o644)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with open(descriptor, "w", encoding="utf-8", newline="") as handle:
            handle.write(change.new)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
