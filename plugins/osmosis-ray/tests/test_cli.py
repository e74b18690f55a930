"""``osmosis run --backend ray`` as a user runs it: real CLI processes, real signals, real clusters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from ray_helpers import FAULTS, OSMOSIS, REPO, osmosis, results, write_dataset


def _by_pair(lines: list[dict]) -> dict[tuple[int, int], dict]:
    return {(line["row"], line["sample_index"]): line for line in lines}


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline[:120]}")
    return found


def test_the_plain_example_through_backend_ray_gives_the_results_of_local_and_stops_its_cluster(cluster, tmp_path):
    """No address: the run starts a local cluster of its own, ships main.py to it, and stops it at the end.
    The cluster has Ray's token auth on, with the token in its processes' environment: nothing is
    written to ~/.ray."""
    config = REPO / "configs" / "eval" / "multiply-plain.toml"
    own = cluster.tmp / "e2e"  # this run's Ray files (and processes) are told apart by this folder
    home = tmp_path / "home"
    home.mkdir()
    env = {"RAY_TMPDIR": str(own), "HOME": str(home), "RAY_AUTH_MODE": ""}  # as on a machine that never ran Ray
    ray_run = osmosis(
        "run", str(config), "--stub-policy", "--backend", "ray", "--output", str(tmp_path / "ray"),
        cwd=tmp_path, env=env, timeout=400,
    )  # fmt: skip
    assert ray_run.returncode == 0, ray_run.stdout[-3000:] + ray_run.stderr[-3000:]
    assert "on backend 'ray'" in ray_run.stdout
    assert list(home.iterdir()) == []  # no ~/.ray/auth_token
    assert "Token authentication is disabled" not in ray_run.stdout + ray_run.stderr
    local_run = osmosis("run", str(config), "--stub-policy", "--output", str(tmp_path / "local"), cwd=tmp_path)
    assert local_run.returncode == 0, local_run.stderr[-3000:]
    on_ray, on_local = _by_pair(results(tmp_path / "ray")), _by_pair(results(tmp_path / "local"))
    assert len(on_ray) == len(on_local) == 20
    assert sorted(on_ray) == sorted(on_local)
    for pair, line in on_local.items():
        other = on_ray[pair]
        assert (other["status"], other["reward"], other["error"]) == (line["status"], line["reward"], line["error"])
        shape = [(m.get("role"), m.get("content")) for m in line["sample"]["messages"]]
        assert [(m.get("role"), m.get("content")) for m in other["sample"]["messages"]] == shape, pair
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert summary["finished"] == 20, summary
    assert summary["failed"] == 0, summary
    assert (own / "ray").is_dir()  # the cluster really ran under its own folder ...
    deadline = time.monotonic() + 20
    while _processes_mentioning(str(own)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_mentioning(str(own))  # ... and aclose() stopped every process of it


def _config(tmp_path: Path, address: str, rows: int, marks: Path, starts: Path) -> Path:
    data = write_dataset(
        tmp_path / "rows.jsonl",
        [
            {"user_prompt": f"val1 = {i + 2}\nval2 = 3", "ground_truth": str((i + 2) * 3), "do": "sleep:1.0"}
            for i in range(rows)
        ],
    )
    config = tmp_path / "run.toml"
    config.write_text(
        f"""
[rollout]
path = "{FAULTS}"

[dataset]
path = "{data}"

[run]
backend = "ray"
concurrency = 4
agent_timeout_sec = 60
grader_timeout_sec = 30

[backend.ray]
address = "{address}"
actors = 2

