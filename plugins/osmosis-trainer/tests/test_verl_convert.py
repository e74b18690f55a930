"""A rollout result as verl's ``AgentLoopOutput`` fields (pure: no verl), every kind of trace: one clean
sequence, a cut response, a prompt over ``prompt_length``, a fork, a broken prefix, a failed rollout, an
incomplete trace. verl's own classes take these fields in tests/test_verl.py."""

from __future__ import annotations

import trainer_helpers
from hypothesis import given, settings
from hypothesis import strategies as st
from trainer_helpers import call

from osmosis_trainer.verl import EXTRA_FIELDS, agent_loop_fields, row_label, sampling_from_verl

MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "6 * 7?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "t"}]},
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "#### 42"},
]


def result_of(calls, *, messages=MESSAGES, **options):
    return trainer_helpers.result_of(calls, messages=messages, **options)


CLEAN = [call(0, [1, 2, 3], [4, 5]), call(1, [1, 2, 3, 4, 5, 9, 9], [6])]


def test_one_clean_sequence_is_one_output_with_the_trace_ids_logprobs_and_reward():
    fields = agent_loop_fields(result_of(CLEAN), prompt_length=8, response_length=16)
    assert fields["prompt_ids"] == [1, 2, 3]
    assert fields["response_ids"] == [4, 5, 9, 9, 6]
    assert fields["response_mask"] == [1, 1, 0, 0, 1]
    assert fields["response_logprobs"] == [-0.1, -0.2, 0.0, 0.0, -0.1]
    assert fields["reward_score"] == 1.0
    assert fields["num_turns"] == 4  # user, assistant, tool, assistant
    extra = fields["extra_fields"]
    assert tuple(extra) == EXTRA_FIELDS
    assert (extra["osmosis_masked"], extra["osmosis_mask_reason"], extra["osmosis_sequences"]) == (False, None, 1)
    assert (extra["osmosis_calls"], extra["osmosis_complete"], extra["osmosis_delivered_fraction"]) == (2, True, 1.0)


def test_the_response_is_cut_to_response_length_and_masked_only_when_asked():
    fields = agent_loop_fields(result_of(CLEAN), prompt_length=8, response_length=3)
    assert (fields["response_ids"], fields["response_mask"]) == ([4, 5, 9], [1, 1, 0])
    assert fields["extra_fields"]["osmosis_truncated"] is True
    assert fields["extra_fields"]["osmosis_masked"] is False
    masked = agent_loop_fields(result_of(CLEAN), prompt_length=8, response_length=3, mask_truncated=True)
    assert masked["response_mask"] == [0, 0, 0]
    assert masked["extra_fields"]["osmosis_mask_reason"] == "truncated"


def test_a_first_prompt_over_prompt_length_is_cut_as_verl_cuts_it_and_masked():
    fields = agent_loop_fields(result_of(CLEAN), prompt_length=2, response_length=16)
    assert fields["prompt_ids"] == [2, 3]  # verl's left cut
    assert fields["response_mask"] == [0] * 5
    assert fields["response_logprobs"] == [0.0] * 5
    assert fields["extra_fields"]["osmosis_mask_reason"] == "prompt_too_long"
    assert "3 tokens, over rollout.prompt_length=2" in fields["extra_fields"]["osmosis_mask_detail"]


def test_a_fork_is_reported_and_masked_never_merged():
    forked = [*CLEAN, call(2, [1, 2, 3, 4, 5, 9, 9], [7, 7])]  # a second answer to the same prompt
    fields = agent_loop_fields(result_of(forked), prompt_length=8, response_length=16)
    extra = fields["extra_fields"]
    assert (extra["osmosis_mask_reason"], extra["osmosis_sequences"]) == ("forked", 2)
    assert set(fields["response_mask"]) == {0}
    assert fields["response_ids"] == [4, 5, 9, 9, 7, 7]  # the last branch's ids, kept
    assert fields["reward_score"] == 1.0  # the grader's, though nothing is trained


