"""Planning and applying the migration of a whole workspace (the folder holding ``rollouts/`` and ``configs/``).

:func:`plan_migration` reads the folder and returns every change without writing anything;
:func:`apply_migration` writes them, each changed file first copied to ``<file>.orig`` (it refuses,
before writing anything, when a backup already exists or a file changed since the plan).
Nothing is written outside the folder, and symlinks are never followed (the plan lists them). Only
regular files are read: the folder is listed from ``lstat`` data, so a FIFO or device is never
opened, and each file is opened with ``O_NONBLOCK | O_NOFOLLOW`` and checked with ``fstat`` on the
open descriptor (a FIFO or symlink put in its place after the listing is refused, not waited on).
Every file that could not be read is in the plan's ``unreadable``, with why.
"""

from __future__ import annotations

import ast
import errno
import os
import re
import stat
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import attrs

from osmosis_migrate.dependencies import migrate_pyproject, migrate_requirements
from osmosis_migrate.python_source import LEFTOVER_MARK, PythonAnalysis, migrate_python
from osmosis_migrate.records import FileChange, Finding, MigrateError, MigrationPlan
from osmosis_migrate.run_config import MIGRATED_MARK, RolloutFacts, migrate_run_config

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


def _skipped_folder(folder: Path, name: str) -> bool:
    return (
        name.startswith(".")
        or name in _SKIP_DIRS
        or name.endswith(".egg-info")
        or (folder / name / "pyvenv.cfg").exists()
    )


_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
    stat.S_IFLNK: "a symlink",
}

MAX_FILE_BYTES = 16 * 1024 * 1024
"""A file larger than this is not read (no source, config or requirements file is this large)."""


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


@attrs.define
class _Listing:
    """The workspace's files: regular files to consider, symlinks left alone, entries that cannot be read."""

    files: list[Path] = attrs.field(factory=list)
    symlinks: list[tuple[Path, str]] = attrs.field(factory=list)
    """Each symlink and where it points (never followed)."""
    unreadable: list[tuple[Path, str, str]] = attrs.field(factory=list)
    """Each entry not read: path, what it is, why."""


def _list(root: Path) -> _Listing:
    """Every entry under ``root`` (files of a folder first, then its subfolders, in name order), from
    ``lstat`` data: symlinks are listed and never followed, and FIFOs, devices and sockets are never opened."""
    listing = _Listing()
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as iterator:
                entries = sorted(iterator, key=lambda e: e.name)
        except OSError as exc:
            listing.unreadable.append((folder, "a folder that could not be listed", _why(exc)))
            continue
        subfolders: list[Path] = []
        for entry in entries:
            path = Path(entry.path)
            try:
                if entry.is_symlink():
                    if not _skipped_folder(folder, entry.name):
                        listing.symlinks.append((path, os.readlink(path)))
                elif entry.is_dir(follow_symlinks=False):
                    if not _skipped_folder(folder, entry.name):
                        subfolders.append(path)
                elif entry.is_file(follow_symlinks=False):
                    listing.files.append(path)
                else:
                    kind = _kind(entry.stat(follow_symlinks=False).st_mode)
                    listing.unreadable.append((path, kind, "not a regular file: not opened"))
            except OSError as exc:
                listing.unreadable.append((path, "could not be inspected", _why(exc)))
        stack.extend(reversed(subfolders))
    return listing


def _walk(root: Path) -> Iterator[Path]:
    yield from _list(root).files


def _why(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc}" + (f" ({name})" if name else "")


class _Unreadable(Exception):
    def __init__(self, subject: str, why: str) -> None:
        super().__init__(f"{subject}: {why}")
        self.subject = subject
        self.why = why


