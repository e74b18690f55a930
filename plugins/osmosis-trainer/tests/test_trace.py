"""The trace record and the trainer's view: prefix stitching, the loss mask, aligned logprobs, counts,
and the JSON form a result carries (the gateway's own tests check what it records)."""

from __future__ import annotations

import json
from array import array

import cattrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from trainer_helpers import call

from osmosis_trainer import (
    RolloutTrace,
    TraceCall,
    comparable_trace,
    read_traces,
    trace_from_json,
    trainer_view,
    view_of_json,
)


def test_calls_that_extend_each_other_make_one_sequence_with_a_mask_on_generated_tokens_only():
    calls = [call(0, [1, 2], [3, 4], version="a"), call(1, [1, 2, 3, 4, 9, 9], [5], version="b")]
    view = trainer_view(RolloutTrace("r", calls=calls))
    (sequence,) = view.sequences
    assert sequence.token_ids == [1, 2, 3, 4, 9, 9, 5]
    assert sequence.loss_mask == [0, 0, 1, 1, 0, 0, 1]  # the tool tokens (9, 9) are not trained on
    assert sequence.logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.1]
    assert sequence.call_ids == ("c0", "c1")
    assert sequence.policy_versions == ("a", "b")
    assert sequence.prompt_length == 2
    assert (view.prefix_breaks, view.generated_tokens, view.delivered_tokens) == (0, 3, 3)


def test_a_rewritten_prompt_starts_a_new_sequence_and_is_counted():
    calls = [call(0, [1, 2], [3]), call(1, [1, 2, 3, 7], [8]), call(2, [1, 2, 7], [9])]  # 2 drops token 3
    view = trainer_view(RolloutTrace("r", calls=calls))
    assert view.prefix_breaks == 1
    assert len(view.sequences) == 2
    assert [s.token_ids for s in view.sequences] == [[1, 2, 3, 7, 8], [1, 2, 7, 9]]
    assert view.sequences[1].loss_mask == [0, 0, 0, 1]  # never re-tokenized, never merged
    assert view.delivered_fraction == 1.0


def test_branches_share_a_parent_that_is_trained_once_and_last_keeps_one_branch():
    calls = [call(0, [1], [2]), call(1, [1, 2, 5], [6]), call(2, [1, 2, 5], [7, 7])]  # a retry of call 1
    view = trainer_view(RolloutTrace("r", calls=calls))
    assert [s.call_ids for s in view.sequences] == [("c0", "c1"), ("c0", "c2")]
    assert view.sequences[0].loss_mask == [0, 1, 0, 1]
    assert view.sequences[1].loss_mask == [0, 0, 0, 1, 1]  # c0 was trained in the first branch
    assert view.prefix_breaks == 0
    assert view.delivered_tokens == view.generated_tokens == 4
    last = trainer_view(RolloutTrace("r", calls=calls), branches="last")
    assert [s.call_ids for s in last.sequences] == [("c0", "c2")]
    assert last.delivered_tokens == 3
    assert last.delivered_fraction == 0.75


def test_the_longest_parent_wins():
    calls = [call(0, [1], [2]), call(1, [1, 2], [3]), call(2, [1, 2, 3], [4])]
    (sequence,) = trainer_view(RolloutTrace("r", calls=calls)).sequences
    assert sequence.call_ids == ("c0", "c1", "c2")
    assert sequence.loss_mask == [0, 1, 1, 1]


def test_failed_calls_are_left_out_and_the_view_says_the_trace_is_incomplete():
    trace = RolloutTrace("r", calls=[call(0, [1], [2]), call(1, None, None, status="cut")])
    trace.mark_incomplete("call 1 cut: x")
    trace.mark_incomplete("later reason")
    view = trainer_view(trace)
    assert not view.complete
    assert view.incomplete_reason == "call 1 cut: x"
    assert len(view.sequences) == 1


def test_json_round_trip():
    trace = RolloutTrace("r", calls=[call(0, [1], [2], version="v")])
    data = json.loads(json.dumps(trace.to_json()))
    assert data["complete"] is True
    assert trace_from_json({**data, "row_index": 3}) == trace