def test_a_broken_prefix_is_masked():
    drifted = [call(0, [1, 2, 3], [4, 5]), call(1, [1, 2, 3, 8, 9], [6])]
    fields = agent_loop_fields(result_of(drifted), prompt_length=8, response_length=16)
    assert fields["extra_fields"]["osmosis_mask_reason"] == "prefix_break"
    assert fields["extra_fields"]["osmosis_prefix_breaks"] == 1
    assert set(fields["response_mask"]) == {0}


def test_a_failed_rollout_is_a_one_token_placeholder_with_reward_0_and_its_error():
    fields = agent_loop_fields(
        result_of(None, status="failure", reward=None, messages=None), prompt_length=8, response_length=16,
        pad_token_id=151643,
    )  # fmt: skip
    assert (fields["prompt_ids"], fields["response_ids"], fields["response_mask"]) == ([], [151643], [0])
    assert fields["response_logprobs"] == [0.0]
    assert fields["reward_score"] == 0.0
    extra = fields["extra_fields"]
    assert (extra["osmosis_mask_reason"], extra["osmosis_reward"], extra["osmosis_calls"]) == ("failed", None, 0)
    assert extra["osmosis_mask_detail"] == "agent_error: boom"
    assert fields["num_turns"] == 0


def test_an_incomplete_trace_is_masked_with_its_reason():
    calls = [call(0, [1, 2], [3]), call(1, [1, 2, 3, 4], None, status="cut")]
    fields = agent_loop_fields(result_of(calls, incomplete="call 1 was cut"), prompt_length=8, response_length=16)
    assert fields["extra_fields"]["osmosis_mask_reason"] == "incomplete_trace"
    assert fields["extra_fields"]["osmosis_mask_detail"] == "call 1 was cut"
    assert fields["response_mask"] == [0]


def test_verls_sampling_and_label_conventions():
    sampling, dropped = sampling_from_verl({"temperature": 0, "top_p": 1.0, "top_k": -1, "logprobs": True, "n": 2})
    assert sampling is not None
    assert sampling.to_json() == {"temperature": 0, "top_p": 1.0, "top_k": -1}
    assert dropped == ("n",)
    assert row_label({"reward_model": {"ground_truth": "42"}, "extra_info": {}}) == "42"
    assert row_label({"label": "7", "reward_model": {"ground_truth": "42"}}) == "7"
    assert row_label({"data_source": "x"}) is None


@st.composite
def results(draw):
    size = draw(st.integers(1, 6))
    prompt = [1] + [7] * draw(st.integers(0, 6))
    first = call(0, prompt, [3] * size)
    follow = prompt + [3] * size + [9]
    kind = draw(st.sampled_from(["clean", "drift", "fork", "incomplete", "empty", "failed", "no_trace"]))
    calls = {
        "clean": [first, call(1, follow, [4] * draw(st.integers(1, 6)))],
        "drift": [first, call(1, [*prompt, 9], [4, 4])],
        "fork": [first, call(1, follow, [4]), call(2, follow, [5, 5])],
        "incomplete": [first, call(1, follow, None, status="cut")],
        "empty": [],
        "failed": [first],
        "no_trace": None,
    }[kind]
    return result_of(
        calls, status="failure" if kind == "failed" else "success", incomplete="cut" if kind == "incomplete" else None
    )


@settings(max_examples=80, deadline=None)
@given(results(), st.integers(1, 8), st.integers(1, 12), st.booleans())
def test_every_output_fits_verls_padded_tensors(result, prompt_length, response_length, mask_truncated):
    fields = agent_loop_fields(
        result, prompt_length=prompt_length, response_length=response_length, mask_truncated=mask_truncated
    )
    response = fields["response_ids"]
    assert len(fields["prompt_ids"]) <= prompt_length  # verl pads prompts to prompt_length
    assert 1 <= len(response) <= response_length  # and responses to response_length; the reward sits on the last
    assert len(fields["response_mask"]) == len(fields["response_logprobs"]) == len(response)
    assert all(lp == 0.0 for lp, m in zip(fields["response_logprobs"], fields["response_mask"], strict=True) if not m)
    if fields["extra_fields"]["osmosis_masked"]:
        assert set(fields["response_mask"]) == {0}
    else:
        assert 1 in fields["response_mask"]
    assert tuple(fields["extra_fields"]) == EXTRA_FIELDS
