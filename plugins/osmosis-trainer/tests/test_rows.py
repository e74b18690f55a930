"""Training rows: a result and its trace as per-sequence rows, and every reason a row is masked."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from trainer_helpers import call

from osmosis_trainer import RolloutResult, RolloutTrace, rollout_rows, rows_metrics, trainer_view


def result(calls, *, status="success", reward=1.0, incomplete=None, capture="tokens", **more):
    trace = RolloutTrace("r", capture=capture, calls=calls)
    if incomplete:
        trace.mark_incomplete(incomplete)
    data = {"rollout_id": "r", "status": status, "reward": reward, "trace": trace.to_json(), **more}
    return RolloutResult.from_json(data)


TWO_TURNS = [call(0, [1, 2], [3, 4], version="v1"), call(1, [1, 2, 3, 4, 9, 9], [5], version="v2")]


def test_a_two_turn_rollout_is_one_row_with_the_tool_tokens_masked():
    [row] = rollout_rows(result(TWO_TURNS))
    assert row.prompt_ids == [1, 2]
    assert row.completion_ids == [3, 4, 9, 9, 5]
    assert row.completion_mask == [1, 1, 0, 0, 1]
    assert row.completion_logprobs == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.1])
    assert (row.reward, row.masked, row.mask_reason, row.complete) == (1.0, False, None, True)
    assert (row.sequence_index, row.sequence_count, row.is_last, row.trained_tokens) == (0, 1, True, 3)
    assert row.call_ids == ("c0", "c1")
    assert row.policy_versions == ("v1", "v2")
    assert rollout_rows(result(TWO_TURNS), sequences="last") == [row]


def test_a_prefix_break_is_two_rows_step_wise_and_one_masked_row_for_one_row_per_rollout():
    calls = [call(0, [1, 2], [3]), call(1, [1, 2, 3, 7], [8]), call(2, [1, 2, 7], [9])]  # 2 dropped token 3
    first, second = rollout_rows(result(calls), sequences="all")
    assert (first.prompt_ids, first.completion_ids, first.completion_mask) == ([1, 2], [3, 7, 8], [1, 0, 1])
    assert (second.prompt_ids, second.completion_ids, second.completion_mask) == ([1, 2, 7], [9], [1])
    assert not first.masked
    assert not second.masked
    assert first.prefix_breaks == second.prefix_breaks == 1
    assert (first.is_last, second.is_last) == (False, True)
    [last] = rollout_rows(result(calls), sequences="last")
    assert last.mask_reason == "prefix_break"
    assert "1 prefix break" in (last.mask_detail or "")
    assert last.completion_ids == [9]  # the last call's branch, kept for its shape
    assert last.completion_mask == [0]
    assert last.completion_logprobs == [0.0]
    assert last.delivered_fraction == 0.0


def test_a_fork_without_a_break_trains_each_token_once_and_one_row_keeps_the_last_branch():
    calls = [call(0, [1], [2]), call(1, [1, 2, 5], [6]), call(2, [1, 2, 5], [7, 7])]  # a retry of call 1
    rows = rollout_rows(result(calls))
    assert [r.completion_mask for r in rows] == [[1, 0, 1], [0, 0, 1, 1]]  # c0 trained in the first row only
    assert [r.masked for r in rows] == [False, False]
    [last] = rollout_rows(result(calls), sequences="last")
    assert not last.masked
    assert last.call_ids == ("c0", "c2")
    assert last.delivered_fraction == 0.75  # c1's token is in no row


@pytest.mark.parametrize(
    ("made", "reason", "detail"),
    [
        (lambda: result(TWO_TURNS, status="failure", reward=None, error={"category": "timeout", "message": "300s"}),
         "failed", "timeout: 300s"),
        (lambda: result(TWO_TURNS, status="cancelled", reward=None), "failed", "cancelled"),
        (lambda: result(TWO_TURNS, incomplete="call 1 cut: the stream broke"), "incomplete_trace", "call 1 cut"),
        (lambda: result([*TWO_TURNS, call(2, None, None, status="pending")]), "incomplete_trace", "in flight"),
        (lambda: result(TWO_TURNS, sample={"messages": [], "remove_sample": True}), "removed", "remove_sample"),
    ],
)  # fmt: skip
def test_a_rollout_that_cannot_be_trained_on_keeps_its_tokens_with_a_zero_mask(made, reason, detail):
    [row] = rollout_rows(made(), sequences="last")
    assert row.masked
    assert row.mask_reason == reason
    assert detail in (row.mask_detail or "")
    assert row.prompt_ids == [1, 2]
    assert row.completion_ids == [3, 4, 9, 9, 5]
    assert row.completion_mask == [0] * 5  # forgetting the flag trains on nothing
    assert row.completion_logprobs == [0.0] * 5
    assert row.trained_tokens == 0
    assert row.delivered_fraction == 0.0


@pytest.mark.parametrize(
    ("made", "reason", "detail"),
    [
        (lambda: RolloutResult.from_json({"rollout_id": "r", "status": "success", "reward": 1.0}), "no_trace",
         "--traces"),
        (lambda: RolloutResult.from_json({"rollout_id": "r", "status": "failure"}), "failed", "failed"),
        (lambda: result([]), "no_tokens", "no model call"),
        (lambda: result([call(0, [1], [])]), "no_tokens", "no generated token"),
        (lambda: result([call(0, None, None)], capture="text"), "no_tokens", "text only"),
    ],
)  # fmt: skip
def test_a_rollout_without_tokens_is_one_masked_row(made, reason, detail):
    [row] = rollout_rows(made())
    assert row.mask_reason == reason
    assert detail in (row.mask_detail or "")
    assert not any(row.completion_mask)


def test_a_completion_cut_to_the_trainers_length_says_so_and_counts_what_it_left_out():
    [row] = rollout_rows(result(TWO_TURNS), max_completion_tokens=3)
    assert row.completion_ids == [3, 4, 9]
    assert row.completion_mask == [1, 1, 0]
    assert len(row.completion_logprobs) == 3
    assert row.truncated
    assert row.delivered_fraction == pytest.approx(2 / 3)
    assert not rollout_rows(result(TWO_TURNS), max_completion_tokens=5)[0].truncated
    with pytest.raises(ValueError, match="max_completion_tokens must be >= 0"):
        rollout_rows(result(TWO_TURNS), max_completion_tokens=-1)
    with pytest.raises(ValueError, match="sequences must be 'all' or 'last'"):
        rollout_rows(result(TWO_TURNS), sequences="first")  # type: ignore[arg-type]


def test_a_trace_that_is_not_one_is_a_masked_row_that_says_why_never_an_error():
    bad = RolloutResult.from_json(
        {"rollout_id": "r7", "status": "success", "trace": {"rollout_id": "r7", "calls": [{"index": "x"}]}}
    )
    unaligned = result(TWO_TURNS).trace
    unaligned["calls"][0]["logprobs"] = [-0.1]  # 2 tokens, 1 logprob
    for broken in (bad, RolloutResult.from_json({"rollout_id": "r8", "status": "success", "trace": unaligned})):
        [row] = rollout_rows(broken)
        assert row.mask_reason == "incomplete_trace"
        assert "the trace is not one" in (row.mask_detail or "")
        assert (row.completion_ids, row.completion_mask) == ([], [])


def test_the_metrics_of_a_steps_rows():
    rows = [
        *rollout_rows(result(TWO_TURNS)),
        *rollout_rows(result([call(0, [1, 2], [3]), call(1, [1, 2, 3, 7], [8]), call(2, [1, 2, 7], [9])])),
        *rollout_rows(result(TWO_TURNS, incomplete="call 1 cut")),
        *rollout_rows(RolloutResult.from_json({"rollout_id": "x", "status": "failure"})),
    ]
    metrics = rows_metrics(rows)
    assert metrics["rollouts"] == 4
    assert metrics["rows"] == 5
    assert metrics["masked_rows"] == 2
    assert (metrics["masked_incomplete_trace"], metrics["masked_failed"], metrics["masked_prefix_break"]) == (1, 1, 0)
    assert metrics["incomplete_rollouts"] == 2
    assert metrics["prefix_breaks"] == 1
    assert metrics["trained_tokens"] == 3 + 3
    assert metrics["delivered_fraction"] == pytest.approx((1.0 + 1.0 + 0.0 + 0.0) / 4)


@st.composite
def traces(draw):
    """Calls that each extend an earlier call's tokens with tool tokens, or (sometimes) break away."""
    calls = []
    fulls = []
    for index in range(draw(st.integers(min_value=1, max_value=6))):
        if fulls and draw(st.booleans()):
            base = draw(st.sampled_from(fulls))
            prompt = base + draw(st.lists(st.integers(100, 199), max_size=3))
        else:
            prompt = draw(st.lists(st.integers(1, 99), min_size=1, max_size=4))
        generated = draw(st.lists(st.integers(200, 299), min_size=1, max_size=4))
        calls.append(call(index, prompt, generated))
        fulls.append(prompt + generated)
    return calls


