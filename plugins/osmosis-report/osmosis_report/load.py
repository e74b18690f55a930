"""Reading a run folder (``osmosis run`` or ``osmosis serve``) into what a report shows.

``results.jsonl`` is read as a stream and never written (a run may still be writing it): a
damaged line is listed as ``file:line`` and skipped, a last line still being written is left for
the next report. A (row, sample) pair with several records (retries) counts by its latest, as the
core's summary counts it (:func:`osmosis_core.frontend.latest_records`).

A NaN or infinite number (an older osmosis or a hand-written line; strict JSON has none) is listed
as ``file:line: field is NaN`` and shown as such: a metric or a message keeps it, spelled as
``osmosis run`` now writes a non-finite metric (``"NaN"``, ``"Infinity"``, ``"-Infinity"``); a
non-finite reward makes its rollout a failure (``validation_error``), as a grader's non-finite
reward is one now; a non-finite timing or time is left out. Prompts and labels come from
the dataset named in ``run.json`` when it is still the file the run read (same SHA-256); else from
the samples' own leading messages. ``traces.jsonl``, when the run captured traces, gives token
counts per rollout and the policy version of each model call.

A training run: a trainer that drives ``osmosis serve`` tags each rollout with its ``policy_version``
(its step), which the rollout's line records. A server's rollouts are told apart by their rollout
id, not by (row, sample): a trainer names the rows of each step's batch again (row 0 of step 12 is
not row 0 of step 11), and a server records each id once. When the lines carry policy versions, the
report's rows are the groups of a step: one per (policy version, row), in training order (see
:mod:`osmosis_report.steps`), each keeping the row its lines name (``source_row``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import tomllib
from collections import Counter
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import attrs

from osmosis_core import OsmosisError
from osmosis_core.frontend import (
    LineOutcome,
    ResultStats,
    Summary,
    fingerprint,
    finite_json,
    nonfinite_paths,
    read_dataset,
    scan_results,
    summary_fields,
)
from osmosis_report.steps import training_order

__all__ = ["RolloutRecord", "Row", "RunData", "Tokens", "load_run", "prompt_hash", "prompt_text"]

_NO_CALLS: tuple[str | None, ...] = ()

MAX_STRING = 200_000
"""Characters kept of any one string of a trajectory (a longer one is clipped, and says where the
whole of it is); the viewer shows a long message folded, with a button that unfolds it."""


@attrs.define(slots=True)
class Tokens:
    """Token counts of one rollout's model calls, from ``traces.jsonl``."""

    calls: int
    prompt: int
    generated: int
    complete: bool
    per_call: list[tuple[int, int]]
    versions: tuple[str | None, ...] = _NO_CALLS
    """The policy version each call was served by, in call order (None: the call names none; empty: no
    call names one)."""


