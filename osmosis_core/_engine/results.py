"""The run folder's files: ``results.jsonl`` written line by line, and the summary of a run.

Each finished rollout is one line, appended and flushed as soon as it is known, so an interrupted
run keeps everything it finished and ``--resume`` can run exactly the missing (row, sample) pairs.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import attrs

from osmosis_core.errors import clip, holds_secret, redact_data
from osmosis_core.records import ErrorInfo, ExecutionResult, ExecutionStatus
from osmosis_core.wire import converter, structure_problems

if TYPE_CHECKING:
    from osmosis_core._engine.config import RunConfig

__all__ = [
    "LineOutcome",
    "ResultStats",
    "ResultWriter",
    "RunProgress",
    "Summary",
    "folder_progress",
    "json_ready",
    "latest_records",
    "percentile",
    "read_results",
    "scan_results",
    "summary_fields",
]


def scan_results(
    path: Path, *, repair: bool = True, damaged: list[str] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each line of an existing ``results.jsonl``, read as a stream.

    Only one line is held at a time (a results file can be hundreds of megabytes). A last line cut
    short by a crash is dropped and truncated from the file, so appending after it stays valid JSONL.

    :param repair: ``False`` reads without writing: a last line without its newline (one a live run
        is still writing) is skipped and the file left as it is.
    :param damaged: when given, a damaged line is described here (``file:line: why``) and skipped.
    :raises ValueError: a damaged line (not JSON, or without the keys of a result), naming it as
        ``file:line``, when ``damaged`` is not given.
    """
    if not path.exists():
        return
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size and repair:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":  # a last line cut short: find where it starts, cut it off
                keep = _last_newline(handle, size) + 1
                with path.open("r+b") as writable:
                    writable.truncate(keep)
        handle.seek(0)
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n"):
                break
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                problem = f"{path}:{number}: not a JSON line ({type(exc).__name__}: {exc})"
            else:
                missing = [
                    key for key in ("row", "sample_index", "status") if not isinstance(line, dict) or key not in line
                ]
                if not missing and isinstance(line["row"], int) and isinstance(line["sample_index"], int):
                    yield number, line
                    continue
                what = f"missing {', '.join(missing)}" if missing else "row and sample_index must be whole numbers"
                problem = f"{path}:{number}: not a result line ({what})"
            if damaged is None:
                raise ValueError(problem)
            damaged.append(problem)


def _last_newline(handle: IO[bytes], size: int) -> int:
    """The offset of the last newline of a file (-1 when there is none), read backwards in blocks (not
    mapped whole: a file of any size, on any filesystem, under any address-space limit)."""
    end = size
    while end > 0:
        start = max(0, end - (1 << 16))
        handle.seek(start)
        block = handle.read(end - start)
        at = block.rfind(b"\n")
        if at >= 0:
            return start + at
        end = start
    return -1


def read_results(path: Path) -> list[dict[str, Any]]:
    """Every line of an existing ``results.jsonl`` (see :func:`scan_results`, which does not hold them all)."""
    return [line for _, line in scan_results(path)]


