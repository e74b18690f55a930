"""Reading run folders (damaged lines, retries, a live run, traces) and matching the rows of two runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from osmosis_core.frontend import RunFiles
from osmosis_report.compare import compare, match_rows
from osmosis_report.load import load_run


def line(row, sample, *, status="success", reward=1.0, category=None, prompt=None, rollout_id=None, t=None):
    messages = [
        {"role": "user", "content": prompt or f"val1 = {row}\nval2 = 2"},
        {"role": "assistant", "content": "#### 2"},
    ]
    return {
        "row": row,
        "sample_index": sample,
        "rollout_id": rollout_id or f"x-{row}-{sample}",
        "status": status,
        "stage": "grader" if status == "success" else "workflow",
        "error": None
        if status == "success"
        else {"category": category or "agent_error", "message": "boom (at main.py:3 in run)"},
        "reward": reward if status == "success" else None,
        "metrics": {},
        "timings": {"workflow": 0.5, "grader": 0.1},
        "finished_at": t,
        "sample": {"messages": messages, "system_prompt": None, "chat_messages": None},
    }


def write_run(folder: Path, lines, *, rows=3, n_samples=1, raw_tail: bytes = b"") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps({"rows": rows, "n_samples": n_samples, "dataset": None}))
    with (folder / "results.jsonl").open("wb") as handle:
        for item in lines:
            handle.write((item if isinstance(item, str) else json.dumps(item)).encode() + b"\n")
        handle.write(raw_tail)
    return folder


def test_a_damaged_line_is_named_as_file_and_line_and_the_rest_is_read(tmp_path):
    run = write_run(tmp_path / "r", [line(0, 0), "{not json", json.dumps({"row": "x"}), line(1, 0, reward=0.0)])
    data = load_run(run)
    assert [d.split(": ")[0] for d in data.damaged] == [f"{run / 'results.jsonl'}:2", f"{run / 'results.jsonl'}:3"]
    assert data.summary.finished == 2
    assert data.summary.mean_reward == 0.5


def test_the_latest_record_of_a_retried_pair_counts_as_in_the_core_summary(tmp_path):
    run = write_run(
        tmp_path / "r",
        [line(0, 0, status="failure", category="policy_error"), line(1, 0), line(0, 0, reward=1.0)],
        rows=2,
    )
    data = load_run(run)
    [first] = data.rows[0].rollouts
    assert first.ok
    assert first.attempts == 2
    assert data.summary.failed == 0
    assert data.summary.finished == 2
    assert data.summary.errors_by_category == {}


def test_a_live_run_is_read_without_touching_its_file_and_says_it_is_partial(tmp_path):
    half = json.dumps(line(2, 0))[:40].encode()  # the line the run is writing right now
    run = write_run(tmp_path / "r", [line(0, 0), line(1, 0)], raw_tail=half)
    before = (run / "results.jsonl").read_bytes()
    with RunFiles(run):
        data = load_run(run)
        assert data.live
        assert data.partial
    assert (run / "results.jsonl").read_bytes() == before  # not truncated: the writer appends to it
    assert data.summary.finished == 2
    assert data.summary.expected == 3
    assert not data.damaged
    assert not load_run(run).live


def test_traces_give_token_counts_and_their_absence_is_fine(tmp_path):
    run = write_run(tmp_path / "r", [line(0, 0, rollout_id="a"), line(1, 0, rollout_id="b")])
    assert not load_run(run).traces
    trace = {
        "rollout_id": "a",
        "complete": True,
        "calls": [{"prompt_token_ids": [1, 2, 3], "generated_token_ids": [4, 5]}] * 2,
    }
    (run / "traces.jsonl").write_text(json.dumps(trace) + "\n" + "{broken\n")
    data = load_run(run)
    tokens = data.rows[0].rollouts[0].tokens
    assert tokens is not None
    assert (tokens.calls, tokens.prompt, tokens.generated) == (2, 6, 4)
    assert data.rows[1].rollouts[0].tokens is None
    assert any("traces.jsonl:2" in d for d in data.damaged)


def test_rows_match_by_position_and_prompt_hash_and_a_mismatch_is_reported(tmp_path):
    a = load_run(write_run(tmp_path / "a", [line(0, 0), line(1, 0), line(2, 0, reward=0.0)]))
    b = load_run(
        write_run(
            tmp_path / "b",
            [line(0, 0, reward=0.0), line(1, 0, prompt="something else"), line(2, 0), line(3, 0)],
            rows=4,
        )
    )
    matched, mismatches = match_rows([a, b])
    assert matched == [0, 2]
    assert [(m.index, m.reason) for m in mismatches] == [(1, "different prompts"), (3, "missing in run 1")]
    comparison = compare([a, b])
    [delta] = comparison.deltas
    assert delta.broke == [0]
    assert delta.fixed == [2]  # row 1 is never compared: its prompts differ
    assert delta.reward is not None
    assert delta.reward.value == pytest.approx(0.0)
    assert delta.reward.n == 2


def test_the_report_of_a_real_run_reads_prompts_from_its_dataset(run_a, tmp_path):
    data = load_run(run_a)
    assert data.prompt_source == "dataset"
    assert len(data.rows) == 21
    assert data.summary.errors_by_category == {"policy_error": 2, "validation_error": 2}
    broken = data.rows[2].rollouts[0]
    assert broken.category == "validation_error"
    assert "main.py" in (broken.message or "")
    # the dataset is gone: prompts come from the samples, and rows still match
    copy = tmp_path / "copy"
    shutil.copytree(run_a, copy)
    meta = json.loads((copy / "run.json").read_text())
    meta["dataset"] = str(tmp_path / "gone.jsonl")
    (copy / "run.json").write_text(json.dumps(meta))
    moved = load_run(copy)
    assert moved.prompt_source == "samples"
    assert moved.rows[5].hash == data.rows[5].hash


def test_the_plugin_writes_a_partial_report_during_a_run_and_no_more_often_than_it_can_afford(tmp_path):
    from osmosis_core.plugin import RunProgress
    from osmosis_report import plugin

    run = write_run(tmp_path / "r", [line(0, 0), line(1, 0)])
    summary = load_run(run).summary
    page = run / "report.html"
    with RunFiles(run):  # the run holds its folder while it goes
        plugin.osmosis_run_progress(RunProgress(run, summary, final=False))
        assert "the run is still going" in page.read_text()
        written = page.stat().st_mtime_ns
        plugin.osmosis_run_progress(RunProgress(run, summary, final=False))  # at once again: skipped
        assert page.stat().st_mtime_ns == written
    plugin.osmosis_run_progress(RunProgress(run, summary, final=True))  # the end is always written
    assert page.stat().st_mtime_ns != written
    assert "still going" not in page.read_text()
