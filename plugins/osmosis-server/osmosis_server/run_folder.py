"""The server's run folder: the same ``results.jsonl`` as ``osmosis run``, ``run.json``, the token
file, and the admissions ledger that lets a restarted server pick up where the last one stopped.

Every finished rollout is appended to ``results.jsonl`` the moment it is final (the line format of
``osmosis run``, :class:`osmosis_core.frontend.RunFiles`), so a training run served by
``osmosis serve`` leaves the same records as an evaluation, and the same tools read both. No line
holds a secret: the rollout's ``llm_api_key``, the server's token and the configured header values
are redacted from every string of every line. One process writes a folder at a time
(the lock of :class:`osmosis_core.frontend.RunFiles`).

Every admission is recorded in ``admissions.db`` (:mod:`osmosis_server.ledger`) before the server
answers it, so a server started again on the folder (after a crash, a ``kill -9``, a redeploy)
knows each id it ever admitted: a recorded one answers its result (read back from its line) and
is never run again; one admitted but never recorded is *lost* and may be submitted once more.

``row`` and ``sample_index`` of a line: the request's own ``row`` / ``sample_index`` fields when it
sends them (or whole numbers under those names in its ``metadata``, for a reference client); else
``row`` is a running admission index of this folder (continued across restarts) and
``sample_index`` is 0, so each such rollout counts as its own row.

A request that brought a trainer's ``sampling_params`` or ``policy_version`` has them on its line
too (under those names; a line without them had none), so the folder says what each rollout was
sampled with, and by which version of the policy.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from osmosis_core import ExecutionResult, OsmosisError
from osmosis_core.frontend import TRACES, RunFiles, result_line, trace_from_line
from osmosis_server.ledger import Known, Ledger

__all__ = ["RESULTS", "RUN_META", "TOKEN_FILE", "TRACES", "RunFolder"]

RESULTS: Final = "results.jsonl"
RUN_META: Final = "run.json"
TOKEN_FILE: Final = "server-token"
KIND: Final = "serve"


class RunFolder:
    """One server's run folder (``open`` it before use, ``close`` it after).

    :param path: the folder (created when missing).
    :param meta: more keys for ``run.json`` (the config, the backend's name, ...); never a secret.
    :param secrets: values no line may hold (the server token, header values).
    """

    def __init__(
        self, path: Path | str, *, meta: dict[str, Any] | None = None, secrets: Iterable[str | None] = ()
    ) -> None:
        self.path = Path(path)
        self.meta = dict(meta or {})
        self._secrets = tuple(s for s in secrets if s and len(s) >= 4)
        self._files: RunFiles | None = None
        self.ledger = Ledger(self.path)
        self._results = str(self.path / RESULTS)
        self._traces_file = str(self.path / TRACES)
        self._end = 0
        self._traces_end = 0
        self.written = 0

    @property
    def results_path(self) -> Path:
        """``<folder>/results.jsonl``."""
        return self.path / RESULTS

    @property
    def traces_path(self) -> Path:
        """``<folder>/traces.jsonl`` (written when traces are on)."""
        return self.path / TRACES

    @property
    def is_open(self) -> bool:
        """Whether the folder is locked and its results file open."""
        return self._files is not None

    def add_secrets(self, *secrets: str | None) -> None:
        """More values to redact (the token, once it is known). Call before :meth:`open`."""
        self._secrets += tuple(s for s in secrets if s and len(s) >= 4)

    def open(self) -> RunFolder:
        """Lock the folder, check it is a server's (or new), write ``run.json``, open ``results.jsonl``.

        Idempotent. :raises OsmosisError: the folder is in use, or it holds an ``osmosis run``'s results.
        """
        if self._files is not None:
            return self
        files = RunFiles(self.path, secrets=self._secrets).lock()
        try:
            meta_path = self.path / RUN_META
            before: dict[str, Any] = {}
            if meta_path.is_file():
                with contextlib.suppress(ValueError, OSError):
                    before = json.loads(meta_path.read_text(encoding="utf-8"))
            if self.results_path.exists() and self.results_path.stat().st_size and before.get("kind") != KIND:
                raise OsmosisError(
                    f"{self.path} holds the results of an `osmosis run`, not of a server; choose another --output"
                )
            self._end, self._traces_end = self.ledger.open(self.results_path, self.traces_path)
            from osmosis_core import __version__ as core_version
            from osmosis_server import __version__

            now = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
            meta = {
                "kind": KIND,
                "osmosis_core": core_version,
                "osmosis_server": __version__,
                **self.meta,
                "started": before.get("started", now),
            }
            if before:
                meta["restarted"] = now
            meta_path.write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")
            files.open()
        except BaseException:
            self.ledger.close()
            files.close()
            raise
        self._files = files
        return self

    def write_token(self, token: str) -> Path:
        """Write the generated bearer token to ``<folder>/server-token``, readable by its owner only."""
        target = self.path / TOKEN_FILE
        temporary = self.path / f".{TOKEN_FILE}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (token + "\n").encode())
        finally:
            os.close(fd)
        os.replace(temporary, target)
        return target

    @property
    def lease_key(self) -> bytes:
        """The key polling leases are derived from: the folder's own, so they outlive a restart."""
        return self.ledger.lease_key

    @property
    def recovered(self) -> dict[str, int]:
        """What :meth:`open` found of earlier servers: ``{"recorded": n, "lost": m}`` rollout ids."""
        return dict(self.ledger.recovered)

    def next_row(self) -> int:
        """A fresh running row index (for a rollout that names none); kept by the next :meth:`admit`."""
        row = self.ledger.next_row
        self.ledger.next_row += 1
        return row

    def lookup(self, rollout_id: str) -> Known | None:
        """What this folder knows of ``rollout_id`` (None: never admitted here).

        :raises OSError: the ledger cannot be read.
        """
        return self.ledger.lookup(rollout_id)

    def admit(
        self,
        rollout_id: str,
        digest: bytes,
        row: int,
        sample_index: int,
        label: Any,
        *,
        attempts: int = 1,
        auto_row: bool = False,
    ) -> None:
        """Record an admission durably, before the server answers it (``attempts`` > 1: a lost id
        admitted again; ``auto_row``: ``row`` came from :meth:`next_row`).

        :raises OSError: it could not be recorded.
        """
        known = Known(rollout_id, digest, attempts, row, sample_index, label if isinstance(label, str) else None)
        self.ledger.admit(known, auto_row=auto_row)

    def record(
        self,
        row: int,
        sample_index: int,
        result: ExecutionResult,
        secrets: tuple[str, ...] = (),
        *,
        lease_expired: bool = False,
        digest: bytes = b"",
        attempts: int = 1,
        label: Any = None,
        trace_offset: int | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> int:
        """Append the line of one finished rollout (``secrets`` are that rollout's own: its key)
        and note it in the ledger, with what :meth:`admit` was given and where :meth:`record_trace`
        wrote its trace; return where the line starts. ``extra``: more fields of the line (the
        request's ``sampling_params`` and ``policy_version``).

        :raises TypeError, ValueError: the line is not JSON (a sample the workflow filled with objects).
        :raises OSError: the line could not be written.
        """
        if self._files is None:
            raise RuntimeError("the run folder is not open")
        start = self._end
        line = result_line(row, sample_index, result)
        if extra:
            line.update(extra)
        self._files.write_line(line, secrets)
        self._end = os.stat(self._results).st_size  # (a str: a Path costs more than the call)
        self.written += 1
        known = Known(
            result.rollout_id,
            digest,
            attempts,
            row,
            sample_index,
            label if isinstance(label, str) else None,
            start,
            result.status.value,
            lease_expired,
            trace_offset,
        )
        self.ledger.recorded(known, self._end, self._traces_end)
        return start

    def record_trace(
        self, row: int, sample_index: int, rollout_id: str, trace: dict[str, Any], secrets: tuple[str, ...] = ()
    ) -> int:
        """Append a finished rollout's trace to ``traces.jsonl`` (``osmosis run --traces``'s form),
        just before its result line; return where the line starts (for :meth:`record`).

        :raises TypeError, ValueError: the trace is not JSON. :raises OSError: it could not be written.
        """
        if self._files is None:
            raise RuntimeError("the run folder is not open")
        start = self._traces_end
        self._files.write_trace(row, sample_index, rollout_id, trace, secrets)
        self._traces_end = os.stat(self._traces_file).st_size  # (as for results: a str)
        return start

    def flush(self) -> None:
        """Write the ledger's pending changes to its index (the server does it about once a second)."""
        self.ledger.flush()

    def read_line(self, known: Known) -> dict[str, Any]:
        """The results line of a recorded rollout, read back from ``results.jsonl``.

        :raises ValueError: the line there is not that rollout's (the file was changed by hand).
        :raises OSError: it cannot be read.
        """
        if known.offset is None:
            raise ValueError(f"rollout {known.rollout_id} is not recorded")
        return _line_at(self.results_path, known.offset, known.rollout_id)

    def read_trace(self, known: Known) -> dict[str, Any] | None:
        """The trace of a recorded rollout as its result carried it, read back from its line in
        ``traces.jsonl`` (one seek, one line); None when it was recorded without one.

        :raises ValueError: the line there is not that rollout's trace. :raises OSError: it cannot be read.
        """
        if known.trace_offset is None:
            return None
        return trace_from_line(_line_at(self.traces_path, known.trace_offset, known.rollout_id))

    def close(self) -> None:
        """Flush the results to disk and release the folder (idempotent)."""
        files, self._files = self._files, None
        try:
            self.ledger.close()
        finally:
            if files is not None:
                files.close()  # the results flushed, then the lock released


def _line_at(path: Path, offset: int, rollout_id: str) -> dict[str, Any]:
    """The JSON line of ``rollout_id`` starting at byte ``offset`` of ``path``.

    :raises ValueError: the line there is not that rollout's (the file was changed by hand).
    :raises OSError: it cannot be read.
    """
    with path.open("rb") as handle:
        handle.seek(offset)
        raw = handle.readline()
    try:
        line = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path} at byte {offset}: not a JSON line ({exc})") from None
    if not isinstance(line, dict) or line.get("rollout_id") != rollout_id:
        raise ValueError(f"{path} at byte {offset}: not the line of {rollout_id}")
    return line
