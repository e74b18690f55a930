"""`osmosis serve` as a user runs it: a real child process, real signals, its run folder and its logs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from server_helpers import HERE, REPO, TOKEN, ServeProcess, osmosis_exe, read_lines, run

from osmosis_server import RolloutStatus
from osmosis_trainer import RolloutClient, RolloutRequest


def config(
    tmp_path: Path, workflow: str = "Sleepy", grader: str = "EndsWithLabel", server: str = "", run: str = ""
) -> Path:
    path = tmp_path / "serve.toml"
    path.write_text(
        f"""
[rollout]
path = "{HERE}"
entrypoint = "workflows.py"
workflow = "{workflow}"
grader = "{grader}"

[run]
concurrency = 8
{run}

[server]
{server}
"""
    )
    return path


def serve_config(tmp_path: Path, *flags: str, server: str = "", log: str = "serve") -> ServeProcess:
    """``osmosis serve`` of :func:`config` (``server``: its [server] table) on a free port (unless
    ``flags`` name one), the run folder ``tmp_path/run``, the token TOKEN, stderr in ``<log>.log``."""
    port = () if "--port" in flags else ("--port", "0")
    return ServeProcess(
        [str(config(tmp_path, server=server)), *port, "--output", str(tmp_path / "run"), *flags],
        cwd=tmp_path,
        env={"OSMOSIS_SERVER_TOKEN": TOKEN},
        log=tmp_path / f"{log}.log",
    )


def request(rid: str, policy: str = "http://127.0.0.1:9/v1", **more) -> RolloutRequest:
    return RolloutRequest(
        rollout_id=rid,
        initial_messages=[{"role": "user", "content": "What is 6 times 7?"}],
        chat_completions_url=policy,
        **more,
    )


def osmosis(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "OSMOSIS_SERVER_TOKEN"}
    environment.update(env or {})
    return subprocess.run([osmosis_exe(), *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=60)


def test_sigterm_under_load_ends_every_admitted_rollout_and_records_it(tmp_path):
    served = serve_config(tmp_path, server="grace_sec = 1.5\nresult_wait_sec = 1.0")
    try:
        # 8 slots: 10 quick rollouts and 14 that would run for a minute; all polled by the client
        ids = [f"quick-{i}" for i in range(10)] + [f"long-{i}" for i in range(14)]

        async def go():
            client = RolloutClient(served.url, token=TOKEN)
            admissions = [
                await client.submit(
                    request(rid, label="42", metadata={"sleep": 0.2 if rid.startswith("quick") else 60})
                )
                for rid in ids
            ]
            polls = [asyncio.create_task(client.result(a)) for a in admissions]
            await asyncio.sleep(0.8)
            served.terminate(signal.SIGTERM)
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                refused = await http.post("/rollout", json=request("late").to_json())
                health = (await http.get("/health")).json()
            return refused, health, await asyncio.gather(*polls)

        refused, health, results = run(go)
        assert served.wait(60) == 0
    finally:
        served.kill()
    assert refused.status_code == 503
    assert "shutting down" in refused.json()["detail"]
    assert health["lifecycle"]["accepting_rollouts"] is False
    by_id = {r.rollout_id: r for r in results}
    assert sorted(by_id) == sorted(ids)
    assert all(by_id[f"quick-{i}"].status is RolloutStatus.SUCCESS for i in range(10))
    for i in range(14):
        result = by_id[f"long-{i}"]
        assert result.status is RolloutStatus.CANCELLED
        assert "the server shut down" in result.error.message
    lines = read_lines(tmp_path / "run" / "results.jsonl")
    assert sorted(line["rollout_id"] for line in lines) == sorted(ids)  # every admitted one, once
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["kind"] == "serve"
    assert meta["backend"] == "local"
    log = served.output()
    assert "SIGTERM received: draining" in log
    assert "grace period over: cancelling 14 rollouts" in log


_PARENT = """
import subprocess, sys, time
serve = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
for line in serve.stdout:
    if "listening on" in line:
        print(serve.pid, line.split("listening on ")[1].split()[0], flush=True)
        break
