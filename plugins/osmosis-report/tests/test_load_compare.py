"""Reading run folders (damaged lines, NaN, retries, a live run, traces), the headline figures, and
matching the rows of runs with the baseline's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from report_helpers import clean_env, line, osmosis_exe, write_run

from osmosis_core.frontend import RunFiles
from osmosis_report.compare import compare, match_rows
from osmosis_report.load import load_run
from osmosis_report.render import build_report, run_figures


def test_a_damaged_line_is_named_as_file_and_line_and_the_rest_is_read(tmp_path):
    refused = json.dumps({**line(0, 0), "status": "oops"})  # a result line's keys, a status the core refuses
    lines = [line(0, 0), "{not json", json.dumps({"row": "x"}), refused, line(1, 0, reward=0.0)]
    run = write_run(tmp_path / "r", lines)
    data = load_run(run)
    results = run / "results.jsonl"
    assert [d.split(": ")[0] for d in data.damaged] == [f"{results}:2", f"{results}:3", f"{results}:4"]
    assert "not a result line" in data.damaged[2]
    assert data.summary.finished == 2
    assert data.summary.mean_reward == 0.5
    assert data.rows[0].rollouts[0].attempts == 1  # a damaged line is no attempt of its rollout


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
        "calls": [{"prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5]}] * 2,
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


def test_the_headline_figures_count_the_same_rollouts_a_failure_counting_as_zero(tmp_path):
    # one timeout in 20: the mean reward said 1.000 while the pass rate said 95%
    lines = [line(i, 0) for i in range(19)] + [line(19, 0, status="failure", category="timeout")]
    data = load_run(write_run(tmp_path / "r", lines, rows=20))
    figures = run_figures(data)
    assert data.summary.pass_rate == pytest.approx(0.95)
    assert data.summary.mean_reward == pytest.approx(0.95)
    assert figures["interval"].value == pytest.approx(0.95)
    assert figures["interval"].n == 20
    assert figures["pass_at_k"][0][1] == pytest.approx(0.95)
    # the mean over the graded rollouts stays, under its own name
    assert data.summary.mean_reward_graded == pytest.approx(1.0)
    assert figures["interval_graded"].value == pytest.approx(1.0)
    html = build_report([data.path], tmp_path / "r.html").path.read_text()
    assert re.search(r'data-kpi="mean-reward">0\.950<', html)
    assert re.search(r'data-kpi="mean-reward-graded">1\.000<', html)


def crashes_on(rows: set[int], n: int = 20, *, wrong: set[int] = frozenset()) -> list[dict]:
    return [
        line(i, 0, status="failure", category="timeout") if i in rows else line(i, 0, reward=0.0 if i in wrong else 1.0)
        for i in range(n)
    ]


def test_every_figure_of_a_delta_counts_the_same_rows(tmp_path):
    # the checkpoint crashes on 3 hard rows the baseline got wrong: its mean used to rise (17 rows)
    # while its pass rate fell (20 rows)
    base = load_run(write_run(tmp_path / "base", crashes_on(set(), wrong={0, 1, 2, 3}), rows=20))
    step = load_run(write_run(tmp_path / "step", crashes_on({0, 1, 2}, wrong={3, 4}), rows=20))
    [delta] = compare([base, step]).deltas
    assert delta.reward is not None
    assert delta.pass_rate is not None
    assert delta.reward.n == delta.pass_rate.n == 20
    assert len(delta.rows) == delta.reward_rows == 20
    assert delta.reward.value == pytest.approx(-0.05)  # 16/20 -> 15/20
    assert delta.pass_rate.value == pytest.approx(-0.05)
    assert delta.means == (pytest.approx(0.8), pytest.approx(0.75))
    assert delta.broke == [4]


def test_rows_are_matched_with_the_baseline_run_by_run(tmp_path):
    # one partial run used to cut a three-run comparison to the rows all three had
    base = load_run(write_run(tmp_path / "base", crashes_on(set()), rows=20))
    full = load_run(write_run(tmp_path / "full", crashes_on(set(), wrong={7}), rows=20))
    partial = load_run(write_run(tmp_path / "partial", crashes_on(set(), n=5), rows=20))
    comparison = compare([base, full, partial])
    full_delta, partial_delta = comparison.deltas
    assert full_delta.reward.n == full_delta.pass_rate.n == 20
    assert full_delta.reward.value == pytest.approx(-0.05)
    assert len(full_delta.matched) == len(full_delta.rows) == 20
    assert len(partial_delta.rows) == 5
    assert [m.index for m in partial_delta.mismatches] == list(range(5, 20))
    assert comparison.rows == list(range(20))
    html = build_report([base.path, full.path, partial.path], tmp_path / "three.html").path.read_text()
    assert re.findall(r'data-rows="(\d+)"', html) == ["20", "5"]
    assert "<li>rows 5\u201319: missing in run 3</li>" in html  # one line for the rows it lacks
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', html, re.S).group(1))
    assert len(data["rows"]) == 20  # every row stays in the table
    assert data["rows"][7]["r"][2] == []  # the partial run has no row 7


NAN_LINES = [
    '{"row": 0, "sample_index": 0, "rollout_id": "a", "status": "success", "stage": "grader", "error": null, '
    '"reward": 1.0, "metrics": {"accuracy": NaN, "turns": 2}, "timings": {"workflow": 0.5}, "finished_at": 5.0, '
    '"sample": {"messages": [{"role": "user", "content": "val1 = 0\\nval2 = 2"}, {"role": "assistant", '
    '"content": "#### 0", "logprob": -Infinity}], "system_prompt": null, "chat_messages": null}}',
    '{"row": 1, "sample_index": 0, "rollout_id": "b", "status": "success", "stage": "grader", "error": null, '
    '"reward": NaN, "metrics": {}, "timings": {"workflow": Infinity}, "finished_at": 6.0, "sample": null}',
]


def test_nan_and_infinity_in_results_are_shown_as_such_naming_file_line_and_field(tmp_path, workspace):
    # "Out of range float values are not JSON compliant", with no file, line or field, and no report
    run = write_run(tmp_path / "r", [*NAN_LINES, line(2, 0)])
    where = f"{run / 'results.jsonl'}"
    r = subprocess.run(
        [osmosis_exe(), "report", str(run), "-o", str(tmp_path / "nan.html")],
        cwd=workspace, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"not a finite number: {where}:1: metrics.accuracy is NaN" in r.stderr
    html = (tmp_path / "nan.html").read_text()
    assert 'data-nonfinite="4"' in html
    assert f"{where}:2: reward is NaN" in html
    assert "1 NaN or infinite value left out" in html  # the accuracy histogram says what it leaves out
    data = load_run(run)
    assert data.nonfinite == [
        f"{where}:1: metrics.accuracy is NaN",
        f"{where}:1: sample.messages[1].logprob is -Infinity",
        f"{where}:2: reward is NaN: counted as a failed rollout (validation_error)",
        f"{where}:2: timings.workflow is Infinity: left out",
    ]
    first, second = data.rows[0].rollouts[0], data.rows[1].rollouts[0]
    assert first.ok
    assert first.metrics == {"accuracy": "NaN", "turns": 2}
    assert (second.status, second.category) == ("failure", "validation_error")
    assert "the reward is NaN" in (second.message or "")
    assert data.summary.mean_reward == pytest.approx(2 / 3)
