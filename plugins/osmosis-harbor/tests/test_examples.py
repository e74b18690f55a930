"""The starter template and the other examples run with ``--backend harbor`` on a fresh workspace."""

from __future__ import annotations

import json

import pytest
from harbor_helpers import osmosis

from osmosis_core.testing import guide_commands, run_guide_commands


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.together
@pytest.mark.timeout(420)  # four Harbor runs (13 trials, two interpreters each) on two cores
def test_the_multiply_harbor_strands_template_runs_as_applied(tmp_path):
    """The template as a user applies it, run by every distinct command its guides name (which include
    the README's `osmosis run configs/eval/multiply-harbor-strands.toml --stub-policy`, with a limit)."""
    pytest.importorskip("osmosis_strands", reason="the template's rollout uses osmosis-strands")
    applied = osmosis("template", "apply", "multiply-harbor-strands", cwd=tmp_path)
    assert applied.returncode == 0, applied.stderr
    assert (tmp_path / "rollouts/multiply-harbor-strands/task/tests/test.sh").is_file()
    for path in [tmp_path / "AGENTS.md", *(tmp_path / ".agents" / "skills").glob("*/SKILL.md")]:
        assert "{{" not in path.read_text(), path
    commands = [c for _, c in guide_commands(tmp_path, unique=True)]
    assert "osmosis run configs/eval/multiply-harbor-strands.toml --stub-policy --limit 5" in commands
    results = run_guide_commands(tmp_path)
    assert len(results) == len(commands) >= 7
    evaluated = next(r for c, r in zip(commands, results, strict=True) if c.endswith("--stub-policy --limit 5"))
    assert "on backend 'harbor'" in evaluated.stdout
    [run_dir] = [p for p in (tmp_path / "runs").iterdir() if len(_lines(p / "results.jsonl")) == 5]
    lines = _lines(run_dir / "results.jsonl")
    assert all((x["status"], x["stage"], x["reward"]) == ("success", "grader", 1.0) for x in lines), lines[0]
    assert lines[0]["sample"]["messages"][0]["role"] == "user"  # Strands' own history, from inside the trial
    assert list((run_dir / "harbor-trials").iterdir()) == []
    assert (tmp_path / "runs" / "debug-one" / "results.jsonl").is_file()


@pytest.mark.together
def test_the_openai_agents_example_runs_with_backend_harbor(tmp_path):
    pytest.importorskip("osmosis_openai_agents", reason="the example comes with osmosis-openai-agents")
    assert osmosis("template", "apply", "multiply-local-openai", cwd=tmp_path).returncode == 0
    run = osmosis(
        "run", "configs/eval/multiply-local-openai.toml", "--stub-policy", "--backend", "harbor", "--limit", "2",
        "--output", "runs/h", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    lines = _lines(tmp_path / "runs/h/results.jsonl")
    assert [(x["status"], x["reward"]) for x in lines] == [("success", 1.0)] * 2, lines[0]["error"]
