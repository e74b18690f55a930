"""A training run's report: reward by training step (the rollouts' policy versions), and off-policy calls."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from report_helpers import clean_env, line, osmosis_exe, serve_training_run, write_run

from osmosis_report.load import load_run
from osmosis_report.render import build_report
from osmosis_report.steps import bucketed, step_figures, training_order, version_number

SERVE = {"kind": "serve"}


def page_data(html: str) -> dict:
    return json.loads(re.search(r'id="report-data">(.*?)</script>', html, re.S).group(1))


def chart_titles(html: str, slug: str) -> list[str]:
    """The hover titles of the dots of one chart."""
    figure = re.search(rf'<figure class="chart" data-chart="{slug}">(.*?)</figure>', html, re.S)
    assert figure, f"no chart {slug}"
    return re.findall(r'<circle class="dot[^"]*"[^>]*><title>(.*?)</title>', figure.group(1))


def test_training_order_is_numeric_when_every_version_ends_in_a_number_else_first_appearance():
    assert training_order({"step-10": 1, "step-9": 2, "step-8": 3}) == ["step-8", "step-9", "step-10"]
    assert training_order({"10": 1, "9": 2, "0.5": 3}) == ["0.5", "9", "10"]
    # the same number twice (a restart that named its steps again): first appearance breaks the tie
    assert training_order({"resumed-3": 1, "step-3": 2, "step-1": 5}) == ["step-1", "resumed-3", "step-3"]
    # a version with no number: the order they came in, for every version
    assert training_order({"step-10": 1, "warmup": 2, "step-2": 3}) == ["step-10", "warmup", "step-2"]
    assert version_number("ckpt 7 ") == 7.0
    assert version_number("nan") is None
    assert version_number("v1.2") == 2.0
    # every number in turn, not only the last
    assert training_order({"e2-s1": 1, "e1-s2": 2, "e2-s2": 3, "e1-s1": 4}) == ["e1-s1", "e1-s2", "e2-s1", "e2-s2"]
    assert training_order({"v2.0": 1, "v2.1": 2, "v1.5": 3}) == ["v1.5", "v2.0", "v2.1"]


@pytest.mark.together
def test_a_training_run_served_by_osmosis_serve_shows_reward_by_step(tmp_path):
    # as a trainer drives osmosis serve: rows 0 and 1 of each step's batch, 2 samples each, named again
    # every step; the reward rises (all wrong, then half, then all right but one failed rollout), and one
    # rollout of step-9 has its later call served by step-10's weights
    plan = [("step-8", row, sample, "wrong", None) for row in (0, 1) for sample in (0, 1)]
    plan += [("step-9", 0, 0, "right", None), ("step-9", 0, 1, "right", "step-10")]
    plan += [("step-9", 1, sample, "wrong", None) for sample in (0, 1)]
    plan += [("step-10", 0, 0, "right", None), ("step-10", 0, 1, "right", None)]
    plan += [("step-10", 1, 0, "right", None), ("step-10", 1, 1, "broken", None)]
    run = serve_training_run(tmp_path, plan)

    data = load_run(run)
    assert data.versions == ["step-8", "step-9", "step-10"]  # not as strings sort ("step-10" first)
    assert len(data.rollouts) == 12  # every step's rollouts, though each step names rows 0 and 1 again
    assert [(row.version, row.source_row, len(row.rollouts)) for row in data.rows.values()] == [
        (v, r, 2) for v in data.versions for r in (0, 1)
    ]
    steps = step_figures(data)
    assert [s.version for s in steps] == data.versions
    assert [s.rollouts for s in steps] == [4, 4, 4]
    assert [s.mean_reward for s in steps] == [0.0, 0.5, 0.75]  # the failed rollout counts as 0
    assert [s.mean_reward_graded for s in steps] == [0.0, 0.5, 1.0]
    assert [s.pass_rate for s in steps] == [0.0, 0.5, 0.75]
    assert [s.failed for s in steps] == [0, 0, 1]
    assert [(s.off_policy, s.off_policy_calls) for s in steps] == [(0, 0), (1, 1), (0, 0)]
    [late] = [r for r in data.rollouts if r.off_policy]
    assert late.rollout_id == "step-9-g0-s1"
    assert late.call_versions == ("step-9", "step-10")
    # the traces' token counts: generated tokens too (the report read a key the traces never had: 0)
    assert all(r.tokens is not None and r.tokens.generated > 0 for r in data.rollouts if r.ok)
    assert all(s.mean_generated and s.mean_generated > 0 for s in steps)

    html = build_report([run], tmp_path / "report.html").path.read_text()
    titles = chart_titles(html, "r0-steps")
    assert "step-9: mean reward 0.500 (4 graded of 4 rollouts, 0 failed)" in titles
    assert "step-10: pass rate 0.750 (4 graded of 4 rollouts, 1 failed)" in titles
    assert len(titles) == 6  # a dot per step and series
    assert 'data-chart="r0-step-counts"' in html
    table = re.search(r'<table class="figures steps".*?</table>', html, re.S).group(0)
    assert re.findall(r'<tr data-step="([^"]+)">', table) == data.versions
    assert "0.750 [" in table  # the mean with its interval over the step's rows
    assert 'data-kpi="off-policy">1<' in html
    page = page_data(html)
    assert page["steps"] == data.versions
    assert [(row["v"], row["o"]) for row in page["rows"]][:3] == [("step-8", 0), ("step-8", 1), ("step-9", 0)]
    [off] = [ro for ro in page["rollouts"][0] if "cv" in ro]
    assert off["cv"] == ["step-9", "step-10"]

    r = subprocess.run(
        [osmosis_exe(), "report", str(run)], env=clean_env(), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "0.000 (step-8) -> 0.750 (step-10), 3 versions" in r.stdout
    assert re.search(r"off-policy rollouts\s*│\s*1 \(1 call\)", r.stdout)


def trace(rollout_id: str, versions: list[str | None], *, request: dict | None = None) -> dict:
    """A traces.jsonl line as the gateway writes it (keys in its order), one call per version."""
    calls = [
        {
            "call_id": f"{rollout_id}#{i}",
            "index": i,
            "status": "ok",
            "policy_version": version,
            "request": request or {"messages": []},
            "prompt_token_ids": [1, 2, 3] if i else None,
            "completion_token_ids": [4, 5],
            "logprobs": [-0.5, -0.5],
        }
        for i, version in enumerate(versions)
    ]
    return {"rollout_id": rollout_id, "row_index": 0, "sample_index": 0, "complete": True, "calls": calls}


def test_hand_written_results_give_the_steps_in_order_with_failures_as_zero(tmp_path):
    lines = [
        line(0, 0, reward=0.0, version="10", rollout_id="a"),
        line(0, 0, reward=1.0, version="2", rollout_id="b"),
        line(0, 1, status="failure", version="2", rollout_id="c"),
        line(1, 0, reward=0.5, version="1", rollout_id="d"),
        line(0, 0, reward=1.0, rollout_id="e"),  # a request without a version (an evaluation)
        line(1, 1, reward=1.0, version="10", rollout_id="f"),
    ]
    run = write_run(tmp_path / "r", lines, meta=SERVE)
    unnamed = trace("a", ["10", "10"])
    del unnamed["calls"][0]["policy_version"]  # (a gateway that wrote no version for that call)
    (run / "traces.jsonl").write_text(
        "".join(
            json.dumps(t) + "\n"
            for t in (
                unnamed,
                trace("b", ["2", "3", None]),  # its later call served by the next weights
                # a request that holds a key named as the trace's (the shortcut cannot follow: read whole)
                trace("f", ["9", "10"], request={"messages": [], "policy_version": "mine"}),
            )
        )
    )
    data = load_run(run)
    assert data.versions == ["1", "2", "10"]
    steps = step_figures(data)
    assert [(s.label, s.rollouts, s.graded, s.mean_reward, s.pass_rate) for s in steps] == [
        ("1", 1, 1, 0.5, 0.0),
        ("2", 2, 2, 0.5, 0.5),
        ("10", 2, 2, 0.5, 0.5),
        ("(no version)", 1, 1, 1.0, 1.0),
    ]
    assert [(s.off_policy, s.off_policy_calls) for s in steps] == [(0, 0), (1, 1), (1, 1), (0, 0)]
    tokens = {r.rollout_id: r.tokens for r in data.rollouts if r.tokens is not None}
    assert (tokens["b"].calls, tokens["b"].prompt, tokens["b"].generated) == (3, 6, 6)  # a null prompt is 0
    assert tokens["f"].versions == ("9", "10")
    assert tokens["a"].versions == (None, "10")
    html = build_report([run], tmp_path / "r.html").path.read_text()
    assert "1 rollouts without a policy version left out" in html
    assert len(chart_titles(html, "r0-steps")) == 6  # the versionless rollout is in the table, not the plot


def test_a_run_without_versions_has_no_steps_and_keeps_its_rows(tmp_path):
    run = write_run(tmp_path / "r", [line(0, 0), line(1, 0, reward=0.0), line(1, 0)], rows=2)
    data = load_run(run)
    assert data.versions == []
    assert step_figures(data) == []
    assert [len(row.rollouts) for row in data.rows.values()] == [1, 1]  # the retry of (1, 0) counts once
    assert data.rows[1].rollouts[0].attempts == 2
    html = build_report([run], tmp_path / "r.html").path.read_text()
    assert 'data-chart="r0-steps"' not in html
    assert "data-steps" not in html
    assert page_data(html)["steps"] == []


def test_a_results_line_without_a_version_takes_its_calls(tmp_path):
    # osmosis run --traces through a gateway whose version the trainer set: the lines name none
    run = write_run(tmp_path / "r", [line(0, 0, rollout_id="a"), line(1, 0, rollout_id="b", reward=0.0)], rows=2)
    (run / "traces.jsonl").write_text(json.dumps(trace("a", ["v7", "v7"])) + "\n" + json.dumps(trace("b", [None])))
    data = load_run(run)
    assert data.versions == ["v7"]
    assert [(s.label, s.rollouts) for s in step_figures(data)] == [("v7", 1), ("(no version)", 1)]


def test_hundreds_of_steps_are_drawn_as_spans_and_the_table_keeps_every_step(tmp_path):
    lines = [
        line(0, s, reward=float(k % 2), version=f"step-{k}", rollout_id=f"{k}-{s}") for k in range(250) for s in (0, 1)
    ]
    run = write_run(tmp_path / "r", lines, meta=SERVE)
    data = load_run(run)
    steps = step_figures(data)
    assert len(steps) == 250
    spans = bucketed(steps)
    assert len(spans) == 84  # 3 steps a span, the last one 1
    assert spans[0].label == "step-0 \u2013 step-2"
    assert spans[-1].label == "step-249"
    assert spans[0].rollouts == 6
    assert spans[0].mean_reward == pytest.approx(1 / 3)
    html = build_report([run], tmp_path / "r.html").path.read_text()
    assert len(chart_titles(html, "r0-steps")) == 2 * 84
    assert "every 3 steps drawn as one" in html
    assert 'data-steps="250"' in html
