"""SkyRL's GeneratorOutput of a batch of results, and its sampling parameters as ours: the pure
conversions of ``osmosis_trainer.skyrl`` (no SkyRL installed; test_skyrl.py runs SkyRL's own
validation and trainer on them)."""

from __future__ import annotations

import logging

import pytest
from trainer_helpers import call

from osmosis_trainer import RolloutResult, RolloutTrace, SamplingParams
from osmosis_trainer.skyrl import generator_output, sampling_from_skyrl


def traced(*calls, finish=("tool_calls", "stop")):
    """Calls with their finish reasons (the last one's for every later call)."""
    for index, made in enumerate(calls):
        made.finish_reason = finish[min(index, len(finish) - 1)]
    return list(calls)


def result(rollout_id, calls=None, *, status="success", reward=1.0, error=None, incomplete=None):
    data = {"rollout_id": rollout_id, "status": status, "reward": reward}
    if calls is not None:
        trace = RolloutTrace(rollout_id, calls=calls)
        if incomplete:
            trace.mark_incomplete(incomplete)
        data["trace"] = trace.to_json()
    if error is not None:
        data["error"] = {"category": error[0], "message": error[1]}
    return RolloutResult.from_json(data)


def two_turns(reward=1.0, rollout_id="r"):
    return result(rollout_id, traced(call(0, [1, 2], [3, 4]), call(1, [1, 2, 3, 4, 9], [5])), reward=reward)


def drifted(reward=1.0, rollout_id="d"):
    """Call 1's prompt re-renders call 0's answer (token 3 dropped): a prefix break."""
    return result(rollout_id, traced(call(0, [1, 2], [3, 4]), call(1, [1, 2, 4, 9], [5, 6])), reward=reward)


def failed(rollout_id="f", category="policy_error"):
    return result(rollout_id, status="failure", reward=None, error=(category, "HTTP 500 from the policy"))


def test_one_row_per_trajectory_holds_the_stitched_sequence_its_logprobs_and_reward():
    out = generator_output([two_turns(1.0), two_turns(0.0, "r2")], [("p", 0), ("p", 1)])
    assert out["prompt_token_ids"] == [[1, 2], [1, 2]]
    assert out["response_ids"] == [[3, 4, 9, 5]] * 2
    assert out["loss_masks"] == [[1, 1, 0, 1]] * 2  # the tool's token between the turns is not trained on
    assert out["rollout_logprobs"] == [pytest.approx([-0.1, -0.2, 0.0, -0.1])] * 2  # SkyRL #1870: filled
    assert out["rewards"] == [1.0, 0.0]
    assert out["stop_reasons"] == ["stop", "stop"]
    assert out["trajectory_ids"] == [("p", 0), ("p", 1)]
    assert out["is_last_step"] is None
    metrics = out["rollout_metrics"]
    assert (metrics["generate/num_masked_trajectories"], metrics["osmosis/rows"]) == (0, 2)
    assert (metrics["osmosis/trained_tokens"], metrics["osmosis/delivered_fraction"]) == (6, 1.0)


def test_step_wise_a_broken_prefix_gives_contiguous_rows_with_the_reward_on_the_last():
    out = generator_output([drifted(1.0), two_turns(0.5)], [("p", 0), ("p", 1)], step_wise=True)
    assert out["prompt_token_ids"] == [[1, 2], [1, 2, 4, 9], [1, 2]]
    assert out["response_ids"] == [[3, 4], [5, 6], [3, 4, 9, 5]]
    assert out["loss_masks"] == [[1, 1], [1, 1], [1, 1, 0, 1]]
    assert out["rewards"] == [0.0, 1.0, 0.5]
    assert out["is_last_step"] == [False, True, True]
    assert out["trajectory_ids"] == [("p", 0), ("p", 0), ("p", 1)]
    assert out["stop_reasons"] == ["stop", "stop", "stop"]  # tool_calls: the model stopped of itself
    assert out["rollout_metrics"]["osmosis/prefix_breaks"] == 1


def test_one_row_per_trajectory_cannot_hold_a_broken_prefix_so_that_trajectory_is_masked():
    out = generator_output([drifted(1.0), two_turns(1.0)], [("p", 0), ("q", 0)])
    assert out["response_ids"] == [[0], [3, 4, 9, 5]]
    assert out["loss_masks"] == [[0], [1, 1, 0, 1]]
    assert out["stop_reasons"] == ["error", "stop"]
    assert out["rollout_metrics"]["osmosis/masked_prefix_break"] == 1


def test_a_failed_rollout_masks_its_prompts_group_and_no_other(caplog):
    results = [two_turns(1.0, "a0"), failed("a1"), two_turns(1.0, "b0"), two_turns(0.0, "b1")]
    with caplog.at_level(logging.WARNING, logger="osmosis_trainer.skyrl"):
        out = generator_output(results, [("a", 0), ("a", 1), ("b", 0), ("b", 1)], step_wise=True)
    assert out["prompt_token_ids"] == [[0], [0], [1, 2], [1, 2]]
    assert out["response_ids"] == [[0], [0], [3, 4, 9, 5], [3, 4, 9, 5]]
    assert out["loss_masks"] == [[0], [0], [1, 1, 0, 1], [1, 1, 0, 1]]
    assert out["rollout_logprobs"][:2] == [[0.0], [0.0]]
    assert out["rewards"] == [0.0, 0.0, 1.0, 0.0]
    assert out["stop_reasons"] == ["error", "error", "stop", "stop"]
    assert out["is_last_step"] == [True] * 4
    metrics = out["rollout_metrics"]
    assert metrics["generate/num_masked_trajectories"] == 2
    assert metrics["generate/num_masked_instances"] == 1
    assert (metrics["generate/num_error_trajectories"], metrics["generate/num_timeout_trajectories"]) == (1, 0)
    assert (metrics["osmosis/masked_failed"], metrics["osmosis/masked_group_masked"]) == (1, 1)
    assert metrics["osmosis/delivered_fraction"] == 0.5
    assert "rollout a1 (prompt a) masked: failed (policy_error: HTTP 500 from the policy)" in caplog.text


