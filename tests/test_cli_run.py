"""`osmosis run` / `validate` / `--help` as a user runs them: real subprocesses, real HTTP."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from osmosis_core.testing import Fault, ScriptedPolicyServer


def osmosis(exe: str, *args: str, cwd: Path, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_with_key(
    exe: str, config: str, url: str, limit: str, output: str, *, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess:
    """``osmosis run CONFIG`` against ``url`` with the key in ``$MY_KEY``."""
    args = ["run", config, "--policy-url", url, "--api-key-env", "MY_KEY", "--limit", limit, "--output", output]
    return osmosis(exe, *args, cwd=cwd, env=env)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_example_runs_end_to_end_with_summary_and_files(workspace, osmosis_exe, clean_env):
    r = osmosis(
        osmosis_exe,
        "run",
        "configs/eval/multiply-plain.toml",
        "--stub-policy",
        "--n-samples",
        "2",
        "--output",
        "out",
        cwd=workspace,
        env=clean_env,
    )
    assert r.returncode == 0, r.stderr
    assert "stand-in" in r.stderr
    assert "not a model" in r.stderr
    assert "osmosis run summary" in r.stdout
    assert "mean reward" in r.stdout
    assert "1.000" in r.stdout
    out = workspace / "out"
    results = lines(out / "results.jsonl")
    assert len(results) == 40
    assert {(x["row"], x["sample_index"]) for x in results} == {(i, s) for i in range(20) for s in range(2)}
    assert all(x["status"] == "success" and x["reward"] == 1.0 for x in results)
    first = results[0]
    assert [m["role"] for m in first["sample"]["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert first["metrics"] == {"turns": 2}
    assert first["stage"] == "grader"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 40
    assert summary["mean_reward"] == 1.0
    assert summary["pass_rate"] == 1.0
    assert summary["stub_policy"] is True
    assert summary["errors_by_category"] == {}
    assert summary["latency_p50_sec"] is not None
    assert "stub" in (out / "config.toml").read_text()


def test_api_key_reaches_the_endpoint_but_no_file_or_output(workspace, osmosis_exe, clean_env):
    secret = "sk-test-never-written-0123456789"
    with ScriptedPolicyServer(api_key=secret) as server:
        _check_key_handling(workspace, osmosis_exe, clean_env, server, secret)


def _check_key_handling(workspace, osmosis_exe, clean_env, policy_server, secret):
    env = {**clean_env, "MY_KEY": secret}
    r = run_with_key(
        osmosis_exe, "configs/eval/multiply-plain.toml", policy_server.url, "3", "out", cwd=workspace, env=env
    )
    assert r.returncode == 0, r.stderr
    assert len(policy_server.requests) == 6
    assert all(x.authorized for x in policy_server.requests)
    assert secret not in r.stdout + r.stderr
    for path in (workspace / "out").iterdir():
        assert secret not in path.read_text(), path
    assert 'api_key_env = "MY_KEY"' in (workspace / "out" / "config.toml").read_text()

    # a wrong key: every rollout fails as policy_error, and the message does not echo the key
    env["MY_KEY"] = "sk-wrong-key-9876543210"
    r = run_with_key(
        osmosis_exe, "configs/eval/multiply-plain.toml", policy_server.url, "2", "out2", cwd=workspace, env=env
    )
    assert r.returncode == 1
    assert "run failed: every rollout failed (2 of 2: policy_error 2)" in r.stderr
    assert "--retry-failed" in r.stderr
    failed = lines(workspace / "out2" / "results.jsonl")
    assert [x["error"]["category"] for x in failed] == ["policy_error", "policy_error"]
    assert "401" in failed[0]["error"]["message"]
    assert "sk-wrong-key" not in (workspace / "out2" / "results.jsonl").read_text()


def test_a_provider_echoing_a_masked_key_and_a_header_prefix_leaves_no_fragment_anywhere(
    workspace, osmosis_exe, clean_env
):
    """OpenAI answers a wrong key with its first 16 and last 4 characters; a gateway may echo a header
    value's head. No run of 8 characters of either reaches results, summary, config or output (issue 16.5)."""
    key = "sk-proj-abcd1234EFGH5678ijkl9012MNOPqrst5678wxyz"
    header = "org-0123456789abcdefXYZ"
    echo = (
        f"Incorrect API key provided: {key[:16]}{'*' * (len(key) - 20)}{key[-4:]}. You can find your API key at "
        f"https://platform.openai.com/account/api-keys. Unknown organization {header[:16]}"
    )
    config = workspace / "configs" / "eval" / "multiply-plain.toml"
    config.write_text(config.read_text() + f'\n[policy.headers]\nOpenAI-Organization = "{header}"\n')
    with ScriptedPolicyServer() as server:
        server.inject(Fault("status", status=401, message=echo), times=100)
        r = run_with_key(
            osmosis_exe, str(config), server.url, "3", "out", cwd=workspace, env={**clean_env, "MY_KEY": key}
        )
    assert r.returncode == 1, r.stderr
    failed = lines(workspace / "out" / "results.jsonl")
    assert [x["error"]["category"] for x in failed] == ["policy_error"] * 3
    assert "401" in failed[0]["error"]["message"]
    assert "Incorrect API key provided: ***" in failed[0]["error"]["message"]
    everything = r.stdout + r.stderr
    for path in (workspace / "out").rglob("*"):
        if path.is_file():
            everything += path.read_text(errors="replace")
    leaked = [f for secret in (key, header) for f in fragments(secret) if f in everything]
    assert not leaked, leaked


