"""Dataset mode: rows name existing Harbor tasks, which keep their instructions, environments and verifiers."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

from harbor_helpers import HERE, TASKS_DIR, osmosis

from osmosis_core.testing import ScriptedPolicyServer
from osmosis_harbor.tasks import dataset_rows, write_dataset


def _file_agent_script():
    spec = importlib.util.spec_from_file_location(
        "file_agent_script", HERE / "rollouts" / "file_agent" / "file_agent.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.script


def test_osmosis_run_dataset_mode_uses_each_tasks_instruction_and_verifier(tmp_path):
    shutil.copytree(TASKS_DIR / "dataset", tmp_path / "tasks")
    shutil.copytree(HERE / "rollouts" / "file_agent", tmp_path / "rollouts" / "file_agent")
    data = write_dataset(tmp_path / "tasks", tmp_path / "data" / "tasks.jsonl")
    rows = dataset_rows(tmp_path / "tasks")
    assert [r["task"] for r in rows] == ["create-file", "impossible", "no-reward", "write-poem"]
    with data.open("a") as handle:
        handle.write(json.dumps({"task": "no-such-task", "user_prompt": "?"}) + "\n")
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    with ScriptedPolicyServer(_file_agent_script()) as server:
        (tmp_path / "configs" / "eval" / "tasks.toml").write_text(
            f"""
[rollout]
path = "rollouts/file_agent"
entrypoint = "file_agent.py"

[dataset]
path = "data/tasks.jsonl"

[policy]
base_url = "{server.url}"
model = "scripted"

[run]
backend = "harbor"
concurrency = 4

[backend.harbor]
mode = "dataset"
dataset_dir = "tasks"
"""
        )
        run = osmosis("run", "configs/eval/tasks.toml", "--output", "runs/d", cwd=tmp_path)
        prompts = [r.body["messages"][0]["content"] for r in server.requests]
    assert run.returncode == 0, run.stdout + run.stderr
    by_row = {
        line["row"]: line for line in map(json.loads, (tmp_path / "runs/d/results.jsonl").read_text().splitlines())
    }
    create, impossible, no_reward, poem, missing = (by_row[i] for i in range(5))
    # the agent created the file the task asked for, and the task's own test.sh rewarded it
    assert (create["status"], create["stage"], create["reward"]) == ("success", "grader", 1.0)
    assert (poem["status"], poem["reward"]) == ("success", 1.0)
    assert create["sample"]["messages"][0] == {
        "role": "user",
        "content": "Create the file /app/greeting.txt containing the word hello.",
    }
    assert "Create the file /app/poem.txt containing the word roses." in prompts  # the task's instruction
    # an agent that does not do the task gets the verifier's 0
    assert (impossible["status"], impossible["reward"]) == ("success", 0.0)
    # a verifier that writes no reward: validation_error naming the task
    assert (no_reward["status"], no_reward["stage"]) == ("failure", "grader")
    assert no_reward["error"]["category"] == "validation_error"
    assert "'osmosis-tests/no-reward' wrote no reward" in no_reward["error"]["message"]
    assert "test-stdout.txt" in no_reward["error"]["message"]
    # a row naming a task that is not there
    assert missing["error"]["category"] == "validation_error"
    assert "'no-such-task' is not a Harbor task folder" in missing["error"]["message"]
    kept = sorted(p.name.split("-")[1] for p in (tmp_path / "runs/d/harbor-trials").iterdir())
    assert kept == ["2"]  # only the failed trial (row 2) is kept


def test_harbors_own_cli_runs_a_task_in_the_sandbox_by_import_path(tmp_path):
    """The environment is a plain Harbor environment: ``harbor run -e osmosis_harbor.sandbox:...``."""
    harbor = shutil.which("harbor", path=str(Path(sys.executable).parent))
    assert harbor is not None
    results = {}
    for agent in ("oracle", "nop"):
        proc = subprocess.run(
            [
                harbor, "run", "-p", str(TASKS_DIR / "dataset" / "create-file"), "-a", agent,
                "-e", "osmosis_harbor.sandbox:BubblewrapEnvironment", "-o", str(tmp_path / "jobs"),
                "--job-name", agent, "-y", "-q",
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        [trial] = [t for t in (tmp_path / "jobs" / agent).iterdir() if t.is_dir()]
        results[agent] = json.loads((trial / "result.json").read_text())
    for agent, expected in (("oracle", 1.0), ("nop", 0.0)):
        result = results[agent]
        assert result["exception_info"] is None
        assert result["verifier_result"]["rewards"] == {"reward": expected}
