"""Template mode: each rollout in its own trial of one task; the grader is the trial's verifier."""

from __future__ import annotations

import json
from pathlib import Path

from harbor_helpers import osmosis, request, run_all

from osmosis_core.testing import ScriptedPolicyServer


def _results(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def test_osmosis_run_backend_harbor_runs_the_plain_example_end_to_end(tmp_path):
    assert osmosis("template", "apply", "multiply-plain", str(tmp_path), cwd=tmp_path).returncode == 0
    run = osmosis(
        "run", "configs/eval/multiply-plain.toml", "--stub-policy", "--backend", "harbor", "--limit", "6",
        "--output", "runs/h", cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "on backend 'harbor'" in " ".join(run.stdout.split())  # rich wraps long lines
    lines = _results(tmp_path / "runs" / "h")
    assert len(lines) == 6
    for line in lines:
        assert (line["status"], line["stage"], line["reward"], line["error"]) == ("success", "grader", 1.0, None)
        assert line["sample"]["messages"][-1]["content"].endswith(line["sample"]["messages"][-2]["content"])
        assert {"queued", "workflow", "grader", "trial"} <= set(line["timings"])
    summary = json.loads((tmp_path / "runs" / "h" / "summary.json").read_text())
    assert (summary["succeeded"], summary["mean_reward"]) == (6, 1.0)
    assert list((tmp_path / "runs" / "h" / "harbor-trials").iterdir()) == []  # successful trials removed


def test_results_come_as_local_ones_do_and_failed_trials_are_kept(probe, tmp_path):
    from osmosis_harbor import HarborBackend, HarborBackendConfig

    with ScriptedPolicyServer() as server:
        backend = HarborBackend(
            probe.workflow_class,
            probe.workflow_config,
            probe.grader_class,
            probe.grader_config,
            config=HarborBackendConfig(n_concurrent=4),
            rollout_dir=probe.rollout_dir,
            run_dir=tmp_path,
        )
        ok, fail, boom, unlabelled = run_all(
            backend,
            [
                request("ok", server.url, prompt="6 * 7", probe=[{"chat": "6 * 7"}]),
                request("fail", server.url, label="fail"),
                request("boom", server.url, probe=[{"raise": "boom"}]),
                request("unlabelled", server.url, label=None),
            ],
        )
        assert len(server.requests_for("ok")) == 1  # the workflow in the trial called the policy, with its id
    # a workflow result first (as soon as the agent phase ends), then the grader's: as on the local backend
    assert [(r.stage.value, r.status.value) for r in ok.results] == [("workflow", "success"), ("grader", "success")]
    assert ok.workflow.reward is None
    assert ok.final.reward == 1.0
    seen = json.loads(ok.final.sample.messages[-1]["content"])
    assert seen[0]["user_prompt"] == "6 * 7"
    assert seen[0]["cwd"] == "/app"
    assert seen[-1].endswith("#### 42")
    assert (fail.final.status.value, fail.final.reward) == ("success", 0.0)
    # a failing workflow: its own category and message, plus the kept trial's folder
    assert [r.stage.value for r in boom.results] == ["workflow"]
    error = boom.final.error
    assert error.category.value == "agent_error"
    assert "RuntimeError: boom" in error.message
    trial_dir = Path(error.message.rsplit("logs: ", 1)[1].rstrip(")"))
    assert (trial_dir / "result.json").is_file()
    assert (trial_dir / "agent" / "osmosis-result.json").is_file()
    # a grader but no label: run and not graded (no verifier), as on the local backend
    assert [(r.stage.value, r.status.value, r.reward) for r in unlabelled.results] == [("workflow", "success", None)]
    kept = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "harbor-trials").iterdir())
    assert kept == ["boom"]  # successful trials are removed, failed ones kept


def test_no_grader_means_one_workflow_result_and_keep_successful_trials_keeps_them(probe, tmp_path):
    from osmosis_harbor import HarborBackend, HarborBackendConfig

    with ScriptedPolicyServer() as server:
        backend = HarborBackend(
            probe.workflow_class,
            config=HarborBackendConfig(keep_successful_trials=True, trials_dir=str(tmp_path / "t")),
            rollout_dir=probe.rollout_dir,
        )
        [only] = run_all(backend, [request("solo", server.url)])
    assert [(r.stage.value, r.status.value) for r in only.results] == [("workflow", "success")]
    [trial] = list((tmp_path / "t").iterdir())
    result = json.loads((trial / "result.json").read_text())
    assert result["verifier_result"] is None
    assert result["exception_info"] is None
    assert result["agent_info"]["name"] == "osmosis-workflow"


