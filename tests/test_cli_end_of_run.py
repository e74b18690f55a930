"""How `osmosis run` ends: what the summary says of each error category, what the `--retry-failed` hint
names, and a signal that comes as the run finishes. Real subprocesses, real HTTP, real signals."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from osmosis_core.testing import Fault, ScriptedPolicyServer

KEY = "sk-summary-key-0123456789abcdef"


def osmosis(exe: str, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=90)


def break_row(workspace: Path, operand: str) -> None:
    """The example's workflow raises (agent_error) on the row whose prompt holds ``operand``."""
    main = workspace / "rollouts" / "multiply-plain" / "main.py"
    text = main.read_text()
    anchor = "        messages: list[dict[str, Any]] = list(ctx.prompt)\n"
    assert anchor in text
    breaks = (
        f"        if {operand!r} in ctx.user_prompt:\n            raise RuntimeError('this row breaks the agent')\n"
    )
    main.write_text(text.replace(anchor, anchor + breaks))


def test_the_summary_shows_each_categorys_most_common_message_and_the_hint_names_what_to_retry(
    workspace, osmosis_exe, clean_env
):
    """Five rows, one at a time: two 503s, a broken row, a 500, one success. The table says why, one line
    per category (the key the server echoed redacted); the hint's commands run as printed."""
    break_row(workspace, "val1 = 668")  # the third row
    config = workspace / "configs" / "eval" / "multiply-plain.toml"
    config.write_text(
        config.read_text().replace("pass_threshold = 1.0", "pass_threshold = 1.0\nmax_failure_rate = 0.5")
    )
    env = {**clean_env, "MY_KEY": KEY}
    with ScriptedPolicyServer(model="Qwen/Qwen3-8B") as server:
        server.inject(Fault("status", status=503, message=f"the model is overloaded (key {KEY})"), times=2)
        server.inject(Fault("status", status=500, message="out of memory"), times=1)
        args = ["run", str(config), "--policy-url", server.url, "--api-key-env", "MY_KEY", "--limit", "5"]
        r = osmosis(osmosis_exe, *args, "--concurrency", "1", "--output", "out", cwd=workspace, env=env)
        assert r.returncode == 1, r.stderr
        url = server.url
        [errors_row] = [line for line in r.stdout.splitlines() if "agent_error 1" in line]
        assert "errors" in errors_row
        assert "agent_error 1: RuntimeError: this row breaks the agent (at main.py:" in errors_row
        [policy_row] = [line for line in r.stdout.splitlines() if "policy_error 3" in line]
        assert (
            f"policy_error 3 (2 alike): policy endpoint {url}/chat/completions answered 503: the model is overloaded"
            " (key ***)" in policy_row
        )
        everything = r.stdout + r.stderr + (workspace / "out" / "summary.json").read_text()
        assert KEY[:8] not in everything
        assert KEY[-8:] not in everything
        summary = json.loads((workspace / "out" / "summary.json").read_text())
        assert summary["errors_by_category"] == {"agent_error": 1, "policy_error": 3}
        assert summary["error_messages"]["policy_error"]["count"] == 2
        assert "answered 503: the model is overloaded (key ***)" in summary["error_messages"]["policy_error"]["message"]
        assert summary["error_messages"]["agent_error"]["count"] == 1

        # the hint: --retry-failed's default takes policy_error, not agent_error (a bug fails the same way twice)
        [line] = [line for line in r.stderr.splitlines() if line.startswith("run failed:")]
        assert "4 of 5 rollouts failed" in line
        hint = line.split("results.jsonl; ", 1)[1]
        assert hint.startswith("run the policy_error failures again with: osmosis run ")
        default, everything_cmd = hint.split(" with: ", 1)[1].split(" (agent_error too, once the cause is fixed: ")
        assert default.endswith(f"--output {workspace / 'out'} --retry-failed")
        assert everything_cmd.endswith(f"--output {workspace / 'out'} --retry-failed agent_error,policy_error)")
        # the commands run as printed (paths are the ones given; the server is still there)
        retried = osmosis(osmosis_exe, *shlex.split(default)[1:], cwd=workspace, env=env)
        assert retried.returncode == 0, retried.stderr  # the broken row still fails: 1 of 5, under the rate
        assert "3 of them again" in retried.stdout.replace("\n", " ")
    assert json.loads((workspace / "out" / "summary.json").read_text())["errors_by_category"] == {"agent_error": 1}