_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO put in a file's place after the listing cannot block the open
    | getattr(os, "O_NOFOLLOW", 0)  # nor can a symlink put there send it elsewhere
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def _read_bytes(path: Path) -> bytes:
    """The bytes of the regular file ``path``, checked on the open descriptor (not on the name, which can
    change between a check and the open).

    :raises _Unreadable: it is not a regular file (any more), it cannot be opened, or it is too large.
    """
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Unreadable("a symlink", "it became one after the folder was listed: left alone") from None
        raise _Unreadable("could not be opened", _why(exc)) from None
    with open(descriptor, "rb", closefd=True) as handle:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise _Unreadable(_kind(info.st_mode), "not a regular file: not read")
        too_large = _Unreadable("too large", f"{info.st_size:,} bytes > the limit of {MAX_FILE_BYTES:,}: not read")
        if info.st_size > MAX_FILE_BYTES:
            raise too_large
        try:
            data = handle.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise _Unreadable("could not be read", _why(exc)) from None
        if len(data) > MAX_FILE_BYTES:
            raise too_large
        return data


def _read_text(path: Path) -> str:
    """The file's UTF-8 text with its own line endings.

    :raises _Unreadable: as :func:`_read_bytes`, or it is not UTF-8 text.
    """
    data = _read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        named = re.search(rb"osmosis[-_.]ai", data, re.IGNORECASE) is not None
        why = f"byte 0x{data[exc.start]:02x} at offset {exc.start} is not UTF-8" + (
            "; it names osmosis-ai: migrate it by hand" if named else ""
        )
        raise _Unreadable("not UTF-8 text", why) from None


def _read(path: Path) -> str | None:
    """The file's text with its own line endings, or None when it cannot be read as UTF-8 text."""
    try:
        return _read_text(path)
    except _Unreadable:
        return None


def _same_endings(old: str, new: str) -> str:
    if "\r\n" in old:
        return new.replace("\r\n", "\n").replace("\n", "\r\n")
    return new


def _configs_need_decorator() -> bool:
    """True unless osmosis's config bases already turn annotated subclasses into attrs classes."""
    import attrs as attrs_module

    from osmosis_core import AgentWorkflowConfig

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
    unreadable: dict[str, Finding] = attrs.field(factory=dict)
    symlinks: list[Finding] = attrs.field(factory=list)
    reference: bool = False
    already: bool = False

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def read(self, path: Path) -> str | None:
        """``path``'s text, or None after noting why it could not be read."""
        try:
            return _read_text(path)
        except _Unreadable as exc:
            self.unreadable.setdefault(self.rel(path), Finding(self.rel(path), None, exc.subject, exc.why))
            return None

    def change(self, path: Path, old: str | None, new: str, *, executable: bool = False) -> None:
        if old is not None:
            new = _same_endings(old, new)
            if new == old:
                return
        self.changes[self.rel(path)] = FileChange(self.rel(path), old, new, executable)

    def plan(self) -> MigrationPlan:
        listing = _list(self.root)
        files = listing.files
        for path, subject, why in listing.unreadable:
            self.unreadable[self.rel(path)] = Finding(self.rel(path), None, subject, why)
        self.symlinks = [
            Finding(self.rel(path), None, f"a symlink to {target}", "left alone: never followed")
            for path, target in listing.symlinks
        ]
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
            unreadable=tuple(self.unreadable[k] for k in sorted(self.unreadable)),
            symlinks=tuple(self.symlinks),
        )

    # -- configs/eval and configs/training ---------------------------------------------------------

    def _configs(self, files: list[Path]) -> dict[Path, tuple[str, str]]:
        found: dict[Path, tuple[str, str]] = {}
        for path in files:
            if path.suffix != ".toml" or path.parent.parent != self.root / "configs":
                continue
            kind = path.parent.name
            text = self.read(path) or ""
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
        text = self.read(path)
        if text is None:
            return
        rel = self.rel(path)
        new, notes, unmapped = migrate_run_config(rel, text, root=self.root, rollout_facts=self._facts)
        self.notes += notes
        self.unmapped += unmapped
        if new is None:
            return
        self.change(path, text, new)
        from osmosis_core import ConfigError
        from osmosis_core.frontend import config_from_dict

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
            text = self.read(path)
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
            text = self.read(path)
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
            text = self.read(path) or ""
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
            try:
                original = _read_bytes(path)
            except _Unreadable as exc:
                raise MigrateError(f"{change.rel}: {exc} (it changed since the migration was planned)") from None
            with open(backup, "xb") as copy:
                copy.write(original)
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