time.sleep(600)
"""


def test_with_watch_stdin_the_server_drains_and_stops_when_the_process_that_started_it_is_killed(tmp_path):
    """A trainer's script (or a test) that starts ``osmosis serve --watch-stdin`` and is killed with
    ``kill -9`` leaves no server behind: the server reads end-of-file on its stdin, drains as on
    SIGTERM (the running rollout recorded as cancelled) and exits."""
    args = [osmosis_exe(), "serve", str(config(tmp_path)), "--port", "0", "--output", str(tmp_path / "run")]
    args += ["--grace", "0.5", "--watch-stdin"]
    environment = {**os.environ, "OSMOSIS_SERVER_TOKEN": TOKEN}
    log = (tmp_path / "serve.log").open("w")
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, *args], cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=log,
        text=True,
    )  # fmt: skip
    server_pid = 0
    try:
        assert parent.stdout is not None
        pid, url = parent.stdout.readline().split()
        server_pid = int(pid)

        async def submit():
            client = RolloutClient(url, token=TOKEN)
            await client.submit(request("running", label="42", metadata={"sleep": 60}))

        run(submit)
        time.sleep(0.5)
        parent.kill()  # SIGKILL: no cleanup of the parent's runs
        parent.wait(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{server_pid}").exists():
            time.sleep(0.1)
        assert not Path(f"/proc/{server_pid}").exists(), "osmosis serve outlived the process that started it"
    finally:
        if server_pid and Path(f"/proc/{server_pid}").exists():
            os.kill(server_pid, signal.SIGKILL)
        parent.kill()
        log.close()
    [line] = read_lines(tmp_path / "run" / "results.jsonl")
    assert (line["rollout_id"], line["status"]) == ("running", "cancelled")
    assert "the server shut down" in line["error"]["message"]
    assert "SIGTERM received: draining" in (tmp_path / "serve.log").read_text()


def test_the_token_is_generated_into_a_private_file_and_no_secret_reaches_a_file_or_a_log(tmp_path):
    from osmosis_core.testing import ScriptedPolicyServer

    key = "sk-live-abcdefghijklmnop1234"
    cfg = config(tmp_path, workflow="Leaky")
    with ScriptedPolicyServer(api_key=key) as policy:
        served = ServeProcess(
            [str(cfg), "--port", "0", "--output", str(tmp_path / "run"), "--log-level", "debug"],
            cwd=tmp_path,
            log=tmp_path / "serve.log",
        )
        try:
            token_file = tmp_path / "run" / "server-token"
            assert str(token_file) in "".join(served.stdout)
            assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
            token = token_file.read_text().strip()
            assert len(token) >= 32

            async def go():
                client = RolloutClient(served.url, token=token)
                ok = await client.run(request("leak-ok", policy.url, llm_api_key=key, label="42"))
                bad = await client.run(
                    request("leak-bad", policy.url, llm_api_key=key, label="42", metadata={"fail": 1})
                )
                with pytest.raises(Exception, match="401"):
                    await RolloutClient(served.url, token="not-the-token-0123456789").health()
                return ok, bad

            ok, bad = run(go)
            served.terminate()
            assert served.wait(60) == 0
        finally:
            served.kill()
    assert ok.status is RolloutStatus.SUCCESS
    assert ok.reward == 1.0
    assert bad.status is RolloutStatus.FAILURE
    assert key not in bad.error.message
    lines = {line["rollout_id"]: line for line in read_lines(tmp_path / "run" / "results.jsonl")}
    assert "the key was ***" in json.dumps(lines["leak-ok"]["sample"])
    everything = served.output()
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file() and path.name != "server-token":
            everything += path.read_text(errors="replace")
    assert "rollout leak-ok" in everything  # the logs were captured
    assert token not in everything
    assert key not in everything


def test_a_provider_echoing_a_masked_key_and_a_header_prefix_leaves_no_fragment_in_a_file_or_the_log(tmp_path):
    """OpenAI answers a wrong key with its first 16 and last 4 characters; a gateway may echo a header
    value's head. No run of 8 characters of either reaches the run folder or the log (issue 16.5)."""
    from osmosis_core.testing import Fault, ScriptedPolicyServer

    key = "sk-proj-abcd1234EFGH5678ijkl9012MNOPqrst5678wxyz"
    header = "org-0123456789abcdefXYZ"
    echo = (
        f"Incorrect API key provided: {key[:16]}{'*' * (len(key) - 20)}{key[-4:]}; unknown organization {header[:16]}"
    )
    cfg = config(tmp_path, workflow="OneCall")
    cfg.write_text(cfg.read_text() + f'\n[policy.headers]\nOpenAI-Organization = "{header}"\n')
    with ScriptedPolicyServer() as policy:
        policy.inject(Fault("status", status=401, message=echo), times=10)
        served = ServeProcess(
            [str(cfg), "--port", "0", "--output", str(tmp_path / "run")], cwd=tmp_path, log=tmp_path / "serve.log"
        )
        try:
            token = (tmp_path / "run" / "server-token").read_text().strip()
            result = run(
                lambda: RolloutClient(served.url, token=token).run(request("echo", policy.url, llm_api_key=key))
            )
            served.terminate()
            assert served.wait(60) == 0
        finally:
            served.kill()
    assert result.status is RolloutStatus.FAILURE, result.error
    assert result.error.category.value == "policy_error", result.error
    assert "401" in result.error.message
    assert "Incorrect API key provided: ***" in result.error.message
    everything = served.output() + result.error.message
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file() and path.name != "server-token":
            everything += path.read_text(errors="replace")
    assert "rollout echo: failure (policy_error" in everything  # the log line was captured
    leaked = [
        f for secret in (key, header) for f in {secret[i : i + 8] for i in range(len(secret) - 7)} if f in everything
    ]
    assert not leaked, leaked