@attrs.frozen
class LineOutcome:
    """How the rollout of one ``results.jsonl`` line ended: what ``--resume``, ``--retry-failed`` and
    the summary read of it (a few bytes: no sample). Read from a line by :func:`summary_fields`;
    made from the result itself as the line is written (:meth:`of`).

    >>> summary_fields({"row": 0, "sample_index": 0, "status": "failure", "reward": None,
    ...                 "error": {"category": "policy_error", "message": "HTTP 503"}, "timings": {"workflow": 0.5}})
    LineOutcome(status=<ExecutionStatus.FAILURE: 'failure'>, error=ErrorInfo(category=<ErrorCategory.POLICY_ERROR: \
'policy_error'>, message='HTTP 503'), reward=None, timings={'workflow': 0.5})
    """

    status: ExecutionStatus
    error: ErrorInfo | None = None
    reward: float | None = None
    timings: dict[str, float] = attrs.field(factory=dict)
    """The workflow's and the grader's seconds (what a rollout's latency adds up)."""

    def __getitem__(self, key: str) -> Any:
        """Deprecated: the dict :func:`summary_fields` returned before 0.2 (``outcome["status"]``)."""
        return self._old_form(key)

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated: the dict :func:`summary_fields` returned before 0.2 (``outcome.get("reward")``)."""
        return self._old_form(key, default)

    def _old_form(self, key: str, *default: Any) -> Any:
        from osmosis_core.deprecation import warn_deprecated

        warn_deprecated(f"summary_fields(line)[{key!r}]", f"summary_fields(line).{key}", "0.2.0", stacklevel=4)
        data: dict[str, Any] = converter.unstructure(self)
        return data.get(key, *default) if default else data[key]

    @classmethod
    def of(cls, result: ExecutionResult) -> LineOutcome:
        """The outcome of a final result, as its line will say it (the message whole: :class:`ResultStats`
        redacts it with the run's secrets before it cuts it)."""
        return cls(
            result.status,
            result.error,
            None if result.sample is None else result.sample.reward,
            _latency_parts(result.timings),
        )


def summary_fields(line: dict[str, Any]) -> LineOutcome:
    """What :class:`ResultStats` counts of a line (status, error, reward, timings), read through the
    records' converter (:mod:`osmosis_core.wire`); the message cut to :data:`MESSAGE_CHARS`.

    :raises ValueError: a line that says none of it validly (an unknown status or error category, a
        reward that is not a number), naming the field.
    """
    try:
        outcome = converter.structure(line, LineOutcome)
    except Exception as exc:
        raise ValueError("; ".join(structure_problems(exc, told=(ValueError,), expected=LineOutcome))) from None
    error, timings = outcome.error, _latency_parts(outcome.timings)
    if error is not None and (key := _message_key(error.message) or "") != error.message:
        outcome = attrs.evolve(outcome, error=ErrorInfo(error.category, key))
    return outcome if timings == outcome.timings else attrs.evolve(outcome, timings=timings)


def _latency_parts(timings: dict[str, float]) -> dict[str, float]:
    """The timings a rollout's latency adds up (the workflow's and the grader's)."""
    return {k: v for k, v in timings.items() if k in ("workflow", "grader")}


def latest_records(
    path: Path,
    keep: Callable[[dict[str, Any]], Any] = summary_fields,
    *,
    repair: bool = True,
    damaged: list[str] | None = None,
) -> dict[tuple[int, int], Any]:
    """The latest record of each (row, sample) pair in a results file, read as a stream.

    A pair run again (``--retry-failed``, a retried request) has several lines; the last one counts,
    for ``--resume``, the summary and the report alike. Only ``keep(line)`` is held per pair (by
    default its :class:`LineOutcome`, never a sample), so a results file of any size reads in little memory.

    :param repair: and ``damaged``: as :func:`scan_results` takes them; a line ``keep`` refuses
        (raising ``ValueError``) is a damaged one.
    """
    latest: dict[tuple[int, int], Any] = {}
    for number, line in scan_results(path, repair=repair, damaged=damaged):
        try:
            latest[(line["row"], line["sample_index"])] = keep(line)
        except ValueError as exc:
            problem = f"{path}:{number}: not a result line ({exc})"
            if damaged is None:
                raise ValueError(problem) from None
            damaged.append(problem)
    return latest


class ResultWriter:
    """Appends result lines to ``results.jsonl``, flushing each one to the OS at once.

    :param secrets: values no line may hold (the policy's key and header values). A line whose
        text holds one (raw, or as JSON writes it), or a run of 8 of its characters (see
        :func:`~osmosis_core.errors.redact`), has every string redacted before it is written, the
        sample's messages included; a line that holds none is written as encoded.
    """

    def __init__(self, path: Path, secrets: Iterable[str | None] = ()) -> None:
        self.path = path
        self._secrets = _usable(secrets)
        self._handle: IO[str] = path.open("a", encoding="utf-8")

    def write(self, line: dict[str, Any], secrets: Iterable[str | None] = ()) -> None:
        """Append one line and flush it; ``secrets`` are this line's own (a request's key), on top of the writer's."""
        own = self._secrets + _usable(secrets) if secrets else self._secrets
        text = _encode(line)
        if own and holds_secret(text, own):
            # redact the JSON form: a secret may sit in bytes, an exception, an object written as its
            # repr, or a key that is not a string (each a string only once encoded)
            text = _encode(redact_data(json.loads(text), own))
        self._handle.write(text + "\n")
        self._handle.flush()

    def close(self) -> None:
        """Flush to disk and close."""
        if not self._handle.closed:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()


def _usable(secrets: Iterable[str | None]) -> tuple[str, ...]:
    """The secrets, and each as JSON writes it when that differs (a quote, a backslash, a control character)."""
    usable = tuple(s for s in secrets if s and len(s) >= 4)
    return usable + tuple(e for s in usable if (e := json.dumps(s, ensure_ascii=False)[1:-1]) != s)


def _encode(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, default=_json_default)


def json_ready(value: Any) -> Any:
    """``value`` as a results line holds it: what JSON cannot hold becomes its repr (an attrs
    instance, its fields). :raises ValueError: a NaN or infinity."""
    return json.loads(_encode(value))


def _json_default(value: Any) -> Any:
    if attrs.has(type(value)):
        return attrs.asdict(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return repr(value)


MESSAGES_KEPT = 32
"""Distinct messages counted per error category (a run of millions of failures, each message its
own, holds no more); a message first seen after them is not counted."""
MESSAGE_CHARS = 200
"""The length an error message is cut to when it is counted (messages that differ past it count as one)."""


def _message_key(message: Any, secrets: tuple[str, ...] = ()) -> str | None:
    """An error message as the summary counts it: one line, redacted, cut to :data:`MESSAGE_CHARS`."""
    if not isinstance(message, str) or not message.strip():
        return None
    return clip(message, secrets, MESSAGE_CHARS)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ``values``, linearly interpolated; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@attrs.define
class ResultStats:
    """Running totals of a run: no samples, only a reward and a latency per rollout (a few bytes each)."""

    pass_threshold: float = 1.0
    finished: int = 0
    succeeded: int = 0
    rewards: list[float] = attrs.field(factory=list)
    passed: int = 0
    ungraded: int = 0
    """Successful rollouts without a reward (no grader, or a row without a label)."""
    errors: Counter[str] = attrs.field(factory=Counter)
    latencies: list[float] = attrs.field(factory=list)
    error_messages: dict[str, Counter[str]] = attrs.field(factory=dict)
    """Per error category, how often each message came (the first :data:`MESSAGES_KEPT` distinct
    ones of a category; each message redacted and cut to :data:`MESSAGE_CHARS`)."""
    secrets: tuple[str, ...] = attrs.field(default=(), repr=False)
    """Values no counted message may hold (the policy's key and header values)."""

    def add(self, outcome: LineOutcome | dict[str, Any]) -> None:
        """Count one rollout's outcome (or a result line, read with :func:`summary_fields`).

        :raises ValueError: a line that is not a valid one.
        """
        if not isinstance(outcome, LineOutcome):
            outcome = summary_fields(outcome)
        self.finished += 1
        if outcome.status is ExecutionStatus.SUCCESS:
            self.succeeded += 1
            if outcome.reward is None:
                self.ungraded += 1
            else:
                self.rewards.append(outcome.reward)
                self.passed += outcome.reward >= self.pass_threshold
        else:
            category = "unknown" if outcome.error is None else outcome.error.category.value
            self.errors[category] += 1
            message = None if outcome.error is None else _message_key(outcome.error.message, self.secrets)
            if message is not None:
                seen = self.error_messages.setdefault(category, Counter())
                if message in seen or len(seen) < MESSAGES_KEPT:
                    seen[message] += 1
        self.latencies.append(outcome.timings.get("workflow", 0.0) + outcome.timings.get("grader", 0.0))

    @property
    def failed(self) -> int:
        """Rollouts that ended in a failure."""
        return self.finished - self.succeeded

    def common_errors(self) -> dict[str, dict[str, Any]]:
        """The most common message of each error category: ``{category: {"message": ..., "count": n}}``."""
        top = {category: seen.most_common(1)[0] for category, seen in sorted(self.error_messages.items())}
        return {category: {"message": message, "count": count} for category, (message, count) in top.items()}

    @property
    def graded(self) -> int:
        """Rollouts that count for the pass rate and the mean reward: every finished one but the
        ungraded (a failure counts, as reward 0 and not passing)."""
        return self.finished - self.ungraded

    @property
    def mean_reward(self) -> float | None:
        """:attr:`Summary.mean_reward`; None while no rollout has a reward."""
        return sum(self.rewards) / self.graded if self.rewards else None

    @property
    def mean_reward_graded(self) -> float | None:
        """Mean reward over the rollouts that have one (the successful, rewarded ones): failures left out."""
        return sum(self.rewards) / len(self.rewards) if self.rewards else None


@attrs.frozen
class Summary:
    """What ``summary.json`` holds and the summary table shows."""

    rows: int
    n_samples: int
    expected: int
    finished: int
    succeeded: int
    failed: int
    ungraded: int
    mean_reward: float | None
    """Over the graded rollouts, a failed one counting as 0 (the rollouts ``pass_rate`` counts)."""
    pass_rate: float | None
    pass_threshold: float
    errors_by_category: dict[str, int]
    latency_p50_sec: float | None
    latency_p95_sec: float | None
    wall_sec: float
    interrupted: bool
    stub_policy: bool
    mean_reward_graded: float | None = None
    """Over the rollouts that have a reward, failures left out (what ``mean_reward`` meant before 0.2)."""
    error_messages: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    """The most common message of each error category and how many failures had it:
    ``{"policy_error": {"message": "...", "count": 18}}`` (redacted, one line each)."""

    @classmethod
    def from_stats(
        cls,
        stats: ResultStats,
        *,
        rows: int,
        n_samples: int,
        wall_sec: float,
        interrupted: bool,
        stub_policy: bool,
    ) -> Summary:
        """Freeze running totals into a summary."""
        return cls(
            rows=rows,
            n_samples=n_samples,
            expected=rows * n_samples,
            finished=stats.finished,
            succeeded=stats.succeeded,
            failed=stats.failed,
            ungraded=stats.ungraded,
            mean_reward=stats.mean_reward,
            mean_reward_graded=stats.mean_reward_graded,
            pass_rate=(stats.passed / stats.graded) if stats.rewards else None,
            pass_threshold=stats.pass_threshold,
            errors_by_category=dict(sorted(stats.errors.items())),
            latency_p50_sec=percentile(stats.latencies, 0.5),
            latency_p95_sec=percentile(stats.latencies, 0.95),
            wall_sec=wall_sec,
            interrupted=interrupted,
            stub_policy=stub_policy,
            error_messages=stats.common_errors(),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)


@attrs.frozen
class RunProgress:
    """How a run (or a server) is going: what the ``osmosis_run_progress`` hook receives.

    ``summary`` counts the latest result of each (row, sample) finished so far; ``final`` is True
    once, when the run has ended (completed, interrupted or stopped: ``summary.interrupted`` says).
    """

    run_dir: Path
    summary: Summary
    final: bool
    kind: Literal["run", "serve"] = "run"
    config: RunConfig | None = None
    """The run's resolved config (plugins read their own table from it, e.g. ``config.report``)."""


def folder_progress(
    run_dir: Path, *, final: bool, kind: Literal["run", "serve"] = "serve", config: RunConfig | None = None
) -> RunProgress:
    """How a run folder stands, read from its ``results.jsonl`` (what ``osmosis serve`` tells the
    ``osmosis_run_progress`` hooks: a server has no dataset, so each row it saw counts once)."""
    stats = ResultStats(pass_threshold=config.run.pass_threshold if config is not None else 1.0)
    latest = latest_records(Path(run_dir) / "results.jsonl", repair=False, damaged=[])
    for outcome in latest.values():
        if outcome.status is not ExecutionStatus.CANCELLED:
            stats.add(outcome)
    rows = len({row for row, _ in latest})
    summary = Summary.from_stats(stats, rows=rows, n_samples=1, wall_sec=0.0, interrupted=False, stub_policy=False)
    return RunProgress(Path(run_dir), summary, final, kind, config)