def test_a_plain_list_set_on_a_call_serialises_like_an_array():
    """Setting a token field does not convert it (the gateway sets a dozen fields per call); a
    trainer that patches a trace with plain lists still gets its JSON."""
    trace = RolloutTrace("r", calls=[call(0, [1], [2])])
    trace.calls[0].logprobs = [-0.5]
    trace.calls[0].completion_token_ids = [7]
    data = trace.to_json()
    assert data["calls"][0]["logprobs"] == [-0.5]
    assert data["calls"][0]["completion_token_ids"] == [7]


def test_a_request_held_as_json_text_reads_compares_and_round_trips_as_the_dict():
    sent = {"messages": [{"role": "user", "content": "caf\u00e9"}], "tools": [], "temperature": 0.5}
    held = TraceCall(call_id="c0", index=0, request=json.dumps(sent).encode())
    plain = TraceCall(call_id="c0", index=0, request=sent)
    assert held == plain
    assert RolloutTrace("r", calls=[held]).to_json() == RolloutTrace("r", calls=[plain]).to_json()
    assert RolloutTrace("r", calls=[held]).to_json()["calls"][0]["request"] == sent
    assert trace_from_json(RolloutTrace("r", calls=[held]).to_json()).calls[0].request == sent
    held.request["messages"].append({"role": "tool", "content": "84"})  # read once, then a dict like any other
    assert len(held.request["messages"]) == 2
    with pytest.raises(cattrs.errors.ClassValidationError) as refused:
        trace_from_json({"rollout_id": "r", "calls": [{"call_id": "c0", "index": 0, "request": ["no"]}]})
    assert "request must be a JSON object, got list" in str(refused.value.exceptions[0].exceptions[0].exceptions[0])


def test_ids_and_logprobs_read_from_json_are_compact_arrays_of_their_own_type():
    """On every Python (``array`` is generic only from 3.12: the annotations are resolved for cattrs)."""
    trace = trace_from_json(
        {"rollout_id": "r", "calls": [{"call_id": "c0", "index": 0, "prompt_token_ids": [1, 2],
                                       "completion_token_ids": [3], "logprobs": [-1]}]}
    )  # fmt: skip
    [read] = trace.calls
    assert (read.prompt_token_ids, read.completion_token_ids) == (array("i", [1, 2]), array("i", [3]))
    assert read.logprobs == array("d", [-1.0])
    assert read.captured
    with pytest.raises(cattrs.BaseValidationError):
        trace_from_json({"rollout_id": "r", "calls": [{"call_id": "c0", "index": 0, "prompt_token_ids": ["x"]}]})


def test_a_call_still_in_flight_makes_the_trace_incomplete_and_says_which():
    trace = RolloutTrace("r", calls=[call(0, [1], [2]), call(1, None, None, status="pending")])
    assert trace.incomplete_reason is None
    assert not trace.complete
    data = trace.to_json()
    assert data["complete"] is False
    assert data["incomplete_reason"] == "call 1 is still in flight"
    view = trainer_view(trace)
    assert (view.calls, view.uncaptured_calls, view.captured_calls) == (2, 1, 1)
    assert view.delivered_fraction == 0.5  # the pending call's share is not delivered


def test_a_text_only_trace_has_no_view():
    with pytest.raises(ValueError, match="holds text only"):
        trainer_view(RolloutTrace("r", capture="text", calls=[]))


def test_read_traces_keeps_the_last_line_of_each_row_and_sample_and_names_a_bad_line(tmp_path):
    first = {**RolloutTrace("r-a", calls=[call(0, [1], [2])]).to_json(), "row_index": 0, "sample_index": 0}
    again = {**RolloutTrace("r-b", calls=[call(0, [1], [3])]).to_json(), "row_index": 0, "sample_index": 0}
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in (first, again)) + "\n\n")
    [(key, (line, trace))] = read_traces(path).items()
    assert key == (0, 0)
    assert trace.rollout_id == "r-b"
    assert line["rollout_id"] == "r-b"
    path.write_text(json.dumps(first) + "\n" + json.dumps({"rollout_id": "r"}) + "\n")
    with pytest.raises(ValueError, match=r"traces.jsonl:2: not a trace line \(KeyError"):
        read_traces(path)


