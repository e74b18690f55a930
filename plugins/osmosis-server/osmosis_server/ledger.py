"""The run folder's admissions ledger: every rollout id a server admitted there, on disk (SQLite).

``<run folder>/admissions.db`` has one row per rollout id: the digest of the body it was admitted
with, its row and sample index, its string label, and, once it is recorded, where its line starts
in ``results.jsonl`` and its final status. It is written twice per rollout:

1. at admission, committed *before* the server answers 202 (an insert, or for a lost id an update);
2. after the rollout's line is appended to ``results.jsonl`` (the line first, then the ledger).

SQLite in WAL mode commits with a ``write`` to its log, which outlives the process: a ``kill -9``
at any instant leaves a consistent ledger. The one gap, a line written but the process killed
before its ledger update, is closed on the next start: ``results.jsonl`` is read (streamed) from
the last offset the ledger knows, and every line found there marks its id recorded. So after a
restart every id ever admitted is either *recorded* (its result is read back from its line) or
*lost* (admitted, never recorded: the trainer may submit it again and it runs once more), never
forgotten; and an id is recorded once, because a recorded id is never admitted again.

Memory stays bounded however long a server runs: the ledger is on disk and looked up by id (a
primary-key lookup); only SQLite's page cache (about 2 MB) is held. The file grows by about
100 bytes per rollout, next to results.jsonl's kilobytes. It also keeps the key that polling
leases are derived from, so the leases a trainer holds stay valid across a restart; it is created
readable by its owner only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import sqlite3
from pathlib import Path
from typing import Any, Final

import attrs

__all__ = ["LEDGER", "Known", "Ledger"]

LEDGER: Final = "admissions.db"

log = logging.getLogger("osmosis_server")

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY,
    digest BLOB NOT NULL,
    attempts INTEGER NOT NULL,
    row_index INTEGER NOT NULL,
    sample_index INTEGER NOT NULL,
    label TEXT,
    line_offset INTEGER,
    status TEXT,
    lease_expired INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS unrecorded ON rollouts(id) WHERE line_offset IS NULL;
"""
_COLUMNS: Final = "id, digest, attempts, row_index, sample_index, label, line_offset, status, lease_expired"


@attrs.frozen
class Known:
    """What the ledger knows of one rollout id."""

    rollout_id: str
    digest: bytes
    """The sha256 of the body it was last admitted with (empty: recorded by a server that kept no ledger)."""
    attempts: int
    row: int
    sample_index: int
    label: str | None
    offset: int | None
    """Where its line starts in ``results.jsonl``; None until it is recorded."""
    status: str | None
    lease_expired: bool

    @property
    def recorded(self) -> bool:
        """Whether its result line is in ``results.jsonl``."""
        return self.offset is not None