def test_grading_on_the_host_gives_the_same_rewards_and_errors(probe, tmp_path):
    from osmosis_harbor import HarborBackend, HarborBackendConfig

    with ScriptedPolicyServer() as server:
        backend = HarborBackend(
            probe.workflow_class,
            probe.workflow_config,
            probe.grader_class,
            probe.grader_config,
            config=HarborBackendConfig(grade_on_host=True),
            rollout_dir=probe.rollout_dir,
            run_dir=tmp_path,
            require_labels=True,
        )
        good, bad, unlabelled, forged = run_all(
            backend,
            [
                request("good", server.url),
                request("bad", server.url, label="fail"),
                request("unlabelled", server.url, label=None),
                request("forged", server.url, label="fail", probe=[{"forge": 1}]),
            ],
        )
    assert (good.final.reward, bad.final.reward, forged.final.reward) == (1.0, 0.0, 0.0)
    # [run] require_labels = true: a row without a label fails, as on the local backend
    assert unlabelled.final.error.category.value == "validation_error"
    assert "no label" in unlabelled.final.error.message


def test_a_sandbox_that_fails_to_start_is_an_infra_error(probe, tmp_path):
    from osmosis_harbor import EnvironmentSection, HarborBackend, HarborBackendConfig

    # a bubblewrap that cannot create namespaces (as on a kernel without user namespaces)
    broken = tmp_path / "bwrap"
    broken.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    broken.chmod(0o755)
    config = HarborBackendConfig(environment=EnvironmentSection(kwargs={"bwrap": str(broken)}))
    with ScriptedPolicyServer() as server:
        backend = HarborBackend(probe.workflow_class, config=config, rollout_dir=probe.rollout_dir, run_dir=tmp_path)
        [out] = run_all(backend, [request("nosandbox", server.url)])
    error = out.final.error
    assert (out.final.stage.value, error.category.value) == ("workflow", "infra_error")
    assert "SandboxStartError" in error.message
    assert "Operation not permitted" in error.message
    assert "logs: " in error.message


def test_the_policy_key_reaches_the_trial_but_no_file(probe, tmp_path):
    from osmosis_core import ExecutionRequest, PolicyEndpoint
    from osmosis_harbor import HarborBackend, HarborBackendConfig

    key = "sk-osmosis-harbor-" + "k3y" * 6
    with ScriptedPolicyServer(api_key=key) as server:
        backend = HarborBackend(
            probe.workflow_class,
            probe.workflow_config,
            probe.grader_class,
            probe.grader_config,
            config=HarborBackendConfig(keep_successful_trials=True),
            rollout_dir=probe.rollout_dir,
            run_dir=tmp_path,
        )
        assert backend.health()["environment"] == "bwrap"
        req = ExecutionRequest(
            "keyed",
            [{"role": "user", "content": "2 * 21"}],
            PolicyEndpoint(server.url, "osmosis-stub", api_key=key),
            label="pass",
            metadata={"probe": [{"chat": "2 * 21"}, {"env_digest": "OSMOSIS_POLICY_API_KEY"}]},
        )
        [out] = run_all(backend, [req])
    assert out.final.reward == 1.0, out.final.error
    answer, digest = json.loads(out.final.sample.messages[-1]["content"])[1:]
    assert answer.endswith("#### 42")  # the policy call in the trial carried the key
    assert digest is None  # and it was taken out of the environment before the workflow ran
    files = [p for p in (tmp_path / "harbor-trials").rglob("*") if p.is_file() and not p.is_symlink()]
    assert len(files) > 5
    assert [p for p in files if key.encode() in p.read_bytes()] == []


def test_harbors_own_environments_pass_through_unchanged(probe, tmp_path):
    import shutil

    import pytest

    from osmosis_harbor import EnvironmentSection, HarborBackend, HarborBackendConfig

    if shutil.which("podman"):
        pytest.skip("podman is installed here: this test checks the pass-through where it is not")
    config = HarborBackendConfig(environment=EnvironmentSection(type="podman", kwargs={"keep_containers": False}))
    with ScriptedPolicyServer() as server:
        backend = HarborBackend(probe.workflow_class, config=config, rollout_dir=probe.rollout_dir, run_dir=tmp_path)
        assert backend.health()["environment"] == "podman"
        [out] = run_all(backend, [request("podman", server.url)])
    error = out.final.error
    assert error.category.value == "infra_error"
    assert "podman" in error.message
    [trial] = (tmp_path / "harbor-trials").iterdir()
    environment = json.loads((trial / "config.json").read_text())["environment"]
    assert (environment["type"], environment.get("import_path")) == ("podman", None)
    assert environment["kwargs"] == {"keep_containers": False}


def test_a_config_holding_unpicklable_module_objects_reaches_the_trial_by_reference(tmp_path):
    from harbor_helpers import HERE, load

    from osmosis_harbor import HarborBackend

    rollout = load(HERE / "rollouts" / "by_reference", "by_reference.py")
    with ScriptedPolicyServer() as server:
        backend = HarborBackend(rollout.workflow_class, rollout.workflow_config, rollout_dir=rollout.rollout_dir)
        [out] = run_all(backend, [request("by-ref", server.url)])
    assert out.final.status.value == "success", out.final.error
    assert out.final.sample.messages[-1]["content"] == "same objects: True"
