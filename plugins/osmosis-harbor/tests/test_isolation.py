"""Isolation: a rollout cannot see other trials or the host's home, reach the network when the task
forbids it, or forge its reward."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from harbor_helpers import TASKS_DIR, request, run_all, sandbox_processes

from osmosis_core.testing import ScriptedPolicyServer


def _seen(outcome) -> list:
    return json.loads(outcome.final.sample.messages[-1]["content"])


def test_a_rollout_sees_neither_other_trials_nor_the_host_home_nor_secrets(probe, monkeypatch):
    from osmosis_harbor import HarborBackend, HarborBackendConfig, SandboxSection

    # trials and run folder on the read-only host (/var/tmp is shown), so only hiding protects them
    base = Path(tempfile.mkdtemp(prefix="osmosis-harbor-iso-", dir="/var/tmp"))
    home_secret = Path.home() / f"osmosis-harbor-secret-{secrets.token_hex(4)}"
    home_secret.write_text("home secret")
    monkeypatch.setenv("OSMOSIS_TEST_SECRET", "env secret")
    try:
        run_dir = base / "run"
        run_dir.mkdir()
        (run_dir / "results.jsonl").write_text('{"label": "secret label"}\n')
        dataset = base / "data.jsonl"  # a dataset with labels, hidden by name
        dataset.write_text('{"user_prompt": "q", "ground_truth": "secret label"}\n')
        config = HarborBackendConfig(keep_successful_trials=True, sandbox=SandboxSection(hide_paths=[str(dataset)]))
        run_dataset = base / "run-data.jsonl"  # the run's own dataset: hidden because the run names it
        run_dataset.write_text('{"user_prompt": "q", "ground_truth": "run secret label"}\n')
        with ScriptedPolicyServer() as server:
            planter = HarborBackend(probe.workflow_class, config=config, rollout_dir=probe.rollout_dir, run_dir=run_dir)
            run_all(planter, [request("planter", server.url, probe=[{"write": ["/app/planted.txt", "trial secret"]}])])
            [planted] = (run_dir / "harbor-trials").glob("planter-*/sandbox/env/app/planted.txt")
            assert planted.read_text() == "trial secret"
            snooper = HarborBackend(
                probe.workflow_class,
                config=config,
                rollout_dir=probe.rollout_dir,
                run_dir=run_dir,
                dataset_path=run_dataset,
            )
            [out] = run_all(
                snooper,
                [
                    request(
                        "snooper",
                        server.url,
                        probe=[
                            {"read": str(planted)},
                            {"list": str(run_dir / "harbor-trials")},
                            {"read": str(run_dir / "results.jsonl")},
                            {"exists": "/app/planted.txt"},
                            {"read": str(home_secret)},
                            {"list": str(Path.home())},
                            {"read": "/etc/shadow"},
                            {"env": "OSMOSIS_TEST_SECRET"},
                            {"write": ["/usr/osmosis-harbor-test", "x"]},
                            {"connect": ["127.0.0.1", server.port]},
                            {"read": str(dataset)},
                            {"read": str(run_dataset)},
                        ],
                    )
                ],
            )
        seen = _seen(out)
        assert seen[0]["pid"] < 10  # its own PID namespace
        other_trial, trials, results, own_app, home, home_list, shadow, env, usr, policy, labels, run_labels = seen[1:]
        assert other_trial.startswith("error: FileNotFoundError")
        assert "planter" not in str(trials)  # the trials folder (inside the hidden run folder) shows nothing
        assert results.startswith("error: FileNotFoundError")  # the run folder too
        assert own_app is False
        assert home.startswith("error: FileNotFoundError")
        assert home_secret.name not in str(home_list)
        assert shadow.startswith("error: PermissionError")
        assert env is None
        assert usr.startswith("error: OSError") and "Read-only file system" in usr
        assert policy == "connected"  # a public task reaches the policy on the host's loopback
        assert "secret label" not in labels  # a hidden file cannot be read
        assert "run secret label" not in run_labels  # nor the run's dataset, hidden without being named
    finally:
        home_secret.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)


def test_a_no_network_task_reaches_nothing(probe, tmp_path):
    from osmosis_harbor import HarborBackend, HarborBackendConfig

    config = HarborBackendConfig(task_dir=str(TASKS_DIR / "nonet"))
    with ScriptedPolicyServer() as server:
        backend = HarborBackend(probe.workflow_class, config=config, rollout_dir=probe.rollout_dir, run_dir=tmp_path)
        [out] = run_all(
            backend,
            [
                request(
                    "offline",
                    server.url,
                    probe=[
                        {"connect": ["127.0.0.1", server.port]},
                        {"connect": ["1.1.1.1", 53]},
                        {"connect": ["pypi.org", 443]},
                        {"list": "/sys/class/net"},
                    ],
                )
            ],
        )
    assert out.final.status.value == "success", out.final.error
    loopback, outside, dns, _ = _seen(out)[1:]
    assert loopback.startswith("error: ConnectionRefusedError")  # the host's 127.0.0.1 is not this one
    assert "Network is unreachable" in outside
    assert dns.startswith("error: gaierror")


def test_a_rollout_cannot_forge_its_reward(probe, tmp_path):
    from osmosis_harbor import HarborBackend

    marker = "while true; do echo"
    with ScriptedPolicyServer() as server:
        backend = HarborBackend(
            probe.workflow_class,
            probe.workflow_config,
            probe.grader_class,
            probe.grader_config,
            rollout_dir=probe.rollout_dir,
            run_dir=tmp_path,
        )
        # the workflow writes reward files, a fake grader result, a fake /tests script and modules
        # that would shadow the grader's, starts a process rewriting reward.json, and puts 1.0 on
        # its own sample; its row's label makes the real grader give 0.0
        forged, honest = run_all(
            backend,
            [request("forger", server.url, label="fail", probe=[{"forge": 1}]), request("honest", server.url)],
        )
    assert _seen(forged)[1] == "forged"
    assert (forged.final.stage.value, forged.final.status.value, forged.final.reward) == ("grader", "success", 0.0)
    assert honest.final.reward == 1.0
    time.sleep(0.2)
    assert sandbox_processes(marker) == []  # the rewriter died with the workflow's sandbox
    assert not os.path.exists("/logs/verifier/reward.json")  # and nothing was written on the host
