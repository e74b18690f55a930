"""``osmosis run --traces --backend harbor``: each trial calls the policy gateway with its rollout's
own URL and token, and the traces are the ones ``local`` gives for the same rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from harbor_helpers import TASKS_DIR, osmosis

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.together  # with osmosis-gateway installed beside this plugin


def _workspace(tmp_path: Path) -> Path:
    shutil.copytree(
        REPO / "rollouts" / "multiply-plain",
        tmp_path / "rollouts" / "multiply-plain",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "eval" / "multiply-plain.toml", tmp_path / "configs")
    return tmp_path / "configs" / "multiply-plain.toml"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(300)
def test_harbor_gives_the_traces_of_local(tmp_path):
    gateway = pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    config = _workspace(tmp_path)
    args = ["run", str(config), "--stub-policy", "--traces", "--limit", "4"]
    local = osmosis(*args, "--output", "local", cwd=tmp_path)
    harbor = osmosis(*args, "--backend", "harbor", "--output", "harbor", cwd=tmp_path, timeout=240)
    assert local.returncode == 0, local.stderr
    assert harbor.returncode == 0, harbor.stdout + harbor.stderr
    assert "on backend 'harbor'" in harbor.stdout, harbor.stdout + harbor.stderr
    on_local = sorted(map(gateway.comparable_trace, _lines(tmp_path / "local" / "traces.jsonl")), key=str)
    on_harbor = sorted(map(gateway.comparable_trace, _lines(tmp_path / "harbor" / "traces.jsonl")), key=str)
    assert len(on_local) == 4
    assert on_harbor == on_local
    assert all(t["complete"] and len(t["calls"]) == 2 and t["calls"][0]["completion_token_ids"] for t in on_harbor)
    assert all(line["status"] == "success" for line in _lines(tmp_path / "harbor" / "results.jsonl"))


def test_a_no_network_task_with_traces_fails_the_rollout_saying_why(tmp_path):
    """A no-network trial cannot reach the gateway on the host's loopback (no path for it yet): the
    rollout is a policy_error whose message names the reason, not a bare connection error."""
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    config = _workspace(tmp_path)
    text = config.read_text().replace('backend = "local"', 'backend = "harbor"')
    config.write_text(f'{text}\n[backend.harbor]\ntask_dir = "{TASKS_DIR / "nonet"}"\n')
    run = osmosis("run", str(config), "--stub-policy", "--traces", "--limit", "1", "--output", "out", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    [line] = _lines(tmp_path / "out" / "results.jsonl")
    assert line["status"] == "failure"
    assert line["error"]["category"] == "policy_error"
    assert "the task has network_mode = 'no-network', so its trials cannot reach the policy" in line["error"]["message"]
    assert "the policy gateway's" in line["error"]["message"]