def test_with_mask_only_the_failed_rollout_is_masked_at_its_groups_mean_reward():
    results = [two_turns(1.0, "a0"), failed("a1", "timeout"), two_turns(0.0, "a2")]
    out = generator_output(results, [("a", 0), ("a", 1), ("a", 2)], failed_groups="mask")
    assert out["loss_masks"] == [[1, 1, 0, 1], [0], [1, 1, 0, 1]]
    assert out["rewards"] == [1.0, 0.5, 0.0]  # the group's mean stays 0.5: no advantage from a failure
    metrics = out["rollout_metrics"]
    assert (metrics["generate/num_timeout_trajectories"], metrics["generate/num_error_trajectories"]) == (1, 0)
    assert metrics["generate/num_masked_trajectories"] == 1


@pytest.mark.parametrize(
    ("made", "reason"),
    [
        (result("x", None), "no_trace"),
        (result("x", traced(call(0, [1], [2]), call(1, [1, 2, 7], None, status="upstream_error")),
                incomplete="call 1: upstream_error"), "incomplete_trace"),
        (result("x", traced(call(0, [1], [2])), reward=None), "no_reward"),
        (result("x", traced(call(0, [1], [2])), reward=float("nan")), "no_reward"),
        (result("x", []), "no_tokens"),
        (RolloutResult.from_json({"rollout_id": "x", "status": "success", "reward": 1.0,
                                  "sample": {"messages": [], "remove_sample": True}}), "removed"),
    ],
)  # fmt: skip
def test_every_rollout_that_cannot_be_trained_on_is_a_placeholder_with_its_reason(made, reason):
    out = generator_output([made], [("p", 0)])
    assert (out["response_ids"], out["loss_masks"], out["rewards"]) == ([[0]], [[0]], [0.0])
    assert out["rollout_metrics"][f"osmosis/masked_{reason}"] == 1


def test_skyrls_overlong_filtering_and_zero_reward_on_non_stop_read_the_last_answers_finish_reason():
    cut = result("c", traced(call(0, [1, 2], [3, 4]), call(1, [1, 2, 3, 4, 9], [5]), finish=("tool_calls", "length")))
    plain = generator_output([cut], [("p", 0)])
    assert (plain["stop_reasons"], plain["loss_masks"], plain["rewards"]) == (["length"], [[1, 1, 0, 1]], [1.0])
    filtered = generator_output([cut], [("p", 0)], overlong_filtering=True, zero_reward_on_non_stop=True)
    assert (filtered["loss_masks"], filtered["rewards"]) == ([[0, 0, 0, 0]], [0.0])
    assert filtered["response_ids"] == [[3, 4, 9, 5]]  # trained on nothing, still in its group
    assert filtered["rollout_metrics"]["generate/num_masked_trajectories"] == 0


def test_a_response_cut_to_max_response_tokens_stops_at_length():
    out = generator_output([two_turns()], [("p", 0)], max_response_tokens=2)
    assert (out["response_ids"], out["loss_masks"], out["stop_reasons"]) == ([[3, 4]], [[1, 1]], ["length"])
    assert out["rollout_metrics"]["osmosis/truncated_rows"] == 1


def test_bad_arguments_are_errors_that_say_what_is_wrong():
    with pytest.raises(ValueError, match="2 results for 1 trajectory ids"):
        generator_output([two_turns(), two_turns()], [("p", 0)])
    with pytest.raises(ValueError, match="failed_groups must be one of mask_group, mask, got 'drop'"):
        generator_output([two_turns()], [("p", 0)], failed_groups="drop")
    with pytest.raises(TypeError, match="not a trajectory id"):
        generator_output([two_turns()], [7])


def test_skyrls_sampling_parameters_become_the_rollouts_and_the_rest_is_named():
    skyrl_vllm = {  # what SkyRL's get_vllm_sampling_params writes, plus an additional_kwargs entry
        "min_tokens": 1,
        "skip_special_tokens": True,
        "include_stop_str_in_output": True,
        "max_tokens": 1024,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.0,
        "logprobs": 1,
        "stop": ["</answer>"],
        "seed": 5,
        "spaces_between_special_tokens": False,
    }
    sampling, dropped = sampling_from_skyrl(skyrl_vllm)
    assert sampling == SamplingParams(
        temperature=0.7, top_p=0.9, top_k=20, min_p=0.0, max_tokens=1024, stop=("</answer>",), seed=5
    )
    assert dropped == ("spaces_between_special_tokens",)
    assert sampling_from_skyrl({"max_generate_length": 64, "stop": [], "min_tokens": 4}) == (
        SamplingParams(max_tokens=64),
        ("min_tokens",),
    )
    assert sampling_from_skyrl(None) == (None, ())
    assert sampling_from_skyrl({"logprobs": 1}) == (None, ())
    with pytest.raises(ValueError, match=r"sampling_params.top_p must be in \(0, 1\], got 1.5"):
        sampling_from_skyrl({"top_p": 1.5})