def test_no_auth_is_refused_off_loopback_and_served_on_it(tmp_path):
    cfg = config(tmp_path)
    refused = osmosis("serve", str(cfg), "--no-auth", "--host", "0.0.0.0", "--port", "0", cwd=tmp_path)
    assert refused.returncode == 1
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, refused.stderr
    assert "refusing to serve 0.0.0.0 without a token" in lines[0], refused.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started

    served = ServeProcess(
        [str(cfg), "--no-auth", "--port", "0", "--output", str(tmp_path / "run")],
        cwd=tmp_path,
        log=tmp_path / "serve.log",
    )
    try:
        result = run(lambda: RolloutClient(served.url).run(request("open", label="42")))
        served.terminate()
        assert served.wait(60) == 0
    finally:
        served.kill()
    assert result.reward == 1.0
    assert not (tmp_path / "run" / "server-token").exists()


def test_serve_reads_the_config_and_flags_as_run_does_and_fails_the_same_way(tmp_path):
    cfg = config(tmp_path, server="bogus = 1")
    bad_server = osmosis("serve", str(cfg), cwd=tmp_path)
    assert bad_server.returncode == 1
    assert "$.server" in bad_server.stderr
    assert "bogus" in bad_server.stderr
    cfg = config(tmp_path, run="bogus = 1")
    bad_run = osmosis("serve", str(cfg), cwd=tmp_path)
    ran = osmosis("run", str(cfg), "--stub-policy", cwd=tmp_path)
    assert bad_run.returncode == ran.returncode == 1
    assert "unknown key(s): bogus @ $.run" in bad_run.stderr
    assert "unknown key(s): bogus @ $.run" in ran.stderr
    cfg = config(tmp_path)
    unknown = osmosis("serve", str(cfg), "--backend", "nope", cwd=tmp_path)
    assert unknown.returncode == 2  # the flag's value: a usage error naming it, as osmosis run says it
    assert "Invalid value for '--backend': unknown backend 'nope'" in unknown.stderr
    usage = osmosis("serve", str(cfg), "--limit", "3", cwd=tmp_path)
    assert usage.returncode == 2
    assert "--limit has no meaning for serve" in usage.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = osmosis("serve", str(cfg), "--port", str(port), "--output", str(tmp_path / "r"), cwd=tmp_path)
    assert busy.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in busy.stderr


