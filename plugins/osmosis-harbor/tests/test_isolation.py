"""Isolation: a rollout cannot see other trials or the host's home, reach the network when the task
forbids it, or forge its reward."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
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
        assert usr.startswith("error: OSError")
        assert "Read-only file system" in usr
        assert policy == "connected"  # a public task reaches the policy on the host's loopback
        assert "secret label" not in labels  # a hidden file cannot be read
        assert "run secret label" not in run_labels  # nor the run's dataset, hidden without being named
    finally:
        home_secret.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)


def test_a_trial_is_not_the_hosts_root_and_cannot_change_kernel_settings(probe, tmp_path):
    """From inside a real trial: nothing under /proc/sys or /sys is writable, and the trial's root is
    not the host's (its uid map, and the owner the host sees on a file it made in /app)."""
    from osmosis_harbor import HarborBackend, HarborBackendConfig
    from osmosis_harbor.bwrap import sandbox_id_base

    config = HarborBackendConfig(keep_successful_trials=True)
    with ScriptedPolicyServer() as server:
        backend = HarborBackend(probe.workflow_class, config=config, rollout_dir=probe.rollout_dir, run_dir=tmp_path)
        probes = [
            {"writable": ["/proc/sys", "/sys"]},
            {"read": "/proc/self/uid_map"},
            {"shell": "id -u"},
            {"write": ["/app/made-in-trial.txt", "mine"]},
        ]
        [out] = run_all(backend, [request("kernel", server.url, probe=probes)])
    assert out.final.status.value == "success", out.final.error
    writable, uid_map, uid = _seen(out)[1:4]
    assert writable == []
    [made] = (tmp_path / "harbor-trials").glob("kernel-*/sandbox/env/app/made-in-trial.txt")
    if os.geteuid() == 0:
        base = sandbox_id_base()
        assert uid == "0\n"
        assert uid_map.split() == ["0", str(base), "65536"]  # root inside, of its own ids
        assert made.stat().st_uid == base != 0  # the host sees an unprivileged owner
    else:
        assert made.stat().st_uid == os.geteuid()
    made.unlink()  # the host can clean up what the trial made


def test_a_no_network_task_reaches_its_policy_and_nothing_else(probe, tmp_path):
    """Traces off: the trial's socket leads to a policy gateway the backend started in front of the
    policy, its one path out. The policy server's other routes (here its /v1/models; on vLLM or SGLang
    their admin routes), its own port, the host's loopback, the outside and DNS stay out of reach."""
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
                        {"chat": "What is 2 times 3?"},
                        {"policy_url": None},
                        {"shell": "rm -f /run/osmosis/policy.sock; ls -l /run/osmosis"},
                        {"get": "/v1/models"},
                    ],
                )
            ],
        )
        calls, port = list(server.requests), server.port
        gateways = getattr(backend, "_gateways", None)
    assert out.final.status.value == "success", out.final.error
    loopback, outside, dns, _, answer, url, unmovable, other_route = _seen(out)[1:]
    assert loopback.startswith("error: ConnectionRefusedError")  # the host's 127.0.0.1 is not this one
    assert "Network is unreachable" in outside
    assert dns.startswith("error: gaierror")
    assert answer
    assert not str(answer).startswith("error")  # the policy answered, through the socket
    assert url.startswith("http://127.0.0.1:")
    assert f":{port}/" not in url  # the sandbox's own loopback
    assert len(calls) == 1
    assert calls[0].status == 200
    assert "policy.sock" in unmovable  # a mount point: the trial cannot take its path away
    assert other_route == 404  # the gateway's answer: the policy server never saw it
    assert gateways is not None
    assert gateways.open_count == 0  # stopped with its last rollout
    assert "/rollouts/offline" in url  # the rollout's own route on the gateway
    assert list(tmp_path.glob("harbor-trials/*")) == []  # the trial and its relay are gone


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


FORGE = """import os; open('/logs/verifier/reward.json', 'w').write('{"reward": 1}')"""