@attrs.define(slots=True)
class RolloutRecord:
    """The latest record of one (row, sample) pair, without its sample (kept compact in ``trajectory``)."""

    row: int
    sample: int
    rollout_id: str
    status: str
    stage: str
    category: str | None
    message: str | None
    reward: float | None
    timings: dict[str, float]
    finished_at: float | None
    metrics: dict[str, Any]
    """A NaN or infinite metric spelled ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    grader_metrics: list[str] | None
    """The names of the metrics the grader set (None: the line does not say, written before 0.2)."""
    attempts: int
    trajectory: str | None
    """The compact JSON of the messages, system prompt, metrics, error and timings (None: no sample)."""
    first_messages: list[dict[str, Any]] | None = None
    tokens: Tokens | None = None
    passed: bool | None = None
    version: str | None = None
    """The policy version that made it: its line's ``policy_version`` (the trainer's step), else the
    first one its traced calls name; None when neither says."""
    source_row: int | None = None
    """The row its line names, when the report numbers rows otherwise (a training run: one row per
    policy version and row; see the module)."""

    @property
    def latency(self) -> float:
        """Workflow plus grader seconds (what the core's summary calls latency)."""
        return float(self.timings.get("workflow", 0.0)) + float(self.timings.get("grader", 0.0))

    @property
    def ok(self) -> bool:
        return self.status == "success"

    @property
    def graded(self) -> bool:
        """Counts for pass rates and pass@k: a failure (never passes) or a success with a reward."""
        return self.status not in ("success", "cancelled") or self.reward is not None

    @property
    def call_versions(self) -> tuple[str | None, ...]:
        """The policy version of each traced call (empty without a trace, or when no call names one)."""
        return self.tokens.versions if self.tokens is not None else _NO_CALLS

    @property
    def off_policy_calls(self) -> int:
        """Traced calls served by another policy version than the rollout's own (:attr:`version`): the
        weights changed while it ran. A call that names no version is not counted."""
        return sum(1 for v in self.call_versions if v is not None and v != self.version)

    @property
    def off_policy(self) -> bool:
        """Its traced calls span several policy versions (or name another than its own)."""
        return self.off_policy_calls > 0


@attrs.define
class Row:
    """One dataset row and its rollouts."""

    index: int
    prompt: list[dict[str, Any]] | None
    label: Any
    rollouts: list[RolloutRecord] = attrs.field(factory=list)
    version: str | None = None
    """The policy version of its rollouts, when the run has versions (one row per version and row)."""
    source_row: int | None = None
    """The row its results lines name, when the report numbers rows otherwise (see the module)."""

    @property
    def hash(self) -> str:
        return prompt_hash(self.prompt)

    @property
    def text(self) -> str:
        return prompt_text(self.prompt)

    def counts(self) -> tuple[int, int]:
        """``(n, c)``: graded samples and passing ones."""
        graded = [r for r in self.rollouts if r.graded]
        return len(graded), sum(bool(r.passed) for r in graded)

    def rewards(self) -> list[float]:
        """The rewards of the rollouts that have one (failures left out: the graded mean's)."""
        return [r.reward for r in self.rollouts if r.ok and r.reward is not None]

    def scores(self) -> list[float]:
        """A value per graded rollout, a failure counting as 0: what the mean reward and the pass
        rate both count (the same rollouts as :meth:`counts`)."""
        return [r.reward if r.ok and r.reward is not None else 0.0 for r in self.rollouts if r.graded]


@attrs.define
class RunData:
    """A run folder, read."""

    path: Path
    meta: dict[str, Any]
    config: dict[str, Any]
    summary: Summary
    rows: dict[int, Row]
    damaged: list[str]
    nonfinite: list[str]
    """``file:line: field is NaN`` for each NaN or infinite number the results held (see the module)."""
    pass_threshold: float
    prompt_source: str
    """``dataset`` (the file the run read) or ``samples`` (each row's first sample)."""
    live: bool
    """Another process holds the run folder's lock (the run or server is still going)."""
    traces: bool
    cancelled: int
    read_bytes: int
    versions: list[str] = attrs.field(factory=list)
    """The policy versions its rollouts name, in training order (:func:`osmosis_report.steps.training_order`);
    empty when none does."""

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def rollouts(self) -> list[RolloutRecord]:
        return [r for row in self.rows.values() for r in row.rollouts]

    @property
    def partial(self) -> bool:
        return self.live or self.summary.interrupted or self.summary.finished < self.summary.expected

    @property
    def kind(self) -> str:
        return str(self.meta.get("kind", "run"))


def prompt_hash(prompt: list[dict[str, Any]] | None) -> str:
    """A short stable hash of a prompt's messages (rows of two runs match only when theirs agree)."""
    if prompt is None:
        return ""
    text = json.dumps(prompt, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prompt_text(prompt: list[dict[str, Any]] | None) -> str:
    """The text of a prompt's last user message (what the row table shows)."""
    for message in reversed(prompt or []):
        if message.get("role") == "user":
            return _text(message.get("content"))
    return _text(prompt[-1].get("content")) if prompt else ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part if isinstance(part, str) else str(part.get("text", ""))
            for part in content
            if isinstance(part, (str, dict))
        )
    return "" if content is None else json.dumps(content, ensure_ascii=False, default=str)


def clip_strings(value: Any, limit: int = MAX_STRING, *, where: str = "") -> Any:
    """``value`` with every string longer than ``limit`` cut, saying how much was cut (and, given
    ``where``, the ``file:line`` that holds the whole of it)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        whole = f"; the whole of it is in {where}" if where else ""
        return value[:limit] + f"\u2026 [clipped: {len(value) - limit:,} more characters{whole}]"
    if isinstance(value, dict):
        return {k: clip_strings(v, limit, where=where) for k, v in value.items()}
    if isinstance(value, list):
        return [clip_strings(v, limit, where=where) for v in value]
    return value


def _leading_prompt(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages before the first answer of a sample (its prompt, as the workflow received it)."""
    lead = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "developer"):
            break
        lead.append(message)
    return lead