def test_serve_the_multiply_training_config_with_server_table_and_flags(tmp_path, policy_server):
    training = REPO / "configs" / "training" / "multiply-plain.toml"
    served = ServeProcess(
        [str(training), "--port", "0", "--output", str(tmp_path / "run")],
        cwd=tmp_path,
        env={"OSMOSIS_SERVER_TOKEN": TOKEN},
        log=tmp_path / "serve.log",
    )
    try:
        rows = [(3, 4), (12, 12), (333, 972), (7, 8)]

        async def go():
            client = RolloutClient(served.url, token=TOKEN)
            requests = [
                RolloutRequest(
                    rollout_id=f"mul-{i}-{k}",
                    initial_messages=[
                        {"role": "system", "content": "Use the multiply tool, then answer as: #### <number>"},
                        {"role": "user", "content": f"val1 = {a}\nval2 = {b}"},
                    ],
                    chat_completions_url=policy_server.url,
                    label=str(a * b),
                    row=i,
                    sample_index=k,
                )
                for i, (a, b) in enumerate(rows)
                for k in range(2)
            ]
            health = await client.health()
            return health, [r async for r in client.run_many(requests, concurrency=8)]

        health, results = run(go)
        served.terminate()
        assert served.wait(60) == 0
    finally:
        served.kill()
    assert health["max_concurrency"] == 32  # [run] concurrency of the training config
    assert len(results) == 8, results
    assert all(r.reward == 1.0 for r in results), results
    assert all(r.sample.metrics["turns"] == 2 for r in results)  # a tool call, then the answer
    lines = read_lines(tmp_path / "run" / "results.jsonl")
    assert sorted((line["row"], line["sample_index"]) for line in lines) == [(i, k) for i in range(4) for k in range(2)]

    # the same rollout with a [server] table, one setting overridden by a flag
    cfg = tmp_path / "configs" / "training" / "with-server.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(
        training.read_text().replace(
            'path = "rollouts/multiply-plain"', f'path = "{REPO / "rollouts" / "multiply-plain"}"'
        )
        + "\n[server]\nlease_timeout_sec = 45\nresult_wait_sec = 5\nmax_queued = 7\n"
    )
    served = ServeProcess(
        [str(cfg), "--port", "0", "--max-queued", "3"],
        cwd=tmp_path,
        env={"OSMOSIS_SERVER_TOKEN": TOKEN},
        log=tmp_path / "serve2.log",
    )
    try:

        async def admit():
            client = RolloutClient(served.url, token=TOKEN)
            admission = await client.submit(request("one", policy_server.url, label="42"))
            return admission, await client.health(), await client.result(admission)

        admission, health, _ = run(admit)
        served.terminate()
        assert served.wait(60) == 0
    finally:
        served.kill()
    assert (admission.lease_timeout_sec, admission.result_wait_sec) == (45.0, 5.0)
    assert health["server"]["capacity"] == 32 + 3
    [folder] = list((tmp_path / "runs").iterdir())  # the default run folder: runs/<config>-serve-<timestamp>
    assert folder.name.startswith("with-server-serve-")
    assert (folder / "results.jsonl").is_file()


def test_a_run_folder_in_use_is_refused(tmp_path):
    served = serve_config(tmp_path)
    cfg = tmp_path / "serve.toml"
    try:
        second = osmosis(
            "serve",
            str(cfg),
            "--port",
            "0",
            "--output",
            str(tmp_path / "run"),
            cwd=tmp_path,
            env={"OSMOSIS_SERVER_TOKEN": TOKEN},
        )
        served.terminate()
        assert served.wait(60) == 0
    finally:
        served.kill()
    assert second.returncode == 1
    assert "is in use by another osmosis process" in second.stderr


def test_serve_help_lists_only_the_flags_serve_takes(tmp_path):
    """`osmosis run`'s --dataset, --limit, --n-samples and --policy-url mean nothing to a server (each
    request brings its prompt and its policy endpoint): its --help does not offer them, and given anyway
    they are refused with that reason; without CONFIG it is click's own missing argument."""
    helped = osmosis("serve", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    for flag in ("--dataset", "--limit", "--n-samples", "--policy-url"):
        assert flag not in helped.stdout
        refused = osmosis("serve", str(config(tmp_path)), flag, "x", cwd=tmp_path)
        assert refused.returncode == 2
        assert f"{flag} has no meaning for serve: each request brings its prompt and its policy endpoint" in (
            refused.stderr
        )
    for flag in ("--backend", "--concurrency", "--workers", "--model", "--api-key-env", "--output", "--port"):
        assert flag in helped.stdout
    missing = osmosis("serve", cwd=tmp_path)
    assert missing.returncode == 2
    assert "Missing argument 'CONFIG'" in missing.stderr
    assert "invalid config" not in missing.stderr