def cut_partial_tail(path: Path) -> int:
    """Cut a last line that a killed writer left without its newline; return the file's size after.

    Appending after such a line would glue the next one to it; the rollout it belonged to is not
    recorded (the ledger then reports it lost).
    """
    if not path.exists():
        return 0
    with path.open("r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        end = size
        while end > 0:
            start = max(0, end - (1 << 16))
            handle.seek(start)
            block = handle.read(end - start)
            if end == size and block.endswith(b"\n"):
                return size
            at = block.rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        else:
            keep = 0
        handle.truncate(keep)
    log.warning("%s: its last line was cut short (a killed server); it was removed", path)
    return keep


class Ledger:
    """The admissions ledger of one run folder (opened by :class:`~osmosis_server.RunFolder`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self.lease_key = b""
        self.next_row = 0
        self.recovered: dict[str, int] = {"recorded": 0, "lost": 0}

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the admissions ledger is not open")
        return self._db

    def open(self, results: Path) -> int:
        """Open (or create) the ledger and catch up with ``results``; return the results file's size.

        :raises OSError: the ledger cannot be created or read.
        """
        if self._db is not None:
            raise RuntimeError("the admissions ledger is already open")
        if not self.path.exists():  # created private: it holds the lease key
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        try:
            db = sqlite3.connect(self.path, check_same_thread=False)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")  # a commit outlives the process (not a power cut)
                db.executescript(_SCHEMA)
                self._db = db
                size = self._catch_up(results)
            except BaseException:
                self._db = None
                db.close()
                raise
        except sqlite3.Error as exc:
            raise OSError(f"{self.path}: the admissions ledger cannot be opened: {exc}") from None
        return size

    def _meta(self, key: str) -> Any:
        found = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if found is None else found[0]

    def _set(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _catch_up(self, results: Path) -> int:
        size = cut_partial_tail(results)
        db = self.db
        with db:
            key = self._meta("lease_key")
            if not isinstance(key, bytes) or len(key) < 32:
                key = secrets.token_bytes(32)
                self._set("lease_key", key)
            self.lease_key = key
            known_end = self._meta("results_end")
            start = known_end if isinstance(known_end, int) and 0 <= known_end <= size else 0
            lines = self._mark_recorded(results, start, size)
            next_row = self._meta("next_row")
            # a folder without a ledger yet (an older server's): its rows continue after its lines
            self.next_row = next_row if isinstance(next_row, int) else lines
            self._set("next_row", self.next_row)
            self._set("results_end", size)
        total = db.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0]
        lost = db.execute("SELECT COUNT(*) FROM rollouts WHERE line_offset IS NULL").fetchone()[0]
        self.recovered = {"recorded": total - lost, "lost": lost}
        return size

    def _mark_recorded(self, results: Path, start: int, end: int) -> int:
        """Mark recorded every id whose line lies between ``start`` and ``end``; return the count of lines."""
        if end <= start:
            return 0
        count = 0
        with results.open("rb") as handle:
            handle.seek(start)
            offset = start
            while offset < end:
                raw = handle.readline()
                if not raw:
                    break
                at, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                count += 1
                try:
                    line = json.loads(raw)
                    rollout_id = line["rollout_id"]
                    status = str(line["status"])
                    row, sample_index = int(line.get("row", 0)), int(line.get("sample_index", 0))
                    if not isinstance(rollout_id, str):
                        raise TypeError("rollout_id is not a string")
                except (ValueError, TypeError, KeyError, RecursionError) as exc:
                    log.warning("%s, the line at byte %d: not a result line, skipped (%s)", results, at, exc)
                    continue
                self.db.execute(
                    f"INSERT INTO rollouts ({_COLUMNS}) VALUES (?, x'', 1, ?, ?, NULL, ?, ?, 0) "
                    "ON CONFLICT (id) DO UPDATE SET line_offset = excluded.line_offset, status = excluded.status "
                    "WHERE line_offset IS NULL",
                    (rollout_id, row, sample_index, at, status),
                )
        return count

    def lookup(self, rollout_id: str) -> Known | None:
        """What the ledger knows of ``rollout_id`` (None: never admitted in this folder).

        :raises OSError: the ledger cannot be read.
        """
        try:
            found = self.db.execute(f"SELECT {_COLUMNS} FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        except sqlite3.Error as exc:
            raise OSError(f"{self.path}: cannot be read: {exc}") from None
        if found is None:
            return None
        rid, digest, attempts, row, sample_index, label, offset, status, lease_expired = found
        return Known(rid, bytes(digest), attempts, row, sample_index, label, offset, status, bool(lease_expired))

    def lookup_or_none(self, rollout_id: str) -> Known | None:
        """:meth:`lookup`, None when the ledger cannot be read either."""
        try:
            return self.lookup(rollout_id)
        except OSError:
            return None

    def admit(
        self, rollout_id: str, digest: bytes, row: int, sample_index: int, label: str | None, *, again: bool
    ) -> None:
        """Record an admission (``again``: a lost id admitted once more), committed before it returns.

        :raises OSError: it could not be recorded (the rollout must not be admitted then).
        """
        try:
            with self.db:
                if again:
                    self.db.execute(
                        "UPDATE rollouts SET digest = ?, attempts = attempts + 1, row_index = ?, sample_index = ?, "
                        "label = ? WHERE id = ? AND line_offset IS NULL",
                        (digest, row, sample_index, label, rollout_id),
                    )
                else:
                    self.db.execute(
                        f"INSERT INTO rollouts ({_COLUMNS}) VALUES (?, ?, 1, ?, ?, ?, NULL, NULL, 0)",
                        (rollout_id, digest, row, sample_index, label),
                    )
                self._set("next_row", self.next_row)
        except sqlite3.Error as exc:
            raise OSError(f"{self.path}: the admission of {rollout_id!r} cannot be recorded: {exc}") from None

    def recorded(self, rollout_id: str, offset: int, end: int, status: str, *, lease_expired: bool = False) -> None:
        """Mark ``rollout_id`` recorded at ``offset`` of results.jsonl (whose size is now ``end``).

        :raises OSError: it could not be marked (the next start finds the line anyway).
        """
        try:
            with self.db:
                self.db.execute(
                    f"INSERT INTO rollouts ({_COLUMNS}) VALUES (?, x'', 1, 0, 0, NULL, ?, ?, ?) "
                    "ON CONFLICT (id) DO UPDATE SET line_offset = excluded.line_offset, status = excluded.status, "
                    "lease_expired = excluded.lease_expired",
                    (rollout_id, offset, status, int(lease_expired)),
                )
                self._set("results_end", end)
        except sqlite3.Error as exc:
            raise OSError(f"{self.path}: {rollout_id!r} cannot be marked recorded: {exc}") from None

    def close(self) -> None:
        """Close the ledger (idempotent)."""
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
