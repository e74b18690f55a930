"""``osmosis run --traces`` as a user runs it: real subprocesses, the stand-in as vLLM, traces.jsonl."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from atif_helpers import check_atif, harbor_trajectory
from gateway_helpers import REPO, UPSTREAM_KEY

from osmosis_core.testing import ScriptedPolicyServer
from osmosis_core.testing.stub_tokens import render_prompt
from osmosis_gateway import comparable_trace, read_traces, trace_from_json, trainer_view

OSMOSIS = str(Path(sys.executable).parent / "osmosis")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A copy of the multiply-plain example (rollouts/multiply-plain, configs/eval)."""
    shutil.copytree(
        REPO / "rollouts" / "multiply-plain",
        tmp_path / "rollouts" / "multiply-plain",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "eval" / "multiply-plain.toml", tmp_path / "configs" / "eval")
    return tmp_path


def osmosis(*args: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([OSMOSIS, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_multiply_plain_with_traces_holds_every_call_with_the_ids_sent(workspace, clean_env):
    r = osmosis(
        "run", "configs/eval/multiply-plain.toml", "--stub-policy", "--traces", "--limit", "6", "--n-samples", "2",
        "--output", "out", cwd=workspace, env=clean_env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "traces.jsonl" in r.stdout
    out = workspace / "out"
    results = lines(out / "results.jsonl")
    traces = lines(out / "traces.jsonl")
    assert len(traces) == len(results) == 12
    by_pair = {(t["row_index"], t["sample_index"]): t for t in traces}
    for result in results:
        trace = by_pair[(result["row"], result["sample_index"])]
        assert result["status"] == "success"
        assert trace["complete"] is True
        assert trace["incomplete_reason"] is None
        assert trace["rollout_id"].endswith(f"-{result['row']}-{result['sample_index']}")
        # the sample's conversation is what the calls sent (one call per assistant message)
        sample = result["sample"]["messages"]
        assert len(trace["calls"]) == sum(m["role"] == "assistant" for m in sample) == 2
        parsed = trace_from_json(trace)
        for c in parsed.calls:
            assert list(c.prompt_token_ids) == render_prompt(c.request["messages"])  # the ids the stand-in saw
            assert len(c.completion_token_ids) == len(c.logprobs) > 0
        view = trainer_view(parsed)
        assert view.prefix_breaks == 0
        assert len(view.sequences) == 1
        assert view.delivered_fraction == 1.0
        (sequence,) = view.sequences
        last = parsed.calls[-1]
        assert sequence.token_ids == [*last.prompt_token_ids, *last.completion_token_ids]
        first = parsed.calls[0]
        masked = [i for i, m in enumerate(sequence.loss_mask) if m]
        start, end = len(first.prompt_token_ids), len(first.prompt_token_ids) + len(first.completion_token_ids)
        assert masked == [*range(start, end), *range(len(last.prompt_token_ids), len(sequence.token_ids))]
        assert [sequence.logprobs[i] for i in masked] == [*first.logprobs, *last.logprobs]
    assert len(read_traces(out / "traces.jsonl")) == 12


def _export_a_run(workspace: Path, env: dict[str, str]) -> list[dict]:
    """``osmosis run --traces`` over 4 rows, then ``osmosis export --format atif``: the documents."""
    r = osmosis(
        "run", "configs/eval/multiply-plain.toml", "--stub-policy", "--traces", "--limit", "4", "--output", "out",
        cwd=workspace, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = osmosis("export", "out", "--format", "atif", cwd=workspace, env=env)
    assert r.returncode == 0, r.stderr
    files = sorted((workspace / "out" / "atif").glob("*.json"))
    assert len(files) == 4
    return [json.loads(path.read_text()) for path in files]


def test_atif_export_of_a_run_holds_each_call_with_its_ids(workspace, clean_env):
    for document in _export_a_run(workspace, clean_env):
        check_atif(document)
        assert document["schema_version"] == "ATIF-v1.7"
        assert [s["source"] for s in document["steps"]] == ["system", "user", "agent", "agent"]
        first, last = document["steps"][2:]
        assert first["llm_call_count"] == last["llm_call_count"] == 1
        assert first["tool_calls"][0]["arguments"].keys() == {"a", "b"}
        assert first["observation"]["results"][0]["source_call_id"] == first["tool_calls"][0]["tool_call_id"]
        assert first["metrics"]["prompt_token_ids"]
        assert first["metrics"]["completion_token_ids"]
        metrics = last["metrics"]
        assert len(metrics["logprobs"]) == len(metrics["completion_token_ids"]) == metrics["completion_tokens"]
        assert document["extra"]["reward"] == 1.0
        assert document["extra"]["complete"] is True
        assert "notes" not in document


@pytest.mark.together  # Harbor is installed with osmosis-harbor
def test_atif_export_of_a_run_is_valid_for_harbors_own_model(workspace, clean_env, request):
    trajectory = harbor_trajectory(request.config)
    for document in _export_a_run(workspace, clean_env):
        validated = trajectory.model_validate(document)
        assert [s.source for s in validated.steps] == ["system", "user", "agent", "agent"]
        assert validated.steps[2].observation.results[0].source_call_id == validated.steps[2].tool_calls[0].tool_call_id


def test_export_says_what_is_missing(workspace, clean_env):
    (workspace / "empty").mkdir()
    r = osmosis("export", "empty", cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert "traces.jsonl does not exist" in r.stderr


def test_workers_give_the_same_traces_as_local(workspace, clean_env):
    args = ["run", "configs/eval/multiply-plain.toml", "--stub-policy", "--traces", "--limit", "8"]
    one = osmosis(*args, "--output", "one", cwd=workspace, env=clean_env)
    two = osmosis(*args, "--workers", "2", "--output", "two", cwd=workspace, env=clean_env)
    assert one.returncode == 0, one.stderr + two.stderr
    assert two.returncode == 0, one.stderr + two.stderr
    local = sorted(
        (comparable_trace(t) for t in lines(workspace / "one" / "traces.jsonl")), key=lambda t: t["row_index"]
    )
    workers = sorted(
        (comparable_trace(t) for t in lines(workspace / "two" / "traces.jsonl")), key=lambda t: t["row_index"]
    )
    assert len(local) == 8
    assert local == workers


def test_a_drifting_template_is_counted_never_repaired(workspace, clean_env):
    r = osmosis(
        "run", "configs/eval/multiply-plain.toml", "--stub-policy", "--stub-flavor", "drifting", "--traces",
        "--limit", "3", "--output", "out", cwd=workspace, env=clean_env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for line in lines(workspace / "out" / "traces.jsonl"):
        trace = trace_from_json(line)
        view = trainer_view(trace)
        assert trace.complete
        assert view.prefix_breaks == 1
        assert len(view.sequences) == 2
        for sequence, c in zip(view.sequences, trace.calls, strict=True):
            assert list(c.prompt_token_ids) == render_prompt(c.request["messages"], drifting=True)
            assert sequence.token_ids == [*c.prompt_token_ids, *c.completion_token_ids]


def test_a_failed_call_marks_the_trace_and_leaves_the_rollout_status_alone(workspace, clean_env):
    """An upstream 503 fails the rollout as it would without the gateway; a capture failure fails nothing."""
    from osmosis_core.testing import Fault

    env = {**clean_env, "UPSTREAM_KEY": UPSTREAM_KEY}
    with ScriptedPolicyServer(api_key=UPSTREAM_KEY, flavor="vllm") as server:
        server.inject(Fault("status", status=503, message="overloaded"))  # the run's first call
        r = osmosis(
            "run", "configs/eval/multiply-plain.toml", "--traces", "--limit", "3", "--concurrency", "1",
            "--policy-url", server.url, "--api-key-env", "UPSTREAM_KEY", "--output", "vllm", cwd=workspace, env=env,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    results = {x["row"]: x for x in lines(workspace / "vllm" / "results.jsonl")}
    traces = {x["row_index"]: x for x in lines(workspace / "vllm" / "traces.jsonl")}
    assert results[0]["status"] == "failure"
    assert results[0]["error"]["category"] == "policy_error"
    assert "503" in results[0]["error"]["message"]
    assert traces[0]["complete"] is False
    assert "upstream error" in traces[0]["incomplete_reason"]
    assert [c["http_status"] for c in traces[0]["calls"]] == [503]
    assert all(results[i]["status"] == "success" and traces[i]["complete"] for i in (1, 2))

    # --retry-failed runs row 0 again: its new trace line follows the old one, as results do
    with ScriptedPolicyServer(api_key=UPSTREAM_KEY, flavor="vllm") as server:
        r = osmosis(
            "run", "configs/eval/multiply-plain.toml", "--traces", "--limit", "3", "--policy-url", server.url,
            "--api-key-env", "UPSTREAM_KEY", "--output", "vllm", "--retry-failed", cwd=workspace, env=env,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert [t["row_index"] for t in lines(workspace / "vllm" / "traces.jsonl")] == [0, 1, 2, 0]
    latest = read_traces(workspace / "vllm" / "traces.jsonl")
    assert latest[(0, 0)][1].complete
    assert len(latest) == 3

    with ScriptedPolicyServer(api_key=UPSTREAM_KEY, flavor="openai") as server:  # no token fields at all
        r = osmosis(
            "run", "configs/eval/multiply-plain.toml", "--traces", "--limit", "2",
            "--policy-url", server.url, "--api-key-env", "UPSTREAM_KEY", "--output", "text", cwd=workspace, env=env,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert all(x["status"] == "success" and x["reward"] == 1.0 for x in lines(workspace / "text" / "results.jsonl"))
    traces = lines(workspace / "text" / "traces.jsonl")
    assert all(t["complete"] is False and "no prompt_token_ids" in t["incomplete_reason"] for t in traces)

    # both runs export as valid ATIF (row 0 of vllm by its latest trace; text's are incomplete)
    for folder, files in (("vllm", 3), ("text", 2)):
        r = osmosis("export", folder, cwd=workspace, env=env)
        assert r.returncode == 0, r.stderr
        documents = [json.loads(p.read_text()) for p in (workspace / folder / "atif").glob("*.json")]
        assert len(documents) == files
        for document in documents:
            check_atif(document)
    assert "(2 of incomplete rollouts" in r.stdout
    for document in documents:  # the upstream sent no ids: none are written
        assert "Incomplete rollout" in document["notes"]
        assert not [s for s in document["steps"] if "completion_token_ids" in s.get("metrics", {})]

    # nothing the runs or the exports wrote holds the upstream's key
    written = [p for p in workspace.rglob("*") if p.is_file() and "rollouts" not in p.parts]
    assert written
    assert not [p for p in written if UPSTREAM_KEY.encode() in p.read_bytes()]
    assert UPSTREAM_KEY not in r.stdout + r.stderr


def test_traces_table_is_checked_and_the_plugin_is_needed(workspace, clean_env):
    config = workspace / "configs" / "eval" / "multiply-plain.toml"
    config.write_text(config.read_text() + '\n[traces]\nadapter = "tgi"\n')
    r = osmosis(
        "run", "configs/eval/multiply-plain.toml", "--stub-policy", "--output", "bad", cwd=workspace, env=clean_env
    )
    assert r.returncode == 1
    assert "$.traces.adapter" in r.stderr
    assert not (workspace / "bad").exists()
    env = {**clean_env, "OSMOSIS_DISABLE_PLUGINS": "gateway"}
    r = osmosis(
        "run",
        "configs/eval/multiply-plain.toml",
        "--stub-policy",
        "--traces",
        "--output",
        "none",
        cwd=workspace,
        env=env,
    )
    assert r.returncode == 1
    assert "pip install osmosis-gateway" in r.stderr


def test_standalone_gateway_prints_url_and_bearer_and_serves(clean_env, tmp_path):
    import urllib.error
    import urllib.request

    env = {**clean_env, "UPSTREAM_KEY": UPSTREAM_KEY}
    with ScriptedPolicyServer(api_key=UPSTREAM_KEY, flavor="vllm") as server:
        proc = subprocess.Popen(
            [OSMOSIS, "gateway", "--upstream", server.url, "--model", "m", "--api-key-env", "UPSTREAM_KEY"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            banner = proc.stdout.readline()
            bearer = proc.stdout.readline().removeprefix("bearer: ").strip()
            assert banner.startswith("osmosis gateway listening on http://127.0.0.1:"), banner
            url = banner.split()[4]

            def call(method, path, body=None, token=bearer):
                request = urllib.request.Request(
                    url + path, data=json.dumps(body).encode() if body else None, method=method
                )
                request.add_header("Content-Type", "application/json")
                if token:
                    request.add_header("Authorization", f"Bearer {token}")
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        return response.status, json.loads(response.read())
                except urllib.error.HTTPError as exc:
                    return exc.code, None

            assert call("POST", "/rollouts", {"rollout_id": "x"}, token=None)[0] == 401
            status, opened = call("POST", "/rollouts", {"rollout_id": "x"})
            assert status == 201
            question = {"model": "m", "messages": [{"role": "user", "content": "2 * 3"}]}
            chat = opened["base_url"].removeprefix(url) + "/chat/completions"
            status, answer = call("POST", chat, question, token=opened["api_key"])
            assert status == 200
            assert answer["choices"][0]["message"]["content"].endswith("#### 6")
            status, trace = call("DELETE", "/rollouts/x")
            assert status == 200
            assert trace["complete"]
            assert trace["calls"][0]["completion_token_ids"]
        finally:
            proc.terminate()
            out, err = proc.communicate(timeout=10)
    assert UPSTREAM_KEY not in out + err