def test_a_dataset_task_keeps_its_tests_solution_and_reward_from_the_agent(probe, tmp_path):
    """Dataset mode, no network: the agent can read neither the task's tests nor its solution (nor any
    host file outside the allow-list), and what it plants cannot run in the verifier's interpreters."""
    check_escape_attempts(probe, tmp_path)


def check_escape_attempts(probe, tmp_path, *, dockerfile: str | None = None, **sandbox) -> None:
    """The escape test's trials and checks; with ``dockerfile``, on the task's image built from it
    (``sandbox``: more ``[backend.harbor.sandbox]`` settings, e.g. the image cache)."""
    import osmosis_core
    from osmosis_harbor import HarborBackend, HarborBackendConfig, SandboxSection

    tasks = tmp_path / "tasks"
    shutil.copytree(TASKS_DIR / "guarded", tasks)
    task = tasks / "escape"
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    host_secret = Path(tempfile.mkdtemp(prefix="osmosis-harbor-labels-", dir="/var/tmp")) / "labels.txt"
    host_secret.write_text("hidden labels")
    repo_file = Path(osmosis_core.__file__).resolve().parent.parent / "pyproject.toml"
    system_site = "~/.local/lib/python3.{}/site-packages".format
    escape = [
        {"read": str(task / "tests" / "test.sh")},
        {"read": str(task / "solution" / "solve.sh")},
        {"read": "/tests/test.sh"},
        {"read": "/solution/solve.sh"},
        {"read": str(host_secret)},
        {"read": str(repo_file)},
        {"list": "/"},
        {"write": ["/app/answer.txt", "wrong"]},
        {"write": ["/app/json.py", FORGE + "\nraise SystemExit(0)\n"]},
        *({"plant": [f"{system_site(minor)}/zz_forge.pth", FORGE + "\n"]} for minor in range(8, 15)),
        *({"plant": [f"{system_site(minor)}/usercustomize.py", FORGE + "\n"]} for minor in range(8, 15)),
        {"plant": ["/tests/test.sh", "echo 1 > /logs/verifier/reward.txt\n"]},
    ]
    config = HarborBackendConfig(
        mode="dataset", dataset_dir=str(tasks), keep_successful_trials=True, sandbox=SandboxSection(**sandbox)
    )
    try:
        with ScriptedPolicyServer() as server:
            backend = HarborBackend(
                probe.workflow_class, config=config, rollout_dir=probe.rollout_dir, run_dir=tmp_path
            )
            dishonest, honest = run_all(
                backend,
                [
                    request("escape", server.url, label=None, task="escape", probe=escape),
                    request("honest", server.url, label=None, task="escape",
                            probe=[{"write": ["/app/answer.txt", "correct"]}]),
                ],
            )  # fmt: skip
    finally:
        shutil.rmtree(host_secret.parent, ignore_errors=True)
    seen = _seen(dishonest)
    tests, solution, tests_in_trial, solution_in_trial, secret, repo, top = seen[1:8]
    for hidden in (tests, solution, tests_in_trial, solution_in_trial, secret, repo):
        assert str(hidden).startswith("error:"), hidden
        assert "MARKER" not in str(hidden), hidden
    if dockerfile is None:
        assert not {"var", "srv", "opt", "media", "mnt"} & set(top), top  # of the host, only the system folders
    else:
        assert {"var", "srv", "opt", ".osmosis"} <= set(top), top  # the image's own tree, and osmosis's runtime
    assert (dishonest.final.stage.value, dishonest.final.status.value) == ("grader", "success"), dishonest.final
    assert dishonest.final.reward == 0.0  # nothing it planted ran in the verifier
    assert honest.final.reward == 1.0  # and an honest answer still passes
    [trial] = (tmp_path / "harbor-trials").glob("escape-*")
    assert "the system interpreter ran clean" in (trial / "verifier" / "test-stdout.txt").read_text()


