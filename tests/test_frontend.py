"""``osmosis_core.frontend``: the module docstring's example runs, and ``RunFiles`` keeps a run
folder as ``osmosis run`` does (one holder, every line flushed, no secret)."""

from __future__ import annotations

import json
import re

import pytest

import osmosis_core.frontend
from osmosis_core import ErrorCategory, ErrorInfo, ExecutionResult, ExecutionStage, ExecutionStatus, OsmosisError
from osmosis_core.frontend import RunFiles
from osmosis_core.testing import ScriptedPolicyServer


def test_the_module_example_runs_a_prompt_and_keeps_its_result(workspace, monkeypatch):
    example = re.search(r"::\n\n(.*?)\n\n(?=\S)", osmosis_core.frontend.__doc__, re.S).group(1)
    monkeypatch.chdir(workspace)
    with ScriptedPolicyServer() as server:
        exec(compile(re.sub(r"(?m)^    ", "", example), "frontend-example", "exec"), {"url": server.url})
    (line,) = [json.loads(x) for x in (workspace / "runs" / "once" / "results.jsonl").read_text().splitlines()]
    assert line["rollout_id"] == "r-0"
    assert line["status"] == "success"
    assert line["reward"] == 1.0


def _failure(rollout_id: str, message: str) -> ExecutionResult:
    return ExecutionResult(
        rollout_id,
        ExecutionStage.WORKFLOW,
        ExecutionStatus.FAILURE,
        error=ErrorInfo(ErrorCategory.AGENT_ERROR, message),
    )


def test_run_files_hold_the_folder_and_redact_every_secret(tmp_path):
    token = "tok-Zq81x-Pp0"
    with RunFiles(tmp_path / "run", secrets=[token]) as files:
        with pytest.raises(OsmosisError, match="in use by another osmosis process"):
            RunFiles(tmp_path / "run").open()  # a second holder (flock: per open file, as another process)
        files.write_result(3, 1, _failure("r-1", f"the server said {token}"))
        files.write_trace(3, 1, "r-1", {"calls": [{"note": token}]})
        assert files.is_open
    assert not files.is_open
    text = (tmp_path / "run" / "results.jsonl").read_text()
    assert token not in text
    assert json.loads(text)["row"] == 3
    assert token not in (tmp_path / "run" / "traces.jsonl").read_text()
    with RunFiles(tmp_path / "run") as again:  # released: the folder can be taken again
        again.write_result(4, 0, _failure("r-2", "x"))
    assert len((tmp_path / "run" / "results.jsonl").read_text().splitlines()) == 2


def test_run_files_refuse_a_line_before_open(tmp_path):
    with pytest.raises(RuntimeError, match="open"):
        RunFiles(tmp_path).write_result(0, 0, _failure("r", "x"))