[backend.ray.runtime_env]
env_vars = {{ OSMOSIS_RAY_TEST_MARKS = "{marks}", OSMOSIS_RAY_TEST_STARTS = "{starts}" }}
"""
    )
    return config


def _running(starts: Path, out: Path) -> set[str]:
    """The rollouts that started on an actor (``<rollout id>.<pid>`` marks) and have no result line yet."""
    started = {p.name.rsplit(".", 1)[0] for p in starts.glob("*.*")}
    return started - {line["rollout_id"] for line in results(out)}


def _interrupt(
    config: Path, out: Path, starts: Path, sig: signal.Signals, *, after: int, resume: bool
) -> subprocess.CompletedProcess[str]:
    """Run, wait for ``after`` more results than the folder holds and a rollout running on an actor,
    send ``sig``; the finished process. (A signal sent the moment a batch finishes can find the next
    batch still on its way to the actors, with nothing to cancel there.)"""
    before, earlier = len(results(out)), _running(starts, out)  # an earlier run's cancelled rollouts
    args = [OSMOSIS, "run", str(config), "--stub-policy", "--output", str(out), *(["--resume"] if resume else [])]
    proc = subprocess.Popen(args, cwd=config.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (
            (len(results(out)) < before + after or not _running(starts, out) - earlier)
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def test_ctrl_c_and_sigterm_cancel_the_rollouts_on_the_actors_and_resume_runs_exactly_what_is_missing(
    cluster, tmp_path
):
    rows = 24
    marks, starts = tmp_path / "marks", tmp_path / "starts"
    config = _config(tmp_path, cluster.address, rows, marks, starts)
    out = tmp_path / "run"

    first = _interrupt(config, out, starts, signal.SIGINT, after=4, resume=False)
    assert first.returncode == 130, first.stderr[-3000:]
    assert "--resume" in first.stderr
    done = results(out)
    cancelled = {p.name.removesuffix(".cancelled") for p in marks.glob("*.cancelled")}
    running = _running(starts, out)
    assert cancelled, f"the rollouts in flight were not cancelled on the actors: {sorted(running)} ran"
    assert cancelled <= running, (cancelled, running)  # each cancelled rollout had started, none had a result
    assert all(line["status"] == "success" for line in done)  # nothing cancelled is recorded ...
    assert not cancelled & {line["rollout_id"] for line in done}  # ... and nothing recorded was cancelled

    second = _interrupt(config, out, starts, signal.SIGTERM, after=4, resume=True)
    assert second.returncode == 130, second.stderr[-3000:]
    assert len(results(out)) > len(done)

    last = osmosis("run", str(config), "--stub-policy", "--output", str(out), "--resume", cwd=tmp_path)
    assert last.returncode == 0, last.stdout[-2000:] + last.stderr[-3000:]
    lines = results(out)
    pairs = [(line["row"], line["sample_index"]) for line in lines]
    assert sorted(pairs) == [(i, 0) for i in range(rows)], pairs  # each row exactly once over three runs
    assert all(line["status"] == "success" and line["reward"] == 1.0 for line in lines)
    assert len(list(marks.glob("*.cancelled"))) > len(cancelled)  # the SIGTERM run cancelled its own in-flight ones too


def test_workers_sets_the_number_of_actors(cluster, tmp_path):
    """``--workers N`` with ``--backend ray`` means N actors (each a process), as it means N processes locally.

    Half a CPU per actor: without the flag the two-CPU cluster would get four actors.
    """
    rows = [
        {"user_prompt": f"val1 = {i + 2}\nval2 = 3", "ground_truth": str(3 * (i + 2)), "do": "sleep:0.5"}
        for i in range(8)
    ]
    data = write_dataset(tmp_path / "rows.jsonl", rows)
    config = tmp_path / "run.toml"
    config.write_text(
        f'[rollout]\npath = "{FAULTS}"\n[dataset]\npath = "{data}"\n'
        f'[backend.ray]\naddress = "{cluster.address}"\ncpus_per_actor = 0.5\n'
    )
    run = osmosis(
        "run", str(config), "--stub-policy", "--backend", "ray", "--workers", "2", "--concurrency", "8",
        "--output", str(tmp_path / "out"), cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "up to 8 at once" in run.stdout, run.stdout
    lines = results(tmp_path / "out")
    assert len(lines) == 8
    assert all(line["status"] == "success" and line["reward"] == 1.0 for line in lines)
    pids = {line["metrics"]["pid"] for line in lines}
    assert len(pids) == 2, pids
    assert os.getpid() not in pids, pids


@pytest.mark.together
def test_osmosis_serve_runs_rollouts_on_ray_and_a_cancel_from_the_server_reaches_the_actor(cluster, policy, tmp_path):
    """``osmosis serve --backend ray``, the cluster found through $RAY_ADDRESS; a trainer's client drives it."""
    pytest.importorskip("osmosis_server")
    import re
    import threading

    import anyio

    from osmosis_core.http import http_scope
    from osmosis_trainer import RolloutClient, RolloutRequest

    token = "ray-test-token-0123456789abcdef"
    marks = tmp_path / "marks"
    data = write_dataset(tmp_path / "rows.jsonl", [{"user_prompt": "val1 = 2\nval2 = 3", "ground_truth": "6"}])
    config = tmp_path / "serve.toml"
    config.write_text(
        f'[rollout]\npath = "{FAULTS}"\n[dataset]\npath = "{data}"\n[run]\nconcurrency = 4\n'
        f'[backend.ray]\nactors = 2\n[backend.ray.runtime_env]\nenv_vars = {{ OSMOSIS_RAY_TEST_MARKS = "{marks}" }}\n'
    )
    env = {**os.environ, "OSMOSIS_SERVER_TOKEN": token, "RAY_ADDRESS": cluster.address}
    args = [OSMOSIS, "serve", str(config), "--backend", "ray", "--port", "0", "--output", str(tmp_path / "run")]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        url = ""
        assert proc.stdout is not None
        for line in proc.stdout:
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url, (tmp_path / "serve.log").read_text()[-3000:]
        threading.Thread(target=proc.stdout.read, daemon=True).start()

        def req(rid: str, a: int, **metadata: str) -> RolloutRequest:
            return RolloutRequest(
                rollout_id=rid,
                initial_messages=[{"role": "user", "content": f"val1 = {a}\nval2 = 5"}],
                chat_completions_url=policy.url,
                label=str(a * 5),
                metadata=metadata,
            )

        async def go() -> tuple[dict, list, Any, dict]:
            async with http_scope():
                client = RolloutClient(url, token=token)
                done = [r async for r in client.run_many([req(f"s{i}", i + 2) for i in range(4)], concurrency=4)]
                long = await client.submit(req("long", 9, do="sleep:60"))
                health = await client.health()
                await anyio.sleep(1.5)
                dispositions = await client.cancel(["long"])
                return dispositions, done, await client.result(long), health

        dispositions, done, cancelled, health = anyio.run(go)
        proc.terminate()
        assert proc.wait(60) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert sorted(r.rollout_id for r in done) == ["s0", "s1", "s2", "s3"]
    assert all(r.reward == 1.0 for r in done)
    assert dispositions == {"long": "cancelled_running"}, cancelled
    assert cancelled.status.value == "cancelled", cancelled
    assert (marks / "long.cancelled").is_file()  # the server's cancel reached the workflow on its actor
    text = json.dumps(health)
    assert cluster.address in text, health
    assert '"actors"' in text, health
