"""What a migration plans: the changed files, what it changed that matters, and what it could not map.

>>> print(Finding("configs/training/x.toml", None, "[training] lr = 1e-06", "a trainer setting"))
configs/training/x.toml: [training] lr = 1e-06: a trainer setting
>>> FileChange("a.py", "x = 1\\n", "y = 1\\n").diff().splitlines()[:3]
['--- a/a.py', '+++ b/a.py', '@@ -1 +1 @@']
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import attrs

from osmosis_core import OsmosisError

__all__ = [
    "LEFTOVER_MARK",
    "BackendCall",
    "FileChange",
    "Finding",
    "MigrateError",
    "MigrationPlan",
    "PythonAnalysis",
    "PythonMigration",
]


class MigrateError(OsmosisError):
    """The migration cannot go on (a backup would be overwritten, a file changed meanwhile, ...)."""


@attrs.frozen
class Finding:
    """One thing to know about a file: a setting or name not carried over (and why), or a change made."""

    path: str
    """The file, relative to the workspace, with ``/`` separators."""
    line: int | None
    """The line in the migrated file (1-based), when the finding has one."""
    subject: str
    why: str

    @property
    def where(self) -> str:
        """``path:line`` (or the path alone)."""
        return f"{self.path}:{self.line}" if self.line else self.path

    def __str__(self) -> str:
        return f"{self.where}: {self.subject}: {self.why}"


@attrs.frozen
class FileChange:
    """One file to write: ``old`` is its current text (None for a new file), ``new`` the text to write."""

    rel: str
    old: str | None
    new: str
    executable: bool = False
    """Make a new file executable (a Harbor test script)."""

    def diff(self) -> str:
        """A unified diff (``a/rel`` to ``b/rel``; ``/dev/null`` for a new file)."""
        before = (self.old or "").splitlines(keepends=True)
        after = self.new.splitlines(keepends=True)
        lines = difflib.unified_diff(
            before,
            after,
            fromfile="/dev/null" if self.old is None else f"a/{self.rel}",
            tofile=f"b/{self.rel}",
        )
        out = []
        for line in lines:
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
        return "".join(out)


@attrs.frozen
class MigrationPlan:
    """Everything ``osmosis migrate`` would do to a workspace, computed without writing anything."""

    root: Path
    changes: tuple[FileChange, ...]
    notes: tuple[Finding, ...]
    """Changes worth knowing about (a removed argument, a moved import, a new file)."""
    unmapped: tuple[Finding, ...]
    """Settings and names not carried over, each with why."""
    is_reference_workspace: bool
    """Something in the folder was written for osmosis-ai (an import, a dependency, an [experiment] config)."""
    already_migrated: bool
    """Signs of an earlier ``osmosis migrate --write``: ``.orig`` backups or its markers."""
    unreadable: tuple[Finding, ...] = ()
    """Files it could not read, each with why (a FIFO or device, a failed open, not UTF-8 text, too large):
    they were not migrated."""
    symlinks: tuple[Finding, ...] = ()
    """Symlinks in the workspace: never followed, left alone."""


# -- what a Python file's migration yields (python_source, codemod) ---------------------------------

LEFTOVER_MARK = "# osmosis migrate: not offered by osmosis (see its MIGRATING.md)"
"""The comment on an import osmosis has no counterpart for (kept so the file fails loudly, not silently)."""


@attrs.frozen
class BackendCall:
    """What an entrypoint's ``LocalBackend(...)`` / ``HarborBackend(...)`` call tells a run config."""

    kind: str
    """``local`` or ``harbor``."""
    line: int
    workflow: str | None = None
    grader: str | None = None
    """A class name or import path; ``"none"`` when the backend was built without a grader."""
    harbor: dict[str, Any] = attrs.field(factory=dict)
    """``[backend.harbor]`` keys read from the call (``task_dir`` relative to the rollout folder)."""


@attrs.frozen
class PythonAnalysis:
    """Facts about a file that the config and dependency migrations use."""

    workflow_config_fields: frozenset[str] = frozenset()
    """Fields of the workflow config classes the file defines (for ``[sampling]``)."""
    backend: BackendCall | None = None
    distributions: frozenset[str] = frozenset()
    """osmosis distributions the migrated imports need."""


@attrs.define
class PythonMigration:
    """The migrated text and what to tell the user about it."""

    new_text: str
    notes: list[Finding]
    unmapped: list[Finding]
    analysis: PythonAnalysis
    references: bool
    """The file imports osmosis-ai."""
