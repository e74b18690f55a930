"""Groups: prompts repeated per group, results back in the rows' order, group-relative advantages
that leave failed and masked rollouts out of their group's statistics."""

from __future__ import annotations

import math
import statistics

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from osmosis_trainer import GroupStats, group_advantages, group_stats, order_results, prompt_groups, repeat_prompts


@attrs.frozen
class _Id:
    rollout_id: str


def test_prompts_repeated_as_trainers_hand_them_over_and_their_groups():
    rows = repeat_prompts(["p0", "p1", "p2", "p3"], 4)
    assert len(rows) == 16
    assert rows[:5] == ["p0", "p0", "p0", "p0", "p1"]
    slots = prompt_groups(rows, 4)
    assert slots[0] == (0, 0)
    assert slots[5] == (1, 1)
    assert slots[-1] == (3, 3)


def test_rows_that_are_not_whole_groups_of_one_prompt_are_refused_naming_the_row():
    with pytest.raises(ValueError, match="5 rows are not whole groups of num_generations=2"):
        prompt_groups(["a"] * 5, 2)
    with pytest.raises(ValueError, match="row 3 differs from row 2, the first of its group"):
        prompt_groups(["a", "a", "b", "c"], 2)
    assert prompt_groups(["a", "b"], 2, check=False) == [(0, 0), (0, 1)]  # a trainer's own key, unchecked
    with pytest.raises(ValueError, match="num_generations must be >= 1"):
        repeat_prompts(["a"], 0)


def test_results_in_completion_order_come_back_in_the_requests_order():
    requests = [_Id(f"r{i}") for i in range(4)]
    assert order_results(requests, [_Id("r2"), _Id("r0"), _Id("r3"), _Id("r1")]) == requests
    with pytest.raises(ValueError, match="no result for rollout 'r3'"):
        order_results(requests, requests[:3])
    with pytest.raises(ValueError, match="two results for rollout 'r1'"):
        order_results(requests, [*requests, _Id("r1")])
    with pytest.raises(ValueError, match=r"no request asked for: \['r9'\]"):
        order_results(requests, [*requests, _Id("r9")])


def test_group_advantages_are_grpos_with_the_sample_std_as_trl_computes_them():
    rewards = [1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 1.0, 1.0]
    advantages = group_advantages(rewards, 4)
    for start in (0, 4):
        group = rewards[start : start + 4]
        mean, std = statistics.fmean(group), statistics.stdev(group)  # torch.std: the sample std
        expected = [(r - mean) / (std + 1e-4) for r in group]
        assert advantages[start : start + 4] == pytest.approx(expected)
    assert advantages[4:] == [0.0] * 4  # one reward for all: no signal
    assert group_advantages(rewards, 4, scale="none") == pytest.approx([0.625, -0.375, -0.375, 0.125, 0, 0, 0, 0])
    batch_std = statistics.stdev(rewards)
    assert group_advantages(rewards, 4, scale="batch")[:4] == pytest.approx(
        [(r - 0.375) / (batch_std + 1e-4) for r in rewards[:4]]
    )


def test_a_failed_rollout_is_left_out_of_its_group_not_counted_as_a_zero_reward():
    """The rule: the failure gets no advantage, and the others' are what they would be without it.
    Counting it as 0 would lower the mean and give the two 0.6 rewards a positive advantage."""
    with_failure = group_advantages([1.0, 0.6, None, 0.6], 4)
    without = group_advantages([1.0, 0.6, 0.6], 3)
    assert with_failure[2] is None
    assert [a for a in with_failure if a is not None] == pytest.approx(without)
    assert with_failure[1] < 0  # a failure counted as 0 would have made this positive
    counted_as_zero = group_advantages([1.0, 0.6, 0.0, 0.6], 4)
    assert counted_as_zero[1] > 0


def test_a_masked_row_is_left_out_like_a_failure_whatever_its_reward():
    masked = group_advantages([1.0, 0.0, 1.0, 0.0], 4, mask=[True, True, False, True])
    assert masked[2] is None
    assert [a for a in masked if a is not None] == pytest.approx(group_advantages([1.0, 0.0, 0.0], 3))


def test_groups_with_one_or_no_included_rollout():
    assert group_advantages([None, 0.7, None, None], 2) == [None, 0.0, None, None]
    assert group_stats([None, 0.7, None, None], 2) == [
        GroupStats(included=1, excluded=1, mean=0.7, std=0.0),
        GroupStats(included=0, excluded=2, mean=None, std=0.0),
    ]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: group_advantages([1.0, 0.0, 1.0], 2), "3 rewards are not whole groups of 2"),
        (lambda: group_advantages([1.0, float("nan")], 2), r"reward 1 is not a finite number: nan"),
        (lambda: group_advantages([1.0, True], 2), "reward 1 is not a finite number: True"),
        (lambda: group_advantages([1.0, 0.0], 2, mask=[True]), "mask has 1 entries for 2 rewards"),
        (lambda: group_advantages([1.0, 0.0], 2, scale="mean"), "scale must be 'group', 'batch' or 'none'"),  # type: ignore[arg-type]
        (lambda: group_advantages([1.0], 0), "group_size must be >= 1"),
    ],
)
def test_bad_input_is_refused_naming_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@given(
    st.integers(min_value=1, max_value=6).flatmap(
        lambda size: st.tuples(
            st.just(size),
            st.lists(
                st.one_of(st.none(), st.floats(min_value=-10, max_value=10)), min_size=size, max_size=size * 5
            ).filter(lambda rewards: len(rewards) % size == 0),
        )
    )
)
def test_every_groups_included_advantages_sum_to_zero_and_excluded_rows_get_none(case):
    size, rewards = case
    advantages = group_advantages(rewards, size, scale="none")
    assert len(advantages) == len(rewards)
    for start in range(0, len(rewards), size):
        group = advantages[start : start + size]
        assert [a is None for a in group] == [r is None for r in rewards[start : start + size]]
        assert math.fsum(a for a in group if a is not None) == pytest.approx(0.0, abs=1e-9)


def test_a_processes_slice_of_the_batch_is_numbered_where_it_stands():
    # 2 prompts x 4 over two processes of 4 rows: process 1 holds group 1
    assert prompt_groups(["a"] * 4, 4, offset=4) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    # 3 processes of 2 rows over groups of 3: process 1 holds the last of group 0 and the first of group 1
    assert prompt_groups(["a", "b"], 3, offset=2) == [(0, 2), (1, 0)]
    assert prompt_groups(["b", "b"], 3, offset=4) == [(1, 1), (1, 2)]
    with pytest.raises(ValueError, match="row 2 differs from row 1"):
        prompt_groups(["a", "b", "c"], 3, offset=2)
    with pytest.raises(ValueError, match="offset must be >= 0"):
        prompt_groups(["a"], 1, offset=-1)
