"""The run folder under faults: one writer at a time, failures re-run on request, bad files named by line.

Everything runs `osmosis run` as a user does (real subprocesses, real HTTP to the scripted server).
"""

from __future__ import annotations

import json
import subprocess
import time
import tracemalloc
from pathlib import Path

import pytest

from osmosis_core._engine.results import latest_records as _latest_records
from osmosis_core.testing import Fault, ScriptedPolicyServer

RUN = ["run", "configs/eval/multiply-plain.toml"]


def osmosis(exe: str, *args: str, cwd: Path, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_second_writer_of_a_run_folder_is_refused_with_one_line(workspace, osmosis_exe, clean_env):
    args = [*RUN, "--stub-policy", "--stub-latency", "0.6", "--concurrency", "2", "--output", "out"]
    first = subprocess.Popen([osmosis_exe, *args], cwd=workspace, env=clean_env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    results = workspace / "out" / "results.jsonl"
    deadline = time.monotonic() + 30
    while not (results.exists() and results.read_text().count("\n") >= 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    second = osmosis(osmosis_exe, *args, "--resume", cwd=workspace, env=clean_env)
    assert second.returncode == 1
    assert "is in use by another osmosis process (pid" in second.stderr
    assert "Traceback" not in second.stderr
    assert str(first.pid) in second.stderr
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    done = lines(results)
    assert len(done) == 20
    assert len({(x["row"], x["sample_index"]) for x in done}) == 20  # no pair twice
    # the kernel released the lock with the first run: the folder can be resumed (nothing left to do)
    again = osmosis(osmosis_exe, *args, "--resume", cwd=workspace, env=clean_env)
    assert again.returncode == 0
    assert "0 to run" in again.stdout


def test_failed_rollouts_are_run_again_on_request_and_counted_once(workspace, osmosis_exe, clean_env):
    with ScriptedPolicyServer() as server:
        server.inject(Fault("status", status=503), times=40)  # every call of the first run
        base = [*RUN, "--policy-url", server.url, "--limit", "6", "--output", "out"]
        first = osmosis(osmosis_exe, *base, cwd=workspace, env=clean_env)
        assert first.returncode == 1, first.stderr  # every rollout failed: a CI job must see it
        assert "run failed: every rollout failed (6 of 6: policy_error 6)" in first.stderr
        assert "--retry-failed" in first.stderr
        server.clear()
        nothing = osmosis(osmosis_exe, *base, "--retry-failed", "agent_error", cwd=workspace, env=clean_env)
        assert nothing.returncode == 1
        assert "0 to run" in nothing.stdout  # only the categories named
        retried = osmosis(osmosis_exe, *base, "--retry-failed", cwd=workspace, env=clean_env)
    assert retried.returncode == 0, retried.stderr
    assert "6 to run, 6 of them again" in retried.stdout
    records = lines(workspace / "out" / "results.jsonl")
    assert len(records) == 12  # the earlier records stay readable
    assert [x["status"] for x in records[:6]] == ["failure"] * 6
    assert [x["reward"] for x in records[6:]] == [1.0] * 6
    summary = json.loads((workspace / "out" / "summary.json").read_text())
    assert summary["finished"] == 6
    assert summary["failed"] == 0
    assert summary["mean_reward"] == 1.0  # latest only
    bad = osmosis(osmosis_exe, *base, "--retry-failed", "policy_eror", cwd=workspace, env=clean_env)
    assert bad.returncode == 2
    assert "policy_eror is not an error category" in bad.stderr


def test_a_failure_rate_over_the_limit_fails_the_run(workspace, osmosis_exe, clean_env):
    config = workspace / "configs" / "eval" / "multiply-plain.toml"
    config.write_text(config.read_text().replace("[run]", "[run]\nmax_failure_rate = 0.25"))
    with ScriptedPolicyServer() as server:
        server.inject(Fault("status", status=500), times=2)  # two of the first calls: two rollouts of 4
        over = osmosis(osmosis_exe, *RUN, "--policy-url", server.url, "--limit", "4", "--concurrency", "1",
                       "--output", "a", cwd=workspace, env=clean_env)  # fmt: skip
        server.inject(Fault("status", status=500), times=1)
        under = osmosis(osmosis_exe, *RUN, "--policy-url", server.url, "--limit", "4", "--concurrency", "1",
                        "--output", "b", cwd=workspace, env=clean_env)  # fmt: skip
    assert over.returncode == 1
    assert "2 of 4 rollouts failed (50.0%, over [run] max_failure_rate 25.0%" in over.stderr
    assert under.returncode == 0, under.stderr


def test_a_damaged_results_line_is_named_by_its_line_number(workspace, osmosis_exe, clean_env):
    args = [*RUN, "--stub-policy", "--limit", "3", "--output", "out"]
    assert osmosis(osmosis_exe, *args, cwd=workspace, env=clean_env).returncode == 0
    results = workspace / "out" / "results.jsonl"
    kept = results.read_text().splitlines()
    results.write_text("\n".join([kept[0], '{"rollout_id": "x", "status": "success"}', kept[2]]) + "\n")
    r = osmosis(osmosis_exe, *args, "--resume", cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert f"{results}:2: not a result line (missing row, sample_index)" in r.stderr
    results.write_text("\n".join([kept[0], kept[1], "{not json"]) + "\n")
    r = osmosis(osmosis_exe, *args, "--resume", cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert f"{results}:3: not a JSON line" in r.stderr
    # a line with the keys, read through the records' converter: the field that is wrong is named
    odd = json.loads(kept[1]) | {"status": "failure", "error": {"category": "oops", "message": "m"}}
    results.write_text("\n".join([kept[0], json.dumps(odd), kept[2]]) + "\n")
    r = osmosis(osmosis_exe, *args, "--resume", cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert f"{results}:2: not a result line (expected one of timeout," in r.stderr
    assert "got 'oops' @ $.error.category)" in r.stderr


def test_resume_reads_a_large_results_file_as_a_stream(tmp_path):
    """A resumed run keeps per pair only what its summary needs, never the samples."""
    results = tmp_path / "results.jsonl"
    big = "x" * (2 << 20)
    with results.open("w") as handle:
        for row in range(30):  # 60 MB of samples
            line = {"row": row, "sample_index": 0, "status": "success", "reward": 1.0, "timings": {"workflow": 0.1}}
            handle.write(json.dumps({**line, "sample": {"messages": [{"role": "assistant", "content": big}]}}) + "\n")
    tracemalloc.start()
    latest = _latest_records(results)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(latest) == 30
    assert all(x.reward == 1.0 for x in latest.values())
    print(f"\nresume over a {results.stat().st_size >> 20} MB results file: peak {peak >> 20} MB traced")
    assert peak < 20 << 20  # about one line at a time, not the file


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"user_prompt": "caf\xe9"}\n', ":2: not UTF-8 text (byte 0xe9 at column 21)"),
        (b"[" * 100 + b"]" * 100 + b"\n", ":2: expected a JSON object"),
        (b'{"user_prompt": "x", "deep": ' + b"[" * 200 + b"]" * 200 + b"}\n", ":2: the row is nested more than 64"),
        (b'{"user_prompt": "x", "deep": ' + b"[" * 100000 + b"]" * 100000 + b"}\n", ":2: the row is nested too deeply"),
    ],
)
def test_a_bad_dataset_line_is_named_by_its_line(workspace, osmosis_exe, clean_env, content, problem):
    data = workspace / "bad.jsonl"
    data.write_bytes(b'{"user_prompt": "1 * 2", "ground_truth": "2"}\n' + content)
    r = osmosis(osmosis_exe, *RUN, "--stub-policy", "--dataset", "bad.jsonl", cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "RecursionError" not in r.stderr
    assert f"{data}{problem}" in r.stderr


def test_a_config_that_is_not_utf8_is_named_by_its_line(workspace, osmosis_exe, clean_env):
    config = workspace / "configs" / "eval" / "multiply-plain.toml"
    config.write_bytes(config.read_bytes().replace(b"[run]", b"# caf\xe9\n[run]"))
    r = osmosis(osmosis_exe, *RUN, "--stub-policy", cwd=workspace, env=clean_env)
    line = config.read_bytes().split(b"caf")[0].count(b"\n") + 1
    assert r.returncode == 1
    assert f"multiply-plain.toml:{line}: invalid config" in r.stderr
    assert "not UTF-8" in r.stderr


STRAY_EXITS = """
class Workflow(MultiplyWorkflow):
    async def run(self, ctx):
        import asyncio, sys
        how = ctx.user_prompt.split()[0]
        if how == "cancel":
            raise asyncio.CancelledError()
        if how == "exit":
            sys.exit(3)
        if how == "interrupt":
            raise KeyboardInterrupt
        return await super().run(ctx)
"""


def run_own_classes(
    workspace: Path, osmosis_exe: str, clean_env: dict[str, str], code: str, names: str, prompts: list[str]
) -> tuple[subprocess.CompletedProcess, dict[int, dict]]:
    """``osmosis run`` of the example with ``code`` added to its main.py and the run config naming
    its classes (``names``, e.g. ``workflow = "Workflow"``), over ``prompts`` (each labelled 6);
    and its results by row, read as strict JSON (no NaN, no Infinity)."""
    main = workspace / "rollouts" / "multiply-plain" / "main.py"
    main.write_text(main.read_text() + code)
    config = workspace / "configs" / "eval" / "multiply-plain.toml"
    config.write_text(config.read_text().replace('entrypoint = "main.py"', f'entrypoint = "main.py"\n{names}'))
    data = workspace / "own.jsonl"
    data.write_text("".join(json.dumps({"user_prompt": p, "ground_truth": "6"}) + "\n" for p in prompts))
    r = osmosis(osmosis_exe, *RUN, "--stub-policy", "--dataset", "own.jsonl", "--output", "out",
                cwd=workspace, env=clean_env, timeout=60)  # fmt: skip
    text = (workspace / "out" / "results.jsonl").read_text() if r.returncode in (0, 1) else ""
    return r, {x["row"]: x for x in (json.loads(line, parse_constant=pytest.fail) for line in text.splitlines())}


def test_a_workflow_that_raises_cancel_exit_or_interrupt_fails_only_its_rollout(workspace, osmosis_exe, clean_env):
    prompts = ["cancel", "exit", "interrupt", "val1 = 2\nval2 = 3"]
    r, records = run_own_classes(workspace, osmosis_exe, clean_env, STRAY_EXITS, 'workflow = "Workflow"', prompts)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert sorted(records) == [0, 1, 2, 3]  # every rollout is recorded, the run went on
    assert records[0]["error"]["category"] == "agent_error"
    assert "CancelledError" in records[0]["error"]["message"]
    assert records[1]["error"]["category"] == "agent_error"
    assert "SystemExit: 3" in records[1]["error"]["message"]
    assert records[2]["error"]["category"] == "agent_error"
    assert "KeyboardInterrupt" in records[2]["error"]["message"]
    assert records[3]["status"] == "success"
    assert records[3]["reward"] == 1.0


def test_a_backend_that_gives_out_stops_the_run_resumably(workspace, osmosis_registry):
    """`BackendUnavailable` from execute: that rollout never ran, so nothing is recorded for it; the run
    stops (what is in flight is cancelled, not recorded) and `--resume` finishes exactly the rest."""
    import anyio

    from osmosis_core._engine.builtin import local_backend
    from osmosis_core._engine.config import load_config
    from osmosis_core._engine.runner import execute_run, prepare_run
    from osmosis_core.errors import BackendUnavailable
    from osmosis_core.plugin import BackendSpec, ExecutionBackend, hookimpl
    from osmosis_core.testing import StubPolicyProcess

    class GivesOut(ExecutionBackend):
        """The local backend until its fifth rollout, then gone for good (a cluster lost)."""

        started = 0

        def __init__(self, setup):
            self.inner = local_backend(setup)

        async def execute(self, request, on_workflow_complete, on_grader_complete=None):
            GivesOut.started += 1
            if GivesOut.started > 5:
                raise BackendUnavailable("the cluster is gone")
            await self.inner.execute(request, on_workflow_complete, on_grader_complete)

    class Plugin:
        @staticmethod
        @hookimpl
        def osmosis_register_backends():
            return [BackendSpec("gives-out", GivesOut)]

    osmosis_registry.register(Plugin, "gives-out")
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    config.run.backend, config.run.output, config.run.concurrency = "gives-out", str(workspace / "out"), 1
    with StubPolicyProcess() as stub:
        from osmosis_core import PolicyEndpoint

        policy = PolicyEndpoint(stub.url, "m")
        plan = prepare_run(config, policy_override=policy, registry=osmosis_registry)
        outcome = anyio.run(execute_run, plan)
        assert outcome.stopped == "the cluster is gone"
        assert not outcome.interrupted
        done = outcome.summary.finished  # the fifth may have been in flight, then cancelled: not recorded
        assert 4 <= done <= 5
        assert outcome.summary.interrupted
        config.run.backend = "local"
        again = prepare_run(config, resume=True, policy_override=policy, registry=osmosis_registry)
        assert len(again.pending) == 20 - done
        final = anyio.run(execute_run, again)
    records = lines(workspace / "out" / "results.jsonl")
    assert final.summary.finished == 20
    assert len(records) == 20
    assert all(x["status"] == "success" for x in records)


def test_a_backend_that_returns_without_reporting_fails_the_rollout_instead_of_losing_it(workspace, osmosis_registry):
    import anyio

    from osmosis_core import PolicyEndpoint
    from osmosis_core._engine.config import load_config
    from osmosis_core._engine.runner import execute_run, prepare_run
    from osmosis_core.plugin import BackendSpec, ExecutionBackend, hookimpl

    class SaysNothing(ExecutionBackend):
        def __init__(self, setup):
            pass

        async def execute(self, request, on_workflow_complete, on_grader_complete=None):
            return None

    class Plugin:
        @staticmethod
        @hookimpl
        def osmosis_register_backends():
            return [BackendSpec("says-nothing", SaysNothing)]

    osmosis_registry.register(Plugin, "says-nothing")
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    config.run.backend, config.run.output = "says-nothing", str(workspace / "out")
    plan = prepare_run(config, policy_override=PolicyEndpoint("http://127.0.0.1:9/v1", "m"), registry=osmosis_registry)
    outcome = anyio.run(execute_run, plan)
    records = lines(workspace / "out" / "results.jsonl")
    assert len(records) == 20
    assert outcome.summary.failed == 20
    assert {x["error"]["category"] for x in records} == {"infra_error"}
    assert "SaysNothing) returned without reporting a result" in records[0]["error"]["message"]


def test_a_secret_is_redacted_wherever_it_sits_in_a_line(tmp_path):
    """Bytes, an exception, an attrs object: written as their repr, and the key is redacted there too."""
    from osmosis_core import PolicyEndpoint
    from osmosis_core._engine.results import ResultWriter

    key = "sk-LIVE-0123456789abcdef"
    writer = ResultWriter(tmp_path / "results.jsonl", secrets=[key])
    writer.write({"sample": {"messages": [{"role": "tool", "content": b"token=" + key.encode()}]}})
    writer.write({"metrics": {"err": RuntimeError(f"denied for {key}")}})
    writer.write({"metrics": {"endpoint": PolicyEndpoint("http://h/v1", "m", api_key=key)}})
    writer.write({"metrics": {"quoted": f'say "{key}"'}})
    writer.close()
    text = (tmp_path / "results.jsonl").read_text()
    assert key not in text
    assert "LIVE-0123" not in text
    assert [json.loads(x) for x in text.splitlines()][1]["metrics"]["err"].startswith("RuntimeError(")


NON_FINITE = """
class Workflow(MultiplyWorkflow):
    async def run(self, ctx):
        answer = {"role": "assistant", "content": "#### 6"}
        metrics = {"turns": 1}
        if ctx.user_prompt.startswith("nan-metric"):
            metrics["accuracy"] = float("nan")
        if ctx.user_prompt.startswith("nan-message"):
            answer["score"] = float("nan")
        return RolloutSample(messages=[*ctx.prompt, answer], metrics=metrics)


class Grader(MultiplyGrader):
    async def grade(self, ctx):
        ctx.sample.metrics["ratio"] = float("inf") if ctx.prompt[-1]["content"].startswith("inf") else 0.5
        return 1.0
"""


def test_a_non_finite_metric_is_kept_as_a_string_naming_its_field_and_stage(workspace, osmosis_exe, clean_env):
    """A NaN metric used to fail its rollout at stage "grader" with "Out of range float values are not
    JSON compliant" and no field: the rollout now keeps its reward, results.jsonl holds the metric as
    "NaN" (strict JSON), and the run names the field and the stage that set it. A NaN in the
    messages still fails the rollout, at the workflow stage, naming where it is."""
    names = 'workflow = "Workflow"\ngrader = "Grader"'
    prompts = ["nan-metric", "inf-ratio", "nan-message", "plain"]
    r, records = run_own_classes(workspace, osmosis_exe, clean_env, NON_FINITE, names, prompts)
    assert r.returncode == 0, r.stderr
    assert records[0]["status"] == "success"
    assert records[0]["reward"] == 1.0
    assert records[0]["metrics"] == {"turns": 1, "accuracy": "NaN", "ratio": 0.5}
    assert records[0]["grader_metrics"] == ["ratio"]
    assert records[1]["metrics"]["ratio"] == "Infinity"
    assert "metrics.accuracy, set by the workflow, is nan" in r.stderr
    assert "metrics.ratio, set by the grader, is inf" in r.stderr
    assert r.stderr.count("metrics.accuracy") == 1  # once per metric
    broken = records[2]
    assert (broken["status"], broken["stage"]) == ("failure", "workflow")
    assert broken["error"]["category"] == "validation_error"
    assert "sample.messages[1].score is nan" in broken["error"]["message"]
    # the headline mean counts the failure as 0, as the pass rate does; the mean of the graded stays
    summary = json.loads((workspace / "out" / "summary.json").read_text())
    assert (summary["mean_reward"], summary["mean_reward_graded"], summary["pass_rate"]) == (0.75, 1.0, 0.75)
    assert "mean reward (graded)" in r.stdout
