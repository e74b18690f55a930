"""ATIF export of traces that are not clean: failed calls, lost answers, retries, branches, junk.

Every document is checked with :func:`atif_helpers.check_atif` (Harbor's JSON Schema and its
validators' rules); ``test_atif_harbor.py`` puts the same traces through Harbor's model itself.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from atif_helpers import BROKEN, CASES, broken_document, check_atif, cut_stream_then_carry_on, traces
from gateway_helpers import run
from hypothesis import HealthCheck, given, settings

from osmosis_gateway import RolloutTrace, trace_to_atif

OSMOSIS = str(Path(sys.executable).parent / "osmosis")


def export(trace: RolloutTrace) -> dict:
    document = trace_to_atif(trace)
    assert document is not None
    check_atif(document)
    return document


def agent_steps(document: dict) -> list[dict]:
    """The steps of the traced calls, in call order."""
    return [s for s in document["steps"] if s.get("llm_call_count") == 1]


def test_an_answer_the_gateway_lost_but_the_rollout_used_is_its_steps_answer():
    """The case behind Harbor's "source_call_id ... not found in step's tool_calls" on exported runs
    with faults: the cut call's step now holds the tool call the rollout answered (taken from its
    next request), so the result points at it."""
    document = export(CASES["lost_answer_then_tool_result"]())
    cut, done = agent_steps(document)
    assert cut["extra"]["status"] == "cut"
    assert cut["extra"]["error"] == "the upstream's stream ended without [DONE]"
    assert cut["extra"]["answer"] == "from_next_request"
    assert cut["extra"]["answer_from_call"] == "c1"
    assert [tc["tool_call_id"] for tc in cut["tool_calls"]] == ["call_x"]
    assert cut["tool_calls"][0]["arguments"] == {"a": 12, "b": 7}
    assert cut["observation"]["results"] == [{"content": "84", "source_call_id": "call_x"}]
    assert "metrics" not in cut  # no ids: none were captured, none are made up
    assert done["extra"]["answer"] == "recorded"
    assert done["metrics"]["completion_token_ids"] == [100, 101, 102, 103]
    assert [s["source"] for s in document["steps"]] == ["system", "user", "agent", "agent"]
    assert document["extra"]["complete"] is False
    assert document["extra"]["call_statuses"] == {"cut": 1, "ok": 1}
    assert "Step 3: the gateway recorded no answer" in document["notes"]


def test_a_stream_cut_over_real_http_that_the_rollout_carried_on_from_gives_a_valid_trajectory():
    trace = run(cut_stream_then_carry_on)
    assert [c.status for c in trace.calls][1:] == ["ok"]
    assert trace.calls[0].status != "ok"
    assert not trace.complete
    document = export(trace)
    cut, done = agent_steps(document)
    assert cut["extra"]["status"] == trace.calls[0].status
    sent = trace.calls[1].request["messages"]
    assert [tc["tool_call_id"] for tc in cut["tool_calls"]] == [sent[2]["tool_calls"][0]["id"]]
    assert cut["observation"]["results"][0]["source_call_id"] == sent[3]["tool_call_id"]
    assert "prompt_token_ids" not in cut.get("metrics", {})
    assert done["metrics"]["prompt_token_ids"] == list(trace.calls[1].prompt_token_ids)
    assert done["metrics"]["logprobs"] == list(trace.calls[1].logprobs)


def test_failed_calls_keep_their_status_and_error_and_no_ids_are_made_up():
    trace = CASES["failed_calls"]()
    error, partial, done = agent_steps(export(trace))
    assert error["extra"] | {"latency_sec": 0} == {
        "call_id": "c0", "index": 0, "status": "upstream_error", "answer": "none", "http_status": 503,
        "stream": False, "finish_reason": None, "policy_version": None, "latency_sec": 0,
        "error": "the upstream answered 503: busy",
    }  # fmt: skip
    assert error["message"] == ""
    assert "metrics" not in error
    assert "tool_calls" not in error
    # a capture that failed: its answer is shown, its ids are kept out of the training fields
    assert partial["extra"]["status"] == "capture_failed"
    assert [tc["tool_call_id"] for tc in partial["tool_calls"]] == ["call_a"]
    assert partial["metrics"] == {"extra": {"prompt_token_ids": [1, 2, 3]}}
    assert partial["observation"]["results"][0]["source_call_id"] == "call_a"
    assert set(done["metrics"]) == {
        "prompt_tokens",
        "completion_tokens",
        "prompt_token_ids",
        "completion_token_ids",
        "logprobs",
    }


def test_a_tool_result_no_answer_asked_for_keeps_its_id_in_extra():
    document = export(CASES["unknown_tool_results"]())
    system, user, first, second = document["steps"]
    assert system["observation"]["results"] == [{"content": "stale", "extra": {"tool_call_id": "never_made"}}]
    assert first["observation"]["results"] == [{"content": "84", "extra": {"tool_call_id": "call_b"}}]
    assert (user["source"], second["message"]) == ("user", "#### 84")
    assert "2 tool result(s) answer no tool call of their step" in document["notes"]


def test_a_retry_shares_the_history_of_the_call_it_repeats():
    document = export(CASES["retry_after_an_error"]())
    assert [s["source"] for s in document["steps"]] == ["system", "user", "agent", "agent", "agent"]
    asked, failed, retried = agent_steps(document)
    assert asked["observation"]["results"] == [{"content": "84", "source_call_id": "call_a"}]
    assert failed["extra"]["status"] == "upstream_error"
    assert "branch_from_step" not in failed["extra"]
    assert "branch_from_step" not in retried["extra"]
    assert retried["message"] == "#### 84"
    assert "notes" in document  # incomplete: the failed call


def test_branches_name_the_last_step_their_request_shares():
    document = export(CASES["two_conversations"]())
    assert [s["source"] for s in document["steps"]] == ["system", "user", "agent", "agent", "agent"]
    first, other, third = agent_steps(document)
    assert "branch_from_step" not in first["extra"]
    assert other["extra"]["branch_from_step"] == 2  # the second sample shares the prompt (steps 1-2)
    assert third["extra"]["branch_from_step"] == 3  # goes on from the first answer, whose result it sent
    assert first["observation"]["results"] == [{"content": "84", "source_call_id": "call_a"}]
    assert "Steps 4, 5: the call does not continue the one before it" in document["notes"]
    assert document["extra"]["complete"] is True


def test_earlier_turns_of_the_prompt_are_copied_context():
    document = export(CASES["earlier_turns_in_the_prompt"]())
    sources = [(s["source"], s.get("is_copied_context")) for s in document["steps"]]
    assert sources == [("system", None), ("user", None), ("agent", True), ("user", None), ("agent", None)]
    earlier = document["steps"][2]
    assert earlier["observation"]["results"] == [{"content": "84", "source_call_id": "call_old"}]
    assert "llm_call_count" not in earlier
    assert "metrics" not in earlier
    assert earlier["extra"] == {"role": "assistant", "from_request_of": "c0"}


def test_a_text_only_trace_counts_from_usage_and_holds_no_ids():
    document = export(CASES["text_only"]())
    asked, cut = agent_steps(document)
    assert asked["metrics"] == {"prompt_tokens": 21, "completion_tokens": 6}
    assert cut["extra"]["answer"] == "none"
    assert document["final_metrics"] == {
        "total_prompt_tokens": 21,
        "total_completion_tokens": 6,
        "total_steps": 4,
        "extra": {"calls_without_prompt_tokens": 1, "calls_without_completion_tokens": 1},
    }
    assert document["extra"]["capture"] == "text"


def test_malformed_requests_and_answers_are_kept_as_sent():
    document = export(CASES["malformed"]())
    empty, junk, odd, orphan = agent_steps(document)
    assert empty["extra"]["status"] == junk["extra"]["status"] == "bad_request"
    assert odd["extra"]["skipped_messages"] == 2  # 3 and None: no message objects
    assert odd["message"] == "thinking aloud"
    assert odd["reasoning_content"] == "hm"
    assert odd["tool_calls"] == [
        {
            "tool_call_id": "c2/0",
            "function_name": "multiply",
            "arguments": {"a": 12, "b": 7},
            "extra": {"id_assigned": True},
        },
        {"tool_call_id": "call_b", "function_name": "multiply", "arguments": {"_raw": "{'a': "}},
        {"tool_call_id": "c2/2", "function_name": "", "arguments": {"_value": 7}, "extra": {"id_assigned": True}},
    ]
    assert "metrics" not in odd  # neither a bool nor a string is a token count
    holder = document["steps"][document["steps"].index(orphan) - 2]
    assert holder == {"step_id": holder["step_id"], "source": "system", "message": "", "extra": {"role": "tool"},
                      "observation": {"results": [{"content": "orphan"}]}}  # fmt: skip
    assert document["steps"][document["steps"].index(orphan) - 1]["extra"] == {"role": "ipython"}
    assert document["agent"]["tool_definitions"] == [{"type": "function", "function": {"name": "multiply"}}]


def test_a_rollout_without_calls_has_no_trajectory():
    assert trace_to_atif(RolloutTrace("r-0")) is None


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_the_check_refuses_what_harbor_refuses(name):
    with pytest.raises(AssertionError):
        check_atif(broken_document(name))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_every_generated_trace_gives_a_valid_trajectory(trace):
    before = copy.deepcopy(trace.to_json())
    document = trace_to_atif(trace)
    assert trace.to_json() == before  # the trace is left as it was
    if not trace.calls:
        assert document is None
        return
    assert document is not None
    check_atif(document)
    steps = agent_steps(document)
    assert [s["extra"]["call_id"] for s in steps] == [c.call_id for c in trace.calls]
    for step, call in zip(steps, trace.calls, strict=True):
        assert step["extra"]["status"] == call.status
        metrics = step.get("metrics", {})
        if call.captured:
            assert metrics["completion_token_ids"] == list(call.completion_token_ids)
            assert metrics["logprobs"] == list(call.logprobs)
        else:
            assert not {"prompt_token_ids", "completion_token_ids", "logprobs"} & set(metrics)
    assert document["extra"]["complete"] is trace.complete
    assert document["extra"]["incomplete_reason"] == trace.incomplete_reason
    assert ("notes" in document) >= (not trace.complete)


def test_export_writes_a_valid_file_per_rollout_with_calls_and_says_how_many_are_incomplete(tmp_path):
    names = ["lost_answer_then_tool_result", "failed_calls", "retry_after_an_error", "two_conversations", "text_only"]
    lines = [CASES[name]() for name in names] + [RolloutTrace("r-none")]
    with (tmp_path / "traces.jsonl").open("w") as handle:
        for row, trace in enumerate(lines):
            trace.rollout_id = f"run-{row}-0"
            handle.write(json.dumps({**trace.to_json(), "row_index": row, "sample_index": 0}) + "\n")
    (tmp_path / "results.jsonl").write_text(
        json.dumps({"row": 0, "sample_index": 0, "status": "success", "reward": 1.0}) + "\n"
    )
    r = subprocess.run([OSMOSIS, "export", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    files = sorted((tmp_path / "atif").glob("*.json"))
    assert [f.name for f in files] == [f"run-{row}-0.json" for row in range(5)]
    for path in files:
        check_atif(json.loads(path.read_text()))
    assert json.loads(files[0].read_text())["extra"] | {"call_statuses": None} == {
        "complete": False, "incomplete_reason": "call 0 cut: the upstream's stream ended without [DONE]",
        "capture": "tokens", "call_statuses": None, "row_index": 0, "sample_index": 0, "status": "success",
        "reward": 1.0,
    }  # fmt: skip
    assert f"wrote 5 ATIF trajectories to {tmp_path / 'atif'}" in r.stdout
    assert "(4 of incomplete rollouts: extra.complete is false, notes say what is missing)" in r.stdout
    assert "1 rollout made no model call and has no trajectory" in r.stdout