def test_a_hint_for_categories_the_default_does_not_retry_names_them(workspace, osmosis_exe, clean_env):
    main = workspace / "rollouts" / "multiply-plain" / "main.py"
    break_row(workspace, "val")  # every row
    args = ["run", "configs/eval/multiply-plain.toml", "--stub-policy", "--limit", "2", "--output", "out"]
    r = osmosis(osmosis_exe, *args, cwd=workspace, env=clean_env)
    assert r.returncode == 1, r.stderr
    [line] = [line for line in r.stderr.splitlines() if line.startswith("run failed:")]
    assert "run failed: every rollout failed (2 of 2: agent_error 2)" in line
    hint = line.split("results.jsonl; ", 1)[1]
    assert hint.startswith(
        "--retry-failed does not run agent_error again by default (a second attempt tends to fail the same way);"
        " once the cause is fixed: osmosis run "
    )
    assert hint.endswith(f"--output {workspace / 'out'} --retry-failed agent_error")
    main.write_text(main.read_text().replace("raise RuntimeError", "pass  # RuntimeError"))  # the fix
    command = shlex.split(hint.split("once the cause is fixed: ")[1])
    fixed = osmosis(osmosis_exe, *command[1:], cwd=workspace, env=clean_env)
    assert fixed.returncode == 0, fixed.stderr
    assert "2 (2 ok, 0 failed)" in fixed.stdout


@pytest.mark.parametrize(
    ("signum", "delay"),
    [(signal.SIGINT, 0.0), (signal.SIGTERM, 0.02), (signal.SIGINT, 0.06)],
    ids=["sigint-at-once", "sigterm-20ms", "sigint-60ms"],
)
def test_a_signal_as_the_run_finishes_changes_nothing(workspace, osmosis_exe, clean_env, signum, delay):
    """SIGINT / SIGTERM to the process group just after the last rollout's result (as a terminal's Ctrl-C
    or systemd sends it): nothing is left to cancel, so the run is complete and says so; the summary table
    is printed, nothing about cancelling follows it, and the exit status is the run's. (Before: in the
    wind-down the signal went to Python's default handler: exit 130 or death by SIGTERM without the table,
    and sometimes a process that never exited, its interpreter waiting on a worker thread.)"""
    args = ["run", "configs/eval/multiply-plain.toml", "--stub-policy", "--limit", "4", "--output", "out"]
    proc = subprocess.Popen(
        [osmosis_exe, *args],
        cwd=workspace,
        env=clean_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # a line at most every 5 s, and one when the last result is in
        seen.append(line)
        if line.startswith("rollouts 4/4"):
            time.sleep(delay)
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:  # (already gone: nothing to see)
                pass
            break
    try:
        rest, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the run did not exit within 30 s of the signal") from None
    output = "".join(seen) + rest
    assert proc.returncode == 0, output
    assert "osmosis run summary" in output
    assert "(interrupted)" not in output
    assert "cancelling" not in output.split("osmosis run summary", 1)[1]
    assert "interrupted" not in output.split("osmosis run summary", 1)[1]
    summary = json.loads((workspace / "out" / "summary.json").read_text())
    assert (summary["finished"], summary["interrupted"]) == (4, False)


def test_the_cancelling_notice_comes_before_the_summary_in_a_log(workspace, osmosis_exe, clean_env):
    """stdout and stderr into one log (`osmosis run ... > log 2>&1`, CI, systemd), Ctrl-C mid-run: the
    notice is where it happened, before the table. (Before: stderr was buffered once the CLI made its
    streams survive a closed reader, and the notice came out at exit, after the summary table.)"""
    args = ["run", "configs/eval/multiply-plain.toml", "--stub-policy", "--stub-latency", "0.1", "--concurrency", "2"]
    log = workspace / "log.txt"
    with log.open("w") as handle:
        command = [osmosis_exe, *args, "--output", "out"]
        proc = subprocess.Popen(
            command, cwd=workspace, env=clean_env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        results = workspace / "out" / "results.jsonl"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not results.exists() or results.read_text().count("\n") < 2):
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    text = log.read_text()
    notice = text.index("interrupted: cancelling the rollouts in flight (again to stop at once)")
    table = text.index("osmosis run summary (interrupted)")
    assert notice < table, text
    assert "cancelling the rollouts" not in text[table:]
    assert "finish with: osmosis run" in text[table:]  # what to run next, after the table