def test_comparable_traces_drop_what_differs_from_run_to_run():
    def line(call_id, started, tool_id):
        trace = RolloutTrace("r", calls=[call(0, [1], [2])])
        trace.calls[0].call_id = call_id
        trace.calls[0].started_at = started
        trace.calls[0].response = {"tool_calls": [{"id": tool_id, "function": {"name": "multiply"}}]}
        trace.calls[0].request = {"messages": [{"role": "tool", "tool_call_id": tool_id, "content": "42"}]}
        return {**trace.to_json(), "row_index": 0, "sample_index": 0}

    assert comparable_trace(line("c0", 1.0, "call_a")) == comparable_trace(line("c9", 2.0, "call_b"))
    assert comparable_trace(line("c0", 1.0, "a"))["calls"][0]["response"]["tool_calls"][0]["id"] is None


@st.composite
def traces(draw):
    """Calls that extend an earlier call's tokens (with tool tokens between), retry one, or break away;
    some not captured."""
    calls, fulls = [], []
    for index in range(draw(st.integers(min_value=0, max_value=6))):
        if fulls and draw(st.booleans()):
            prompt = draw(st.sampled_from(fulls)) + draw(st.lists(st.integers(100, 199), max_size=3))
        else:
            prompt = draw(st.lists(st.integers(1, 99), min_size=1, max_size=4))
        generated = draw(st.lists(st.integers(200, 299), max_size=4))
        status = draw(st.sampled_from(["ok", "ok", "ok", "cut", "pending"]))
        if status == "ok":
            calls.append(call(index, prompt, generated))
            fulls.append(prompt + generated)
        else:
            calls.append(call(index, None, None, status=status))
    return RolloutTrace("r", calls=calls)


@given(traces(), st.sampled_from(["all", "last"]))
def test_the_view_read_straight_from_json_is_the_view_of_the_record(trace, branches):
    data = json.loads(json.dumps(trace.to_json()))
    assert view_of_json(data, branches=branches) == trainer_view(trace_from_json(data), branches=branches)


def test_a_branch_splits_at_the_prompt_of_its_first_call():
    calls = [call(0, [1], [2]), call(1, [1, 2, 5], [6]), call(2, [1, 2, 5], [7, 7])]
    first, second = trainer_view(RolloutTrace("r", calls=calls)).sequences
    assert (first.root_prompt_length, second.root_prompt_length) == (1, 1)
    assert second.prompt_length == 3  # its first generated token is later: c0's was trained in the first


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ([{"call_id": "c0", "index": 0, "completion_token_ids": [1, 2], "logprobs": [-1.0]}], "call 0 has 1 logprobs"),
        ([{"call_id": "c0", "index": 0, "prompt_token_ids": [1, "x"]}], r"\$.calls\[0\].prompt_token_ids\[1\]"),
        ([{"index": 0}], "call_id"),
    ],
)
def test_json_that_is_not_a_trace_is_refused_naming_the_place(calls, message):
    with pytest.raises(ValueError, match=message):
        view_of_json({"rollout_id": "r", "calls": calls})


def test_a_call_whose_logprobs_do_not_match_its_tokens_is_not_captured():
    """A third-party or hand-made trace (the gateway's own never has one): stitching it would misalign
    the mask and the logprobs, so the call is left out and the view is not whole."""
    for logprobs in ([-0.1], [-0.1, -0.2, -0.3, -0.4]):  # short, long
        trace = RolloutTrace("r", calls=[call(0, [1], [2, 3]), call(1, [1, 2, 3, 7], [8, 9])])
        trace.calls[1].logprobs = logprobs
        view = trainer_view(trace)
        assert (view.calls, view.captured_calls) == (2, 1)
        assert view.delivered_fraction < 1.0
        [sequence] = view.sequences
        assert len(sequence.token_ids) == len(sequence.loss_mask) == len(sequence.logprobs) == 3