def fragments(secret: str) -> set[str]:
    """Every run of 8 characters of ``secret``."""
    return {secret[i : i + 8] for i in range(len(secret) - 7)}


def test_interrupt_then_resume_loses_nothing_and_duplicates_nothing(workspace, osmosis_exe, clean_env):
    args = [
        "run",
        "configs/eval/multiply-plain.toml",
        "--stub-policy",
        "--stub-latency",
        "0.15",
        "--concurrency",
        "2",
        "--output",
        "out",
    ]
    proc = subprocess.Popen(
        [osmosis_exe, *args],
        cwd=workspace,
        env=clean_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    results = workspace / "out" / "results.jsonl"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if results.exists() and len(results.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert "--resume" in err
    kept = lines(results)
    assert 4 <= len(kept) < 20
    assert all(x["status"] == "success" for x in kept)  # cancelled rollouts are not written
    summary = json.loads((workspace / "out" / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["finished"] == len(kept)

    # a crash mid-write leaves half a line: resume drops it and runs that pair again
    with results.open("a") as handle:
        handle.write('{"row": 19, "sample_ind')
    r = osmosis(osmosis_exe, *args, "--resume", cwd=workspace, env=clean_env)
    assert r.returncode == 0, r.stderr
    assert f"{len(kept)} already done" in r.stdout.replace("\n", " ")
    final = lines(results)
    pairs = [(x["row"], x["sample_index"]) for x in final]
    assert len(pairs) == len(set(pairs)) == 20
    assert final[: len(kept)] == kept

    # nothing left: a second resume runs nothing; a plain run refuses to mix into the folder
    r = osmosis(osmosis_exe, *args, "--resume", cwd=workspace, env=clean_env)
    assert r.returncode == 0
    assert "0 to run" in r.stdout.replace("\n", " ")
    r = osmosis(osmosis_exe, *args, cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert "already holds results" in r.stderr


def test_resume_refuses_a_changed_dataset(workspace, osmosis_exe, clean_env):
    args = ["run", "configs/eval/multiply-plain.toml", "--stub-policy", "--limit", "2", "--output", "out"]
    assert osmosis(osmosis_exe, *args, cwd=workspace, env=clean_env).returncode == 0
    data = workspace / "rollouts" / "multiply-plain" / "data" / "multiply.jsonl"
    data.write_text(data.read_text().replace('"val1', '"val01', 1))
    r = osmosis(osmosis_exe, *args, "--resume", cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert "dataset_sha256 changed" in r.stderr


def test_resume_finds_the_latest_run_by_itself(workspace, osmosis_exe, clean_env):
    args = ["run", "configs/eval/multiply-plain.toml", "--stub-policy", "--limit", "2"]
    assert osmosis(osmosis_exe, *args, cwd=workspace, env=clean_env).returncode == 0
    r = osmosis(osmosis_exe, *args, "--limit", "3", "--resume", cwd=workspace, env=clean_env)
    # --limit changed the number of rows: refused, with the reason
    assert r.returncode == 1
    assert "rows changed" in r.stderr
    r = osmosis(osmosis_exe, *args, "--resume", cwd=workspace, env=clean_env)
    assert r.returncode == 0
    assert "0 to run" in r.stdout.replace("\n", " ")
    [run_dir] = (workspace / "runs").iterdir()
    assert run_dir.name.startswith("multiply-plain-")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["configs/eval/missing.toml"], "no such file"),
        (
            ["configs/eval/multiply-plain.toml", "--dataset", "nope.jsonl", "--stub-policy"],
            "nope.jsonl: no such file",
        ),
    ],
)
def test_expected_errors_are_one_clear_line_with_exit_1(workspace, osmosis_exe, clean_env, args, message):
    r = osmosis(osmosis_exe, "run", *args, cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_usage_errors_exit_2_and_debug_shows_tracebacks(workspace, osmosis_exe, clean_env):
    r = osmosis(osmosis_exe, "run", "--concurrency", "zero", cwd=workspace, env=clean_env)
    assert r.returncode == 2
    assert "Invalid value for '--concurrency'" in r.stderr
    r = osmosis(osmosis_exe, "--debug", "run", "configs/eval/missing.toml", cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert "Traceback" in r.stderr
    assert "ConfigError" in r.stderr
    r = osmosis(
        osmosis_exe,
        "run",
        "configs/eval/missing.toml",
        cwd=workspace,
        env={**clean_env, "OSMOSIS_DEBUG": "1"},
    )
    assert "Traceback" in r.stderr


def test_bad_dataset_line_is_reported_before_any_rollout(workspace, osmosis_exe, clean_env):
    data = workspace / "rollouts" / "multiply-plain" / "data" / "multiply.jsonl"
    rows = data.read_text().splitlines()
    rows[4] = '{"user_prompt": "x", '
    data.write_text("\n".join(rows) + "\n")
    r = osmosis(
        osmosis_exe,
        "run",
        "configs/eval/multiply-plain.toml",
        "--stub-policy",
        "--output",
        "out",
        cwd=workspace,
        env=clean_env,
    )
    assert r.returncode == 1
    assert f"{data}:5: invalid JSON" in r.stderr.replace("\n", "")
    assert not (workspace / "out").exists()


def test_validate_checks_everything_and_warns_on_a_declared_missing_dependency(workspace, osmosis_exe, clean_env):
    r = osmosis(osmosis_exe, "validate", "configs/eval/multiply-plain.toml", cwd=workspace, env=clean_env)
    assert r.returncode == 0, r.stderr
    for expected in (
        "dataset: 20 rows (20 with a label)",
        "workflow MultiplyWorkflow, grader MultiplyGrader",
        "backend 'local'",
    ):
        assert expected in r.stdout
    main = workspace / "rollouts" / "multiply-plain" / "main.py"
    main.write_text(main.read_text() + "\nimport some_declared_pkg\n")
    pyproject = workspace / "rollouts" / "multiply-plain" / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('"osmosis-core>=0.2"', '"osmosis-core>=0.2", "some-declared-pkg"')
    )
    r = osmosis(osmosis_exe, "validate", "configs/eval/multiply-plain.toml", cwd=workspace, env=clean_env)
    assert r.returncode == 0
    assert "warn" in r.stdout
    assert "some_declared_pkg" in r.stdout
    # a declared distribution is missing: an import it would provide is a warning too (strands via osmosis-strands)
    main.write_text("import provided_by_a_declared_dist\n")
    r = osmosis(osmosis_exe, "validate", "configs/eval/multiply-plain.toml", cwd=workspace, env=clean_env)
    assert r.returncode == 0
    assert "are not all installed" in r.stdout
    # an undeclared missing package: a warning too, naming it and saying to declare it (osmosis-ai's rule)
    pyproject.write_text(pyproject.read_text().replace(', "some-declared-pkg"', ""))
    main.write_text("import undeclared_pkg_xyz\n")
    r = osmosis(osmosis_exe, "validate", "configs/eval/multiply-plain.toml", cwd=workspace, env=clean_env)
    assert r.returncode == 0
    assert "warn" in r.stdout
    assert "undeclared_pkg_xyz" in r.stdout
    assert "declare it in" in r.stdout
    # osmosis run cannot run without it, and says so in one line
    r = osmosis(osmosis_exe, "run", "configs/eval/multiply-plain.toml", "--stub-policy", cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert "needs the package 'undeclared_pkg_xyz'" in r.stderr
    assert "Traceback" not in r.stderr
    # any other import error still fails validate
    main.write_text("1 / 0\n")
    r = osmosis(osmosis_exe, "validate", "configs/eval/multiply-plain.toml", cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert "ZeroDivisionError" in r.stderr
    assert "main.py:1" in r.stderr


def test_every_command_has_help_with_an_example(osmosis_exe, clean_env, tmp_path):
    for command in (
        [],
        ["run"],
        ["validate"],
        ["plugins"],
        ["template"],
        ["template", "list"],
        ["template", "apply"],
    ):
        r = osmosis(osmosis_exe, *command, "--help", cwd=tmp_path, env=clean_env)
        assert r.returncode == 0
        assert "osmosis " in r.stdout.split("Options:")[0].split("\n", 2)[-1], command
        assert ("Example" in r.stdout) or ("Start here" in r.stdout), command


def test_failing_rollouts_carry_category_and_message(workspace, osmosis_exe, clean_env):
    main = workspace / "rollouts" / "multiply-plain" / "main.py"
    main.write_text(main.read_text().replace("messages.append(reply)", "messages.append(reply)\n            1 / 0"))
    data = workspace / "rollouts" / "multiply-plain" / "data" / "multiply.jsonl"
    rows = data.read_text().splitlines()
    rows[1] = json.dumps({"user_prompt": "3 * 4"})  # no label, and a grader is configured
    data.write_text("\n".join(rows) + "\n")
    r = osmosis(
        osmosis_exe,
        "run",
        "configs/eval/multiply-plain.toml",
        "--stub-policy",
        "--limit",
        "3",
        "--output",
        "out",
        cwd=workspace,
        env=clean_env,
    )
    assert r.returncode == 1
    assert "every rollout failed" in r.stderr
    results = lines(workspace / "out" / "results.jsonl")
    assert all(x["status"] == "failure" for x in results)
    assert {x["error"]["category"] for x in results} == {"agent_error"}
    assert "ZeroDivisionError" in results[0]["error"]["message"]
    assert "main.py:" in results[0]["error"]["message"]
    assert "agent_error 3" in r.stdout


def test_runs_started_in_the_same_second_get_their_own_folders(workspace, osmosis_exe, clean_env):
    for _ in range(3):
        r = osmosis(
            osmosis_exe,
            "run",
            "configs/eval/multiply-plain.toml",
            "--stub-policy",
            "--limit",
            "1",
            cwd=workspace,
            env=clean_env,
        )
        assert r.returncode == 0, r.stderr
    runs = sorted(p.name for p in (workspace / "runs").iterdir())
    assert len(runs) == 3
    assert all(len(lines(workspace / "runs" / n / "results.jsonl")) == 1 for n in runs)


def test_policy_header_values_are_secrets_too(workspace, osmosis_exe, clean_env):
    config = workspace / "configs" / "eval" / "multiply-plain.toml"
    config.write_text(
        config.read_text().replace("[run]", '[policy.headers]\nX-Gateway-Token = "gw-secret-123456"\n\n[run]')
    )
    with ScriptedPolicyServer() as server:
        r = osmosis(
            osmosis_exe,
            "run",
            "configs/eval/multiply-plain.toml",
            "--policy-url",
            server.url,
            "--limit",
            "1",
            "--output",
            "out",
            cwd=workspace,
            env=clean_env,
        )
    assert r.returncode == 0, r.stderr
    written = (workspace / "out" / "config.toml").read_text()
    assert "X-Gateway-Token" in written
    assert "gw-secret-123456" not in written
    from osmosis_core import PolicyEndpoint

    policy = PolicyEndpoint("http://x/v1", "m", api_key="k-1", headers={"X-Gateway-Token": "gw-secret-123456"})
    assert "gw-secret-123456" not in repr(policy)
    assert policy.secrets() == ("k-1", "gw-secret-123456")


def test_lines_are_not_wrapped_when_the_output_is_not_a_terminal(workspace, osmosis_exe, clean_env):
    """In a log or CI (no terminal, no COLUMNS) a long line stays one line that tools can grep."""
    env = {k: v for k, v in clean_env.items() if k not in ("COLUMNS", "LINES")}
    out = "runs/" + "a-rather-long-folder-name-" * 6 + "end"
    r = osmosis(osmosis_exe, "run", "configs/eval/multiply-plain.toml", "--stub-policy", "--limit", "2",
                "--output", out, cwd=workspace, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    [start] = [line for line in r.stdout.splitlines() if line.startswith("run ")]
    assert start.endswith("(osmosis-stub)")
    assert str(workspace / out) in start
    assert any(line.strip().endswith(f"{workspace / out}/results.jsonl │") for line in r.stdout.splitlines())


def test_policy_url_to_another_host_runs_without_the_configs_key(workspace, osmosis_exe, clean_env):
    """A config's key (api_key_env) is for its own base_url: a --policy-url on another host runs without it
    (one notice line; the variable need not even be set), as requests and curl drop credentials on a redirect
    to another host; --api-key-env sends it. The commonest first step: a workspace migrated from osmosis-ai
    (api.openai.com, OPENAI_API_KEY) pointed at a local server."""
    config = workspace / "configs" / "eval" / "multiply-plain.toml"
    text = config.read_text().replace('base_url = "http://127.0.0.1:8000/v1"', 'base_url = "https://api.openai.com/v1"')
    text = text.replace('# api_key_env = "OPENAI_API_KEY"', 'api_key_env = "OPENAI_API_KEY"')
    assert 'api_key_env = "OPENAI_API_KEY"' in text
    assert "api.openai.com" in text
    config.write_text(text)
    secret = "sk-config-key-0123456789abcdef"
    env = {k: v for k, v in clean_env.items() if k != "OPENAI_API_KEY"}
    with ScriptedPolicyServer() as server:
        base = ["run", "configs/eval/multiply-plain.toml", "--policy-url", server.url, "--limit", "2"]
        unset = osmosis(osmosis_exe, *base, "--output", "a", cwd=workspace, env=env)
        assert unset.returncode == 0, unset.stderr
        [notice] = [line for line in unset.stderr.splitlines() if line.startswith("notice:")]
        assert "another host than the config's base_url (api.openai.com:443)" in notice
        assert "$OPENAI_API_KEY" in notice
        assert "--api-key-env OPENAI_API_KEY" in notice
        assert len(server.requests) == 4
        assert not any(x.authorized for x in server.requests)
        assert "api_key_env" not in (workspace / "a" / "config.toml").read_text()
        # set or not, the key stays home
        withheld = osmosis(osmosis_exe, *base, "--output", "b", cwd=workspace, env={**env, "OPENAI_API_KEY": secret})
        assert withheld.returncode == 0, withheld.stderr
        assert "notice:" in withheld.stderr
        assert len(server.requests) == 8
        assert not any(x.authorized for x in server.requests)
        assert secret not in withheld.stdout + withheld.stderr
        # naming the variable on the command line says the key is meant for this host
        keyed = {**env, "OPENAI_API_KEY": secret}
        sent = osmosis(osmosis_exe, *base, "--api-key-env", "OPENAI_API_KEY", "--output", "c", cwd=workspace, env=keyed)
        assert sent.returncode == 0, sent.stderr
        assert "notice:" not in sent.stderr
        assert len(server.requests) == 12
        assert all(x.authorized for x in server.requests[8:])
    # a --policy-url on the config's own host (another path) keeps the config's key, as before
    with ScriptedPolicyServer(api_key=secret) as server:
        config.write_text(text.replace("https://api.openai.com/v1", server.url.rstrip("/") + "/"))
        same = osmosis(osmosis_exe, *base[:3], server.url, "--limit", "2", "--output", "d", cwd=workspace, env=keyed)
        assert same.returncode == 0, same.stderr
        assert "notice:" not in same.stderr
        assert len(server.requests) == 4
        assert all(x.authorized for x in server.requests)


@pytest.mark.parametrize("both", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_a_closed_output_does_not_stop_the_run(workspace, osmosis_exe, clean_env, tmp_path, both):
    """`osmosis run ... | head -1`: the reader goes after the first line; the run carries on, records
    every rollout and exits 0, with no traceback (nor Python's 'Exception ignored' at exit)."""
    stderr_file = tmp_path / "stderr.txt"
    with open(stderr_file, "w") as stderr:
        run = subprocess.Popen(
            [
                *(osmosis_exe, "run", "configs/eval/multiply-plain.toml", "--stub-policy"),
                *("--n-samples", "12", "--stub-latency", "0.02", "--output", "out"),
            ],
            cwd=workspace,
            env=clean_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if both else stderr,
        )
        assert run.stdout is not None
        head = subprocess.Popen(["head", "-1"], stdin=run.stdout, stdout=subprocess.PIPE, text=True)
        run.stdout.close()  # head holds the only read end: when it exits, the pipe is closed
        first, _ = head.communicate(timeout=60)
        returncode = run.wait(timeout=120)
    assert first.count("\n") == 1
    errors = stderr_file.read_text()
    assert returncode == 0, errors
    assert "Traceback" not in errors
    assert "Exception ignored" not in errors
    assert "BrokenPipe" not in errors
    out = workspace / "out"
    assert len(lines(out / "results.jsonl")) == 240
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 240
    assert summary["interrupted"] is False
