"""``osmosis run --traces --backend ray``: each rollout on an actor calls the policy gateway with its
own URL and token (the runner rewrites the request's policy before the backend sees it), and the
traces are the ones ``local`` gives for the same rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ray_helpers import REPO, osmosis

pytestmark = pytest.mark.together  # with osmosis-gateway installed beside this plugin


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(400)
def test_ray_gives_the_traces_of_local(cluster, tmp_path):
    gateway = pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    shutil.copytree(
        REPO / "rollouts" / "multiply-plain",
        tmp_path / "rollouts" / "multiply-plain",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    config = tmp_path / "multiply-plain.toml"
    shutil.copy(REPO / "configs" / "eval" / "multiply-plain.toml", config)
    text = config.read_text().replace('path = "rollouts/', f'path = "{tmp_path}/rollouts/')
    ray = config.with_name("ray.toml")
    ray.write_text(
        text.replace('backend = "local"', 'backend = "ray"')
        + f'\n[backend.ray]\naddress = "{cluster.address}"\nactors = 2\n'
    )
    args = ["--stub-policy", "--traces", "--limit", "6", "--n-samples", "2"]
    local = osmosis("run", str(config), *args, "--output", str(tmp_path / "local"), cwd=tmp_path)
    on_ray = osmosis("run", str(ray), *args, "--output", str(tmp_path / "ray"), cwd=tmp_path, timeout=360)
    assert local.returncode == 0, local.stderr[-3000:]
    assert on_ray.returncode == 0, on_ray.stdout[-3000:] + on_ray.stderr[-3000:]
    assert "on backend 'ray'" in on_ray.stdout, on_ray.stdout[-3000:] + on_ray.stderr[-3000:]
    traces = {
        name: sorted(map(gateway.comparable_trace, _lines(tmp_path / name / "traces.jsonl")), key=str)
        for name in ("local", "ray")
    }
    assert len(traces["local"]) == 12
    assert traces["ray"] == traces["local"]
    assert all(t["complete"] and len(t["calls"]) == 2 and t["calls"][1]["logprobs"] for t in traces["ray"])
    assert all(line["status"] == "success" for line in _lines(tmp_path / "ray" / "results.jsonl"))