def test_no_secret_reaches_a_trial_folder_or_the_run_folder(tmp_path):
    """The policy's key and header values travel only in a command's environment: a grep of everything
    the run and its (kept) trials wrote finds neither."""
    import subprocess as sp
    import sys

    from harbor_helpers import HERE

    key, header = "sk-HARBORKEY-" + secrets.token_hex(8), "hdr-VALUE-" + secrets.token_hex(8)
    shutil.copytree(HERE / "rollouts" / "probe", tmp_path / "rollouts" / "probe")
    data = tmp_path / "data.jsonl"
    rows = [
        {
            "user_prompt": "q",
            "ground_truth": "pass",
            "probe": [
                {"env_digest": "OSMOSIS_POLICY_API_KEY"},
                {"chat": "hi"},
                {"shell": "env"},
                {"leak_key": "key="},
            ],
        },
        {"user_prompt": "q", "ground_truth": "pass", "probe": [{"raise": "a failed trial is kept"}]},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ScriptedPolicyServer(api_key=key) as server:
        (tmp_path / "run.toml").write_text(
            f"""
[rollout]
path = "rollouts/probe"
entrypoint = "probe_rollout.py"

[dataset]
path = "data.jsonl"

[policy]
base_url = "{server.url}"
api_key_env = "HARBOR_TEST_KEY"

[policy.headers]
X-Gateway-Token = "{header}"

[run]
backend = "harbor"

[backend.harbor]
keep_successful_trials = true
"""
        )
        env = {**os.environ, "HARBOR_TEST_KEY": key}
        run = sp.run(
            [str(Path(sys.executable).parent / "osmosis"), "run", "run.toml", "--output", "out"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert server.requests
        assert all(r.authorized and r.status == 200 for r in server.requests)
    lines = sorted(
        (json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()), key=lambda x: x["row"]
    )
    assert [x["status"] for x in lines] == ["success", "failure"], run.stderr
    seen = json.loads(lines[0]["sample"]["messages"][-1]["content"])
    assert seen[1] is None  # taken out of the environment once read: a tool the agent runs never sees it ...
    assert "OSMOSIS_POLICY" not in seen[3]
    assert "PATH=" in seen[3]
    assert seen[4] == "b'key=***'"  # ... and an agent that writes it into its sample has it redacted
    written = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()]
    assert len([p for p in written if "harbor-trials" in p.parts]) > 10  # both trials were kept
    leaks = [
        p
        for p in written
        if p.name != "run.toml" and (key.encode() in p.read_bytes() or header.encode() in p.read_bytes())
    ]
    assert leaks == []
    assert key not in run.stdout + run.stderr
    assert header not in run.stdout + run.stderr
    trials = tmp_path / "out" / "harbor-trials"
    assert oct(trials.stat().st_mode & 0o777) == "0o700"


def test_without_a_policy_gateway_a_no_network_trial_fails_saying_why(tmp_path):
    """The policy server itself is never relayed (its other routes would come with it): without a
    gateway plugin, a no-network rollout is a policy_error naming what to install. The run is a fresh
    process in which osmosis_gateway cannot be imported (as when it is not installed)."""
    code = f"""
import sys
class NoGateway:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "osmosis_gateway":
            raise ModuleNotFoundError("No module named 'osmosis_gateway'", name=name)
sys.meta_path.insert(0, NoGateway())
sys.path.insert(0, {str(Path(__file__).parent)!r})
from harbor_helpers import PROBE_DIR, TASKS_DIR, load, request, run_all
from osmosis_harbor import HarborBackend, HarborBackendConfig
probe = load(PROBE_DIR, "probe_rollout.py")
config = HarborBackendConfig(task_dir=str(TASKS_DIR / "nonet"))
backend = HarborBackend(probe.workflow_class, config=config, rollout_dir=probe.rollout_dir, run_dir={str(tmp_path)!r})
[out] = run_all(backend, [request("offline", "http://127.0.0.1:9/v1", probe=[{{"chat": "hi"}}])])
print(out.final.error.category.value)
print(out.final.error.message)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    category, message = done.stdout.strip().split("\n", 1)
    assert category == "policy_error"
    assert "network_mode = 'no-network', so its trials reach the policy at 127.0.0.1:9 only through a policy" in message
    assert "pip install osmosis-gateway" in message
    assert list(tmp_path.glob("harbor-trials/*")) == []  # no trial was started
