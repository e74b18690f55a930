"""The run folder's files: ``results.jsonl`` written line by line, and the summary of a run.

Each finished rollout is one line, appended and flushed as soon as it is known, so an interrupted
run keeps everything it finished and ``--resume`` can run exactly the missing (row, sample) pairs.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import IO, Any

import attrs

from osmosis_core.records import ExecutionResult, ExecutionStatus

__all__ = ["ResultStats", "ResultWriter", "Summary", "read_results", "result_line"]


def result_line(row: int, sample_index: int, result: ExecutionResult) -> dict[str, Any]:
    """The ``results.jsonl`` record of one finished rollout."""
    sample = result.sample
    return {
        "row": row,
        "sample_index": sample_index,
        "rollout_id": result.rollout_id,
        "status": result.status.value,
        "stage": result.stage.value,
        "error": None
        if result.error is None
        else {
            "category": result.error.category.value,
            "message": result.error.message,
        },
        "reward": sample.reward if sample is not None else None,
        "metrics": sample.metrics if sample is not None else {},
        "timings": {k: round(v, 6) for k, v in result.timings.items()},
        "sample": None
        if sample is None
        else {
            "messages": sample.messages,
            "system_prompt": sample.system_prompt,
            "chat_messages": sample.chat_messages,
        },
    }


def read_results(path: Path) -> list[dict[str, Any]]:
    """The lines of an existing ``results.jsonl``.

    A last line cut short by a crash is dropped and truncated from the file, so appending after
    it stays valid JSONL.
    """
    if not path.exists():
        return []
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with path.open("r+b") as handle:
            handle.truncate(keep)
    lines = []
    for number, raw in enumerate(data[:keep].splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            lines.append(json.loads(raw))
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from None
    return lines


class ResultWriter:
    """Appends result lines to ``results.jsonl``, flushing each one to the OS at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] = path.open("a", encoding="utf-8")

    def write(self, line: dict[str, Any]) -> None:
        """Append one line and flush it."""
        self._handle.write(json.dumps(line, ensure_ascii=False, allow_nan=False, default=_json_default) + "\n")
        self._handle.flush()

    def close(self) -> None:
        """Flush to disk and close."""
        if not self._handle.closed:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()


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
        if line.get("status") == ExecutionStatus.SUCCESS.value and isinstance(reward, (int, float)):
            self.rewards.append(float(reward))
            if reward >= self.pass_threshold:
                self.passed += 1
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
            mean_reward=stats.mean_reward,
            pass_rate=(stats.passed / stats.finished) if stats.finished and rewarded else None,
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