@given(traces(), st.sampled_from(["all", "last"]))
def test_rows_are_their_sequences_split_at_the_first_calls_prompt(calls, sequences):
    made = result(calls)
    view = trainer_view(RolloutTrace("r", calls=calls), branches=sequences)
    rows = rollout_rows(made, sequences=sequences)
    assert len(rows) == len(view.sequences)
    for row, sequence in zip(rows, view.sequences, strict=True):
        assert row.prompt_ids + row.completion_ids == sequence.token_ids
        first = next(c for c in calls if c.call_id == sequence.call_ids[0])
        assert row.prompt_ids == list(first.prompt_token_ids)
        assert len(row.completion_ids) == len(row.completion_mask) == len(row.completion_logprobs)
        assert all(lp == 0.0 for lp, m in zip(row.completion_logprobs, row.completion_mask, strict=True) if not m)
        if row.masked:
            assert row.mask_reason == "prefix_break"
            assert sequences == "last"
            assert not any(row.completion_mask)
        else:
            assert row.completion_mask == sequence.loss_mask[len(row.prompt_ids) :]
    if sequences == "all":
        assert sum(r.trained_tokens for r in rows) == sum(len(c.completion_token_ids) for c in calls)


def test_a_cut_or_ungraded_row_is_masked_only_when_asked():
    [cut] = rollout_rows(result(TWO_TURNS), max_completion_tokens=3)
    assert (cut.completion_ids, cut.truncated, cut.masked) == ([3, 4, 9], True, False)
    [cut] = rollout_rows(result(TWO_TURNS), max_completion_tokens=3, mask_truncated=True)
    assert (cut.mask_reason, cut.mask_detail) == ("truncated", "cut to 3 of its 5 completion tokens")
    assert (cut.completion_mask, cut.completion_logprobs) == ([0, 0, 0], [0.0, 0.0, 0.0])
    [whole] = rollout_rows(result(TWO_TURNS), max_completion_tokens=5, mask_truncated=True)
    assert not whole.masked
    assert not rollout_rows(result(TWO_TURNS, reward=None))[0].masked
    for reward, detail in ((None, "without a reward"), (float("nan"), "NaN")):
        [row] = rollout_rows(result(TWO_TURNS, reward=reward), mask_no_reward=True)
        assert row.mask_reason == "no_reward"
        assert detail in (row.mask_detail or "")
        assert set(row.completion_mask) == {0}
    failed = result(TWO_TURNS, status="failure", reward=None, error={"category": "timeout", "message": "300s"})
    assert rollout_rows(failed, mask_no_reward=True)[0].mask_reason == "failed"  # the first reason wins
    metrics = rows_metrics(rollout_rows(result(TWO_TURNS, reward=None), mask_no_reward=True))
    assert (metrics["masked_no_reward"], metrics["masked_truncated"]) == (1, 0)
