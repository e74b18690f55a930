"""The run folder's admissions ledger: every rollout id a server admitted there, kept on disk.

Two files of the run folder:

* ``admissions.log``: one JSON line per admission, appended (one ``write``) *before* the server
  answers 202. A ``write`` outlives the process that made it, so after a ``kill -9`` at any
  instant every id that got its 202 is in the log (a last line cut short is removed on start);
* ``admissions.db`` (SQLite): the index a server looks ids up in, one row per id: the digest of
  the body it was admitted with, its row and sample index, its string label, and once it is
  recorded, where its line starts in ``results.jsonl``, its final status, and (traces on) where
  its trace line starts in ``traces.jsonl``. It is written in
  batches (about once a second, and when 1,024 changes wait), off the path of every request; what
  is not in it yet is held in memory and found there.

``results.jsonl`` stays the record of what finished. On start, the server folds into the index
what the log, ``results.jsonl`` and ``traces.jsonl`` hold past the offsets the index last saw (the
files are read as streams), so a change that was waiting for its batch when the process died is never lost. After
that, every id ever admitted on the folder is either *recorded* (its result is read back from its
line, and it is never admitted again, so never recorded twice) or *lost* (admitted, never
recorded: the trainer may submit it again, and it runs once more), never forgotten.

Memory stays bounded however long a server runs: the index is on disk, looked up by primary key;
only the pending batch and SQLite's page cache (about 2 MB) are held. Once the index holds all of
the log, the log is emptied (at 4 MiB); the index grows by about 150 bytes per rollout, next to
results.jsonl's kilobytes. It also keeps the key polling leases are derived from, so the leases a
trainer holds stay valid across a restart; it is created readable by its owner only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import attrs

__all__ = ["ADMISSIONS_LOG", "LEDGER", "Known", "Ledger", "cut_partial_tail"]

LEDGER: Final = "admissions.db"
ADMISSIONS_LOG: Final = "admissions.log"
BATCH: Final = 1024
"""Changes held in memory before the index is written at once."""
LOG_COMPACT_BYTES: Final = 4 << 20
"""An admissions log this large, wholly in the index, is emptied."""

log = logging.getLogger("osmosis_server")
_string = json.JSONEncoder(ensure_ascii=False).encode  # a str as a JSON string

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
    lease_expired INTEGER NOT NULL,
    trace_offset INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS unrecorded ON rollouts(id) WHERE line_offset IS NULL;
"""
_COLUMNS: Final = (
    "id, digest, attempts, row_index, sample_index, label, line_offset, status, lease_expired, trace_offset"
)
_UPSERT: Final = (
    f"INSERT INTO rollouts ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
    "digest = excluded.digest, attempts = excluded.attempts, row_index = excluded.row_index, "
    "sample_index = excluded.sample_index, label = excluded.label, line_offset = excluded.line_offset, "
    "status = excluded.status, lease_expired = excluded.lease_expired, trace_offset = excluded.trace_offset"
)
_SELECT: Final = f"SELECT {_COLUMNS} FROM rollouts WHERE id = ?"
# what results.jsonl says of an id: it is recorded there (first line wins)
_MARK: Final = (
    f"INSERT INTO rollouts ({_COLUMNS}) VALUES (?, x'', 1, ?, ?, NULL, ?, ?, 0, NULL) ON CONFLICT (id) DO UPDATE SET "
    "line_offset = excluded.line_offset, status = excluded.status WHERE line_offset IS NULL"
)
# what the admissions log says of an id: admitted (never over a recorded one)
_ADMITTED: Final = (
    f"INSERT INTO rollouts ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, 0, NULL) ON CONFLICT (id) DO UPDATE SET "
    "digest = excluded.digest, attempts = excluded.attempts, row_index = excluded.row_index, "
    "sample_index = excluded.sample_index, label = excluded.label WHERE line_offset IS NULL"
)
# what traces.jsonl says of an id: where its (latest) trace line starts
_TRACED: Final = "UPDATE rollouts SET trace_offset = ? WHERE id = ?"


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
    offset: int | None = None
    """Where its line starts in ``results.jsonl``; None until it is recorded."""
    status: str | None = None
    lease_expired: bool = False
    trace_offset: int | None = None
    """Where its trace line starts in ``traces.jsonl`` (None: recorded without a trace)."""

    @property
    def recorded(self) -> bool:
        """Whether its result line is in ``results.jsonl``."""
        return self.offset is not None

    def row_values(self) -> tuple[Any, ...]:
        return (
            self.rollout_id,
            self.digest,
            self.attempts,
            self.row,
            self.sample_index,
            self.label,
            self.offset,
            self.status,
            int(self.lease_expired),
            self.trace_offset,
        )