def _is_live(path: Path) -> bool:
    """Whether another process holds the run folder's lock (``.osmosis.lock``) right now."""
    try:
        fd = os.open(path / ".osmosis.lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _dataset_rows(meta: dict[str, Any]) -> dict[int, tuple[list[dict[str, Any]], Any]] | None:
    """Row index -> (prompt, label) from the run's dataset, when it is still the file the run read."""
    name = meta.get("dataset")
    if not isinstance(name, str) or not meta.get("dataset_sha256"):
        return None
    path = Path(name)
    try:
        if not path.is_file() or fingerprint(path) != meta["dataset_sha256"]:
            return None
        rows = read_dataset(path, limit=meta.get("rows") if isinstance(meta.get("rows"), int) else None)
    except (OSError, OsmosisError, ValueError):
        return None
    return {row.index: (row.prompt, row.label) for row in rows}


_PROMPT_IDS = b'"prompt_token_ids"'
_VERSION = b'"policy_version"'
_LIST = re.compile(rb"\s*:\s*(null|\[)")
_COMPLETION = re.compile(rb'\s*,\s*"completion_token_ids"\s*:\s*(null|\[)')
_STRING = re.compile(rb'\s*:\s*(null|"(?:[^"\\]|\\.)*")')
"""What follows a key in a trace line: an id list (or null); after the prompt's list, the completion's;
a version (a string or null)."""


def _id_count(raw: bytes, value: re.Match[bytes]) -> tuple[int, int]:
    """(length, where it ends) of the id list (or null: 0) ``value`` opened, counted without parsing it."""
    if value.group(1) == b"null":
        return 0, value.end()
    end = raw.index(b"]", value.end())
    body = raw[value.end() : end]
    return (body.count(b",") + 1 if body.strip() else 0), end + 1


def _calls(raw: bytes, at: int) -> list[tuple[int, int, Any]]:
    """(prompt ids, completion ids, policy version) of each call of a trace line from ``at`` (its
    ``"calls"``), in one pass: the id lists are counted, not parsed (a trace holds every token id of
    every call: parsing them all would take most of a report's time), relying on the order the gateway
    writes a call's keys in (its version before its prompt ids, the completion ids right after them).

    :raises ValueError: a line in another order, or whose request holds a key of the same name (it is
        then parsed whole)."""
    calls = []
    version_at, more = -1, True  # (where the next version is; False: the line holds no more)
    while (prompt_at := raw.find(_PROMPT_IDS, at)) >= 0:
        if more and version_at < at:  # searched from this call on: never through an earlier call's ids
            version_at = raw.find(_VERSION, at)
            more = version_at >= 0
        version = None
        if more and version_at < prompt_at:
            value = _STRING.match(raw, version_at + len(_VERSION))
            if value is None:
                raise ValueError("a policy_version that is neither a string nor null")
            version = json.loads(value.group(1))
            if raw.find(_VERSION, value.end(), prompt_at) >= 0:
                raise ValueError("two policy versions before a call's prompt ids")
            version_at = -1
        opened = _LIST.match(raw, prompt_at + len(_PROMPT_IDS))
        if opened is None:
            raise ValueError("prompt_token_ids holds neither a list nor null")
        prompt, end = _id_count(raw, opened)
        opened = _COMPLETION.match(raw, end)
        if opened is None:
            raise ValueError("prompt_token_ids not followed by completion_token_ids")
        completion, at = _id_count(raw, opened)
        calls.append((prompt, completion, version))
    return calls


def _version(value: Any) -> str | None:
    """A policy version as the report keys it: a string (a number written as one), else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    return None


def _trace_tokens(raw: bytes) -> tuple[str, Tokens]:
    """(rollout id, token counts and call versions) of one ``traces.jsonl`` line, read by :func:`_calls`;
    a line that shortcut cannot follow is parsed whole."""
    try:
        at = raw.index(b'"calls"')
        meta = json.loads(raw[:at].rstrip().rstrip(b",") + b"}")
        if not isinstance(meta, dict) or "rollout_id" not in meta:
            raise ValueError("not in the usual order")
        found = _calls(raw, at)
        calls = [(p, c) for p, c, _ in found]
        versions = tuple(_version(v) for _, _, v in found)
    except ValueError:
        meta = json.loads(raw)
        whole = [call for call in meta.get("calls") or () if isinstance(call, dict)]
        calls = [
            (len(call.get("prompt_token_ids") or ()), len(call.get("completion_token_ids") or ())) for call in whole
        ]
        versions = tuple(_version(call.get("policy_version")) for call in whole)
    if not any(v is not None for v in versions):
        versions = _NO_CALLS
    tokens = Tokens(
        len(calls),
        sum(p for p, _ in calls),
        sum(g for _, g in calls),
        bool(meta.get("complete", True)),
        calls,
        versions,
    )
    return str(meta["rollout_id"]), tokens


def _read_traces(path: Path, damaged: list[str]) -> dict[str, Tokens]:
    """Token counts per rollout id from ``traces.jsonl`` (absent: none)."""
    found: dict[str, Tokens] = {}
    if not path.is_file():
        return found
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n") or not raw.strip():
                continue
            try:
                rollout_id, tokens = _trace_tokens(raw)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                damaged.append(f"{path}:{number}: not a trace line ({type(exc).__name__}: {exc})")
                continue
            found[rollout_id] = tokens
    return found


def load_run(path: Path | str, *, on_lines: Callable[[int, int], None] | None = None) -> RunData:
    """Read a run folder (see the module's docstring).

    :param on_lines: called now and then with the lines of ``results.jsonl`` read and their total
        (a progress bar).
    :raises OsmosisError: the folder holds no ``results.jsonl`` and no ``run.json``.
    """
    path = Path(path)
    results = path / "results.jsonl"
    meta = _read_json(path / "run.json")
    if not results.is_file() and not meta:
        raise OsmosisError(f"{path} is not a run folder (it holds no results.jsonl and no run.json)")
    live = _is_live(path)
    config = _read_toml(path / "config.toml")
    written = _read_json(path / "summary.json")
    threshold = config.get("run", {}).get("pass_threshold", written.get("pass_threshold", 1.0))
    threshold = float(threshold) if isinstance(threshold, (int, float)) else 1.0
    damaged: list[str] = []
    by_id = meta.get("kind") == "serve"  # a server records each rollout id once; its rows repeat (see the module)
    attempts: Counter[Hashable] = Counter()
    total = _count_lines(results)
    latest: dict[Hashable, tuple[RolloutRecord, LineOutcome]] = {}
    odd: dict[Hashable, tuple[int, list[str]]] = {}
    """(line number, its NaN and infinite numbers) of each rollout whose latest line holds some."""
    first_seen: dict[str, int] = {}
    """The line each policy version first appears on (the training order's tie-break)."""
    for read, (number, line) in enumerate(scan_results(results, repair=False, damaged=damaged), start=1):
        named = line.get("rollout_id")
        key: Hashable = str(named) if by_id and named else (line["row"], line["sample_index"])
        if on_lines is not None and read % 500 == 0:
            on_lines(read, total)
        found: list[str] = []
        line = _finite(line, f"{results}:{number}", found)
        try:
            outcome = summary_fields(line)
        except ValueError as exc:  # as the core's summary reads it: a damaged line, said and skipped
            damaged.append(f"{results}:{number}: not a result line ({exc})")
            continue  # (no attempt of its rollout either)
        attempts[key] += 1
        rollout = _rollout(line, f"{results}:{number}", found)
        latest[key] = rollout, outcome
        if rollout.version is not None:
            first_seen.setdefault(rollout.version, number)
        if found:
            odd[key] = (number, found)
        else:
            odd.pop(key, None)  # a later record of the rollout counts, not the earlier one
    nonfinite = [problem for _, found in sorted(odd.values()) for problem in found]
    size = results.stat().st_size if results.exists() else 0
    if on_lines is not None:
        on_lines(total, total)
    traces = _read_traces(path / "traces.jsonl", damaged)
    for key, (rollout, _) in latest.items():
        rollout.attempts = attempts[key]
        rollout.tokens = traces.get(rollout.rollout_id)
        if rollout.version is None and rollout.call_versions:  # the line names none: its calls do
            rollout.version = next(v for v in rollout.call_versions if v is not None)
            first_seen.setdefault(rollout.version, total + 1)
    present = {rollout.version for rollout, _ in latest.values()}
    versions = training_order({v: n for v, n in first_seen.items() if v in present})
    rank: dict[str | None, int] = {version: position for position, version in enumerate(versions)}
    from_dataset = _dataset_rows(meta)
    stats = ResultStats(pass_threshold=threshold)
    rows: dict[int, Row] = {}
    if from_dataset is not None and not versions:
        for index, (messages, answer) in from_dataset.items():
            rows[index] = Row(index, messages, answer)
    groups: dict[tuple[int, int], int] = {}
    """(version's rank, row) -> the report's row index, when the run has versions."""
    cancelled = 0
    ordered = sorted(
        latest.values(),
        key=lambda item: (rank.get(item[0].version, len(rank)), item[0].row, item[0].sample, item[0].rollout_id),
    )
    for rollout, fields in ordered:
        if rollout.status == "cancelled":
            cancelled += 1  # not counted, as the core's summary does not count it (--resume runs it again)
        else:
            stats.add(fields)
        rollout.passed = (
            rollout.ok and rollout.reward is not None and rollout.reward >= threshold
            if rollout.graded and rollout.status != "cancelled"
            else None
        )
        named = rollout.row
        if versions:  # a training run: one row per (version, row), in training order
            rollout.source_row = named
            rollout.row = groups.setdefault((rank.get(rollout.version, len(rank)), named), len(groups))
        row = rows.get(rollout.row)
        if row is None:
            prompt: list[dict[str, Any]] | None = None
            label: Any = None
            if from_dataset is not None and named in from_dataset:
                prompt, label = from_dataset[named]
            else:
                prompt = _leading_prompt(rollout.first_messages or []) or None
            row = rows[rollout.row] = Row(
                rollout.row, prompt, label, version=rollout.version, source_row=rollout.source_row
            )
        elif row.prompt is None and rollout.first_messages:
            row.prompt = _leading_prompt(rollout.first_messages) or None
        rollout.first_messages = None
        row.rollouts.append(rollout)
    n_rows: int = meta["rows"] if isinstance(meta.get("rows"), int) else len(rows)
    n_samples: int = meta["n_samples"] if isinstance(meta.get("n_samples"), int) else 1
    if meta.get("kind") == "serve":  # a server's rows are whatever its requests named
        n_rows, n_samples = len(rows), max((len(r.rollouts) for r in rows.values()), default=1)
    summary = Summary.from_stats(
        stats,
        rows=n_rows,
        n_samples=n_samples,
        wall_sec=float(written.get("wall_sec") or _span(latest.values())),
        interrupted=bool(written.get("interrupted")) if written and not live else live,
        stub_policy=bool(meta.get("stub_policy")),
    )
    return RunData(
        path=path,
        meta=meta,
        config=config,
        summary=summary,
        rows=dict(sorted(rows.items())),
        damaged=damaged,
        nonfinite=nonfinite,
        pass_threshold=threshold,
        prompt_source="dataset" if from_dataset is not None else "samples",
        live=live,
        traces=bool(traces),
        cancelled=cancelled,
        read_bytes=size,
        versions=versions,
    )


def _count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open("rb") as handle:
        return sum(block.count(b"\n") for block in iter(lambda: handle.read(1 << 20), b""))


def _span(latest: Any) -> float:
    times = [r.finished_at for r, _ in latest if r.finished_at is not None]
    return (max(times) - min(times)) if len(times) > 1 else 0.0


def _spelled(value: Any) -> str:
    return str(finite_json(value))


def _finite(line: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """``line`` with its NaN and infinite numbers dealt with as the module says (each one listed in
    ``problems`` as ``where: field is NaN``); the sample's are left to :func:`_rollout`."""
    reward, timings, finished = line.get("reward"), line.get("timings"), line.get("finished_at")
    metrics = line.get("metrics")
    bad_reward = isinstance(reward, float) and not math.isfinite(reward)
    bad_timings = isinstance(timings, dict) and any(
        isinstance(v, float) and not math.isfinite(v) for v in timings.values()
    )
    bad_time = isinstance(finished, float) and not math.isfinite(finished)
    bad_metrics = nonfinite_paths(metrics, "metrics") if isinstance(metrics, dict) else []
    if not (bad_reward or bad_timings or bad_time or bad_metrics):
        return line
    line = dict(line)
    if bad_reward:
        spelled = _spelled(reward)
        if line.get("status") == "success":
            line["status"] = "failure"
            line["error"] = {"category": "validation_error", "message": f"the reward is {spelled} ({where})"}
            problems.append(f"{where}: reward is {spelled}: counted as a failed rollout (validation_error)")
        else:
            problems.append(f"{where}: reward is {spelled}: left out")
        line["reward"] = None
    if bad_timings:
        assert isinstance(timings, dict)
        for key, value in timings.items():
            if isinstance(value, float) and not math.isfinite(value):
                problems.append(f"{where}: timings.{key} is {_spelled(value)}: left out")
        line["timings"] = {k: v for k, v in timings.items() if not (isinstance(v, float) and not math.isfinite(v))}
    if bad_time:
        problems.append(f"{where}: finished_at is {_spelled(finished)}: left out")
        line["finished_at"] = None
    if bad_metrics:
        problems.extend(f"{where}: {path} is {_spelled(value)}" for path, value in bad_metrics)
        line["metrics"] = finite_json(metrics)
    return line


def _rollout(line: dict[str, Any], where: str = "", problems: list[str] | None = None) -> RolloutRecord:
    """The :class:`RolloutRecord` of one (finite, see :func:`_finite`) line; a NaN or infinite number in its
    sample is listed in ``problems`` and kept in the trajectory, spelled as a string."""
    error = line.get("error") if isinstance(line.get("error"), dict) else None
    sample = line.get("sample") if isinstance(line.get("sample"), dict) else None
    reward = line.get("reward")
    reward = float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None
    timings = {
        str(k): float(v)
        for k, v in (line.get("timings") or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    metrics = line.get("metrics") if isinstance(line.get("metrics"), dict) else {}
    finished_at = line.get("finished_at")
    trajectory = None
    first: list[dict[str, Any]] | None = None
    if sample is not None:
        readable = sample.get("chat_messages")
        messages = readable if isinstance(readable, list) else sample.get("messages")
        messages = messages if isinstance(messages, list) else []
        first = [m for m in messages[:4] if isinstance(m, dict)]
        body = {"messages": messages, "system_prompt": sample.get("system_prompt")}
        if isinstance(readable, list):
            body["native"] = len(sample.get("messages") or [])
        try:
            trajectory = json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False)
        except ValueError:  # a NaN or infinity (a strict JSON line has none): named, and spelled as a string
            if problems is not None:
                found = nonfinite_paths(sample, "sample")
                problems.extend(f"{where}: {path} is {_spelled(value)}" for path, value in found)
            body = finite_json(body)
            trajectory = json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=str)
        if len(trajectory) > MAX_STRING:  # (else no string in it can be longer than the limit)
            clipped = clip_strings(body, where=where)
            trajectory = json.dumps(clipped, ensure_ascii=False, separators=(",", ":"), default=str)
    return RolloutRecord(
        row=line["row"],
        sample=line["sample_index"],
        rollout_id=str(line.get("rollout_id", "")),
        status=str(line["status"]),
        stage=str(line.get("stage", "")),
        category=str(error.get("category")) if error and error.get("category") is not None else None,
        message=str(error.get("message"))[:2000] if error and error.get("message") is not None else None,
        reward=reward,
        timings=timings,
        finished_at=float(finished_at) if isinstance(finished_at, (int, float)) else None,
        metrics=clip_strings(metrics, 2000),
        grader_metrics=[str(k) for k in graders] if isinstance(graders := line.get("grader_metrics"), list) else None,
        attempts=1,
        trajectory=trajectory,
        first_messages=first,
        version=_version(line.get("policy_version")),
    )


def __getattr__(name: str) -> Any:
    if name == "Rollout":  # renamed for its role (CHANGELOG 0.2.0)
        from osmosis_core.plugin import warn_deprecated

        warn_deprecated("osmosis_report.load.Rollout", "osmosis_report.load.RolloutRecord", "0.2.0")
        return RolloutRecord
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
