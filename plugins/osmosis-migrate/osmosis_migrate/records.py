"""What a migration plans: the changed files, what it changed that matters, and what it could not map.

>>> print(Finding("configs/training/x.toml", None, "[training] lr = 1e-06", "a trainer setting"))
configs/training/x.toml: [training] lr = 1e-06: a trainer setting
>>> FileChange("a.py", "x = 1\\n", "y = 1\\n").diff().splitlines()[:3]
['--- a/a.py', '+++ b/a.py', '@@ -1 +1 @@']
"""

from __future__ import annotations

import difflib
from pathlib import Path

import attrs

from osmosis_core import OsmosisError

__all__ = ["FileChange", "Finding", "MigrateError", "MigrationPlan"]


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