def cut_partial_tail(path: Path) -> int:
    """Cut a last line that a killed writer left without its newline; return the file's size after.

    Appending after such a line would glue the next one to it. (What it held is lost: a results
    line cut short leaves its rollout lost, an admissions line cut short its admission unanswered.)
    """
    if not path.exists():
        return 0
    with path.open("r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        end, keep = size, 0
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
        handle.truncate(keep)
    log.warning("%s: its last line was cut short (a killed server); it was removed", path)
    return keep


def _lines(path: Path, start: int, end: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(offset, object)`` of each JSON line of ``path`` between ``start`` and ``end``, streamed;
    a line that is not a JSON object is skipped with a warning naming where it is."""
    if end <= start:
        return
    with path.open("rb") as handle:
        handle.seek(start)
        offset = start
        while offset < end:
            raw = handle.readline()
            if not raw:
                return
            at, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                log.warning("%s, the line at byte %d: not JSON, skipped (%s)", path, at, exc)
                continue
            if isinstance(value, dict):
                yield at, value


class Ledger:
    """The admissions ledger of one run folder (opened by :class:`~osmosis_server.RunFolder`).

    :param folder: the run folder (the log and the index are created there).
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / LEDGER
        self.log_path = folder / ADMISSIONS_LOG
        self._db: sqlite3.Connection | None = None
        self._reader: sqlite3.Cursor | None = None
        self._fd: int | None = None
        self._pending: dict[str, Known] = {}
        self._log_end = 0
        self.results_end = 0
        """How far results.jsonl is marked (the run folder moves it on as it appends)."""
        self.traces_end = 0
        """How far traces.jsonl is marked (likewise)."""
        self.lease_key = b""
        self.next_row = 0
        self.recovered: dict[str, int] = {"recorded": 0, "lost": 0}

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the admissions ledger is not open")
        return self._db

    # -- open: catch up with the log and results.jsonl ---------------------------------------------

    def open(self, results: Path, traces: Path) -> tuple[int, int]:
        """Open (or create) the ledger and fold in what the log, ``results`` and ``traces`` hold past
        what the index saw; return the sizes of ``results`` and ``traces`` (a last line cut short removed).

        :raises OSError: the ledger cannot be created or read.
        """
        if self._db is not None:
            raise RuntimeError("the admissions ledger is already open")
        for path in (self.path, self.log_path):  # created private: the index holds the lease key
            if not path.exists():
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        try:
            db = sqlite3.connect(self.path, check_same_thread=False)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
                if "trace_offset" not in {row[1] for row in db.execute("PRAGMA table_info(rollouts)")}:
                    db.execute("ALTER TABLE rollouts ADD COLUMN trace_offset INTEGER")  # a ledger of before traces
                self._db = db
                self._reader = db.cursor()
                sizes = self._catch_up(results, traces)
            except BaseException:
                self._db = None
                db.close()
                raise
        except sqlite3.Error as exc:
            raise OSError(f"{self.path}: the admissions ledger cannot be opened: {exc}") from None
        self._fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        return sizes

    def _meta(self, key: str) -> Any:
        found = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if found is None else found[0]

    def _set(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def _since(self, key: str, size: int) -> int:
        seen = self._meta(key)
        return seen if isinstance(seen, int) and 0 <= seen <= size else 0  # a file replaced: from its start

    def _catch_up(self, results: Path, traces: Path) -> tuple[int, int]:
        db = self.db
        log_size = cut_partial_tail(self.log_path)
        size = cut_partial_tail(results)
        traces_size = cut_partial_tail(traces)
        with db:
            key = self._meta("lease_key")
            if not isinstance(key, bytes) or len(key) < 32:
                key = secrets.token_bytes(32)
                self._set("lease_key", key)
            self.lease_key = key
            next_row = self._meta("next_row")
            self.next_row = next_row if isinstance(next_row, int) else 0
            for _, entry in _lines(self.log_path, self._since("log_end", log_size), log_size):
                known = _from_log(entry)
                if known is not None:
                    db.execute(_ADMITTED, known.row_values()[:6])
                    if entry.get("auto_row"):
                        self.next_row = max(self.next_row, known.row + 1)
            lines = 0
            for at, line in _lines(results, self._since("results_end", size), size):
                rollout_id = line.get("rollout_id")
                row, sample_index = line.get("row"), line.get("sample_index")
                if not isinstance(rollout_id, str) or not isinstance(row, int) or not isinstance(sample_index, int):
                    log.warning("%s, the line at byte %d: not a result line, skipped", results, at)
                    continue
                lines += 1
                db.execute(_MARK, (rollout_id, row, sample_index, at, str(line.get("status"))))
            if not isinstance(next_row, int):  # a folder without a ledger yet: rows continue after its lines
                self.next_row = max(self.next_row, lines)
            # after the results: a trace line notes where it is on its id's row
            for at, line in _lines(traces, self._since("traces_end", traces_size), traces_size):
                rollout_id = line.get("rollout_id")
                if isinstance(rollout_id, str):
                    db.execute(_TRACED, (at, rollout_id))
            self._log_end, self.results_end, self.traces_end = log_size, size, traces_size
            self._checkpoint()
        total = db.execute("SELECT COUNT(*) FROM rollouts").fetchone()[0]
        lost = db.execute("SELECT COUNT(*) FROM rollouts WHERE line_offset IS NULL").fetchone()[0]
        self.recovered = {"recorded": total - lost, "lost": lost}
        return size, traces_size

    def _checkpoint(self) -> None:
        self._set("log_end", self._log_end)
        self._set("results_end", self.results_end)
        self._set("traces_end", self.traces_end)
        self._set("next_row", self.next_row)

    # -- a running server's changes ----------------------------------------------------------------

    def lookup(self, rollout_id: str) -> Known | None:
        """What the ledger knows of ``rollout_id`` (None: never admitted in this folder).

        :raises OSError: the index cannot be read.
        """
        pending = self._pending.get(rollout_id)
        if pending is not None:
            return pending
        if self._reader is None:
            raise RuntimeError("the admissions ledger is not open")
        try:
            found = self._reader.execute(_SELECT, (rollout_id,)).fetchone()
        except sqlite3.Error as exc:
            raise OSError(f"{self.path}: cannot be read: {exc}") from None
        if found is None:
            return None
        rid, digest, attempts, row, sample_index, label, offset, status, lease_expired, trace_offset = found
        return Known(
            rid, bytes(digest), attempts, row, sample_index, label, offset, status, bool(lease_expired), trace_offset
        )

    def admit(self, known: Known, *, auto_row: bool = False) -> None:
        """Append an admission to the log (one ``write``, done when this returns); the index
        follows with the next batch.

        :raises OSError: it could not be written (the rollout must not be admitted then).
        """
        if self._fd is None:
            raise RuntimeError("the admissions ledger is not open")
        data = (
            f'{{"id":{_string(known.rollout_id)},"digest":"{known.digest.hex()}","attempts":{known.attempts:d},'
            f'"row":{known.row:d},"sample_index":{known.sample_index:d},'
            f'"label":{"null" if known.label is None else _string(known.label)}'
            f"{',"auto_row":true' if auto_row else ''}}}\n"
        ).encode()
        written = os.write(self._fd, data)
        if written != len(data):
            raise OSError(f"{self.log_path}: a short write ({written} of {len(data)} bytes)")
        self._log_end += written
        self._hold(known)

    def recorded(self, known: Known, end: int, traces_end: int) -> None:
        """Note a recorded rollout (``known.offset``: where its line starts in results.jsonl, which
        is now ``end`` bytes long; ``traces_end``: traces.jsonl's size, its trace's line included if it has one);
        the index follows with the next batch."""
        self.results_end = end
        self.traces_end = traces_end
        self._hold(known)

    def _hold(self, known: Known) -> None:
        self._pending[known.rollout_id] = known
        if len(self._pending) >= BATCH:
            self.flush()

    def flush(self) -> None:
        """Write the pending changes to the index in one transaction (and empty a log it wholly holds)."""
        if self._db is None or (not self._pending and self._log_end < LOG_COMPACT_BYTES):
            return
        pending = self._pending
        try:
            with self.db:
                self.db.executemany(_UPSERT, [k.row_values() for k in pending.values()])
                self._checkpoint()
            self._pending = {}
            if self._log_end >= LOG_COMPACT_BYTES and self._fd is not None:
                with self.db:  # first "read the log from its start" (harmless: read twice, it says the same)
                    self._set("log_end", 0)
                os.ftruncate(self._fd, 0)
                self._log_end = 0
        except (sqlite3.Error, OSError) as exc:
            log.error("%s: the admissions index cannot be written (kept in memory, tried again): %s", self.path, exc)

    def close(self) -> None:
        """Write what is pending and close (idempotent)."""
        with contextlib.suppress(RuntimeError):
            self.flush()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        db, self._db, self._reader = self._db, None, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()


def _from_log(entry: dict[str, Any]) -> Known | None:
    try:
        label = entry.get("label")
        return Known(
            str(entry["id"]),
            bytes.fromhex(entry["digest"]),
            int(entry.get("attempts", 1)),
            int(entry["row"]),
            int(entry["sample_index"]),
            label if isinstance(label, str) else None,
        )
    except (KeyError, ValueError, TypeError) as exc:
        log.warning("an admissions log line was skipped (%s)", exc)
        return None
