"""The run folder's files: ``results.jsonl`` written line by line, and the summary of a run.

Each finished rollout is one line, appended and flushed as soon as it is known, so an interrupted
run keeps everything it finished and ``--resume`` can run exactly the missing (row, sample) pairs.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import attrs

from osmosis_core.errors import holds_secret, redact_data
from osmosis_core.records import ExecutionStatus

__all__ = ["ResultStats", "ResultWriter", "Summary", "json_ready", "read_results", "scan_results"]


def scan_results(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for each line of an existing ``results.jsonl``, read as a stream.

    Only one line is held at a time (a results file can be hundreds of megabytes). A last line cut
    short by a crash is dropped and truncated from the file, so appending after it stays valid JSONL.

    :raises ValueError: a damaged line (not JSON, or without the keys of a result), naming it as
        ``file:line``.
    """
    if not path.exists():
        return
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size:
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
                raise ValueError(f"{path}:{number}: not a JSON line ({type(exc).__name__}: {exc})") from None
            missing = [
                key for key in ("row", "sample_index", "status") if not isinstance(line, dict) or key not in line
            ]
            if missing or not isinstance(line["row"], int) or not isinstance(line["sample_index"], int):
                what = f"missing {', '.join(missing)}" if missing else "row and sample_index must be whole numbers"
                raise ValueError(f"{path}:{number}: not a result line ({what})")
            yield number, line


def _last_newline(handle: IO[bytes], size: int) -> int:
    """The offset of the last newline of a file (-1 when there is none), read backwards in blocks."""
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
            # redact the JSON form: a secret may sit in bytes, an exception or an object written as its repr
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
    return usable + tuple(e for s in usable if (e := _escaped(s)) != s)


def _encode(line: dict[str, Any]) -> str:
    return json.dumps(line, ensure_ascii=False, allow_nan=False, default=_json_default)


def json_ready(value: Any) -> Any:
    """``value`` as a results line holds it: what JSON cannot hold becomes its repr (an attrs
    instance, its fields). :raises ValueError: a NaN or infinity."""
    return json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False, default=_json_default))


def _escaped(secret: str) -> str:
    return json.dumps(secret, ensure_ascii=False)[1:-1]


def _json_default(value: Any) -> Any:
    if attrs.has(type(value)):
        return attrs.asdict(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return repr(value)


def _percentile(values: list[float], q: float) -> float | None:
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

    def add(self, line: dict[str, Any]) -> None:
        """Count one result line."""
        self.finished += 1
        if line.get("status") == ExecutionStatus.SUCCESS.value:
            self.succeeded += 1
        else:
            error = line.get("error") or {}
            self.errors[str(error.get("category", "unknown"))] += 1
        reward = line.get("reward")
        if line.get("status") == ExecutionStatus.SUCCESS.value:
            if isinstance(reward, (int, float)) and not isinstance(reward, bool):
                self.rewards.append(float(reward))
                if reward >= self.pass_threshold:
                    self.passed += 1
            else:
                self.ungraded += 1
        timings = line.get("timings") or {}
        self.latencies.append(float(timings.get("workflow", 0.0)) + float(timings.get("grader", 0.0)))

    @property
    def failed(self) -> int:
        """Rollouts that ended in a failure."""
        return self.finished - self.succeeded

    @property
    def mean_reward(self) -> float | None:
        """Mean reward over the successful, rewarded rollouts."""
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
    pass_rate: float | None
    pass_threshold: float
    errors_by_category: dict[str, int]
    latency_p50_sec: float | None
    latency_p95_sec: float | None
    wall_sec: float
    interrupted: bool
    stub_policy: bool

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
        rewarded = len(stats.rewards)
        return cls(
            rows=rows,
            n_samples=n_samples,
            expected=rows * n_samples,
            finished=stats.finished,
            succeeded=stats.succeeded,
            failed=stats.failed,
            ungraded=stats.ungraded,
            mean_reward=stats.mean_reward,
            pass_rate=(stats.passed / (stats.finished - stats.ungraded)) if rewarded else None,
            pass_threshold=stats.pass_threshold,
            errors_by_category=dict(sorted(stats.errors.items())),
            latency_p50_sec=_percentile(stats.latencies, 0.5),
            latency_p95_sec=_percentile(stats.latencies, 0.95),
            wall_sec=wall_sec,
            interrupted=interrupted,
            stub_policy=stub_policy,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)
