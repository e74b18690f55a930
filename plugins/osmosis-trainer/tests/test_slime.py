"""slime's custom generate function: rollout results as slime ``Sample`` objects (every kind of trace),
and real rollouts of ``osmosis serve --traces`` driven through ``generate(args, sample, sampling_params)``.

slime is not installable here (PyPI holds a 0.0.0 placeholder): its ``Sample`` is read by duck typing,
so these tests use a minimal stand-in of ours with the fields slime's has and the checks slime's
training applies (``ray/rollout.py``: ``len(loss_mask) == response_length``;
``observability/rollout_data_utils.py``: siblings of one rollout share one non-None ``rollout_id``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import importlib
import itertools
import re
from array import array
from types import SimpleNamespace
from typing import Any

import pytest
import trainer_helpers
from conftest import REPO
from trainer_helpers import LABELS, PROMPTS, REFUSALS, SETUP_REFUSALS, answering, call

from osmosis_trainer import RolloutProtocolError, Unauthorized
from osmosis_trainer.slime import check_args, generate, prompt_messages, samples_of
from osmosis_trainer.slime.rollout import ROLLOUT_ID_PREFIX, _policy_url


@dataclasses.dataclass
class Sample:
    """A stand-in for slime's ``slime.utils.types.Sample`` (the fields the adapter reads and sets)."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = dataclasses.field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False
    status: Status = Status.PENDING
    metadata: dict = dataclasses.field(default_factory=dict)


def slime_checks(samples: list[Sample]) -> None:
    """What slime's training asserts of a custom generate function's samples."""
    for sample in samples:
        assert len(sample.loss_mask) == sample.response_length >= 1
        assert len(sample.rollout_log_probs) == sample.response_length
        assert sample.reward is not None  # set: slime's reward model is skipped
        assert all(lp == 0.0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask, strict=True) if not m)
    if len(samples) > 1:
        assert None not in {s.rollout_id for s in samples}
        assert len({s.rollout_id for s in samples}) == 1


MESSAGES = [{"role": "user", "content": "6 * 7?"}, {"role": "assistant", "content": "#### 42"}]
CLEAN = [call(0, [1, 2, 3], [4, 5]), call(1, [1, 2, 3, 4, 5, 9], [6])]


def result_of(calls, **options):
    return trainer_helpers.result_of(calls, messages=MESSAGES, **options)


def test_one_sequence_fills_the_sample_slime_handed_over():
    sample = Sample(group_index=3, index=12, metadata={"source": "gsm8k"}, label="42")
    [out] = samples_of(result_of(CLEAN, finish="stop"), sample)
    assert out is sample
    assert (out.tokens, out.response_length) == ([1, 2, 3, 4, 5, 9, 6], 4)
    assert (out.loss_mask, out.rollout_log_probs) == ([1, 1, 0, 1], [-0.1, -0.2, 0.0, -0.1])
    assert (out.reward, out.status, out.remove_sample, out.rollout_id) == (1.0, Sample.Status.COMPLETED, False, 12)
    assert out.response == "#### 42"
    assert out.metadata["source"] == "gsm8k"
    assert (out.metadata["osmosis_rollout_id"], out.metadata["osmosis_mask_reason"]) == ("r", None)
    slime_checks([out])


def test_a_forked_rollout_is_a_list_of_samples_sharing_one_rollout_id_each_with_the_whole_reward():
    forked = [*CLEAN, call(2, [1, 2, 3, 4, 5, 9], [7, 7])]
    sample = Sample(group_index=0, index=5, metadata={"k": 1})
    samples = samples_of(result_of(forked, reward=0.5), sample)
    assert len(samples) == 2
    assert samples[0] is sample
    assert [s.rollout_id for s in samples] == [5, 5]  # slime's rule: the rollout id, else the index
    assert [s.tokens for s in samples] == [[1, 2, 3, 4, 5, 9, 6], [1, 2, 3, 4, 5, 9, 7, 7]]
    assert [s.loss_mask for s in samples] == [[1, 1, 0, 1], [0, 0, 0, 1, 1]]  # the shared call trained once
    assert [s.reward for s in samples] == [0.5, 0.5]
    assert samples[0].metadata is not samples[1].metadata
    assert [s.metadata["osmosis_sequences"] for s in samples] == [2, 2]
    assert [s.response for s in samples] == ["", "#### 42"]
    slime_checks(samples)


def test_a_broken_prefix_is_two_samples_and_an_own_rollout_id_is_kept():
    drifted = [call(0, [1, 2, 3], [4, 5]), call(1, [1, 2, 3, 8], [6])]
    samples = samples_of(result_of(drifted), Sample(index=1, rollout_id=77))
    assert [s.rollout_id for s in samples] == [77, 77]
    assert [s.metadata["osmosis_prefix_breaks"] for s in samples] == [1, 1]
    assert all(s.status is Sample.Status.COMPLETED for s in samples)
    slime_checks(samples)


@pytest.mark.parametrize(
    ("result", "status", "reason"),
    [
        (result_of(None, status="failure", reward=None), Sample.Status.FAILED, "failed"),
        (result_of(None), Sample.Status.FAILED, "no_trace"),
        (result_of([call(0, [1], [2]), call(1, [1, 2, 3], None, status="cut")], incomplete="cut"), Sample.Status.FAILED,
         "incomplete_trace"),
        (result_of(None, status="cancelled", reward=None), Sample.Status.ABORTED, "failed"),
    ],
)  # fmt: skip
def test_a_rollout_that_cannot_be_trained_on_is_removed_never_raised(result, status, reason):
    sample = Sample(index=0, tokens=[99])
    [out] = samples_of(result, sample)
    assert out.status is status
    assert out.remove_sample is True
    assert set(out.loss_mask) == {0}
    assert out.metadata["osmosis_mask_reason"] == reason
    assert out.reward == (0.0 if result.reward is None else result.reward)  # the grader's, when there is one
    slime_checks([out])


def test_a_length_cut_is_truncated_and_max_context_cuts_the_response():
    [out] = samples_of(result_of(CLEAN, finish="length"), Sample(index=0))
    assert out.status is Sample.Status.TRUNCATED
    assert out.remove_sample is False  # slime trains on truncated samples
    [cut] = samples_of(result_of(CLEAN, finish="stop"), Sample(index=0), max_context_tokens=5)
    assert (cut.tokens, cut.loss_mask, cut.status) == ([1, 2, 3, 4, 5], [1, 1], Sample.Status.TRUNCATED)
    assert cut.metadata["osmosis_truncated"] is True
    [masked] = samples_of(result_of(CLEAN), Sample(index=0), max_context_tokens=5, mask_truncated=True)
    assert (masked.loss_mask, masked.remove_sample) == ([0, 0], True)
    assert masked.metadata["osmosis_mask_reason"] == "truncated"
    slime_checks([out, cut, masked])


def test_a_prompt_is_messages_or_text_never_a_rendered_template():
    assert prompt_messages("6 * 7?") == [{"role": "user", "content": "6 * 7?"}]
    assert prompt_messages(PROMPTS[0]) == PROMPTS[0]
    with pytest.raises(ValueError, match="Drop the flag"):
        prompt_messages("<|im_start|>user ...", apply_chat_template=True)
    with pytest.raises(ValueError, match="messages or text, got int"):
        prompt_messages(7)
    assert (
        _policy_url(SimpleNamespace(sglang_router_ip="10.0.0.2", sglang_router_port=30000)) == "http://10.0.0.2:30000"
    )


def slime_args(router="127.0.0.1:9", **extra):
    ip, _, port = router.rpartition(":")
    options = {"apply_chat_template": False, "rollout_max_context_len": None, "rollout_top_p": 1.0, **extra}
    return SimpleNamespace(sglang_router_ip=ip, sglang_router_port=int(port), **options)


# slime's GenerateState.sampling_params for a run with these flags (sglang_rollout.py)
SLIME_SAMPLING = {
    "temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_new_tokens": 256, "stop": None, "stop_token_ids": None,
    "skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False,
}  # fmt: skip


def slime_flatten(data):
    """slime's ``RolloutManager._get_rollout_data`` (624b824), verbatim: a batch of groups flattened."""
    while isinstance(data[0], list):
        data = list(itertools.chain.from_iterable(data))
    return data


def test_generate_runs_a_rollout_through_the_token_in_gateway_against_slimes_router(token_in_server, monkeypatch):
    """The documented configuration: ``osmosis serve`` with ``[traces] adapter = "sglang-generate"``
    and the policy's tokenizer, its ``/generate`` calls going to slime's router (a stand-in SGLang
    router here); every sample comes back as a list (of one), whatever the batch mixes."""
    monkeypatch.setenv("OSMOSIS_SERVER_URL", token_in_server.url)
    monkeypatch.setenv("OSMOSIS_SERVER_TOKEN", token_in_server.token)
    monkeypatch.delenv("OSMOSIS_POLICY_URL", raising=False)  # the router of slime's args
    router = token_in_server.engine_url.removeprefix("http://")
    group = [Sample(group_index=0, index=i, prompt=PROMPTS[i], label=LABELS[i]) for i in range(2)]

    async def rollouts():
        return await asyncio.gather(*(generate(slime_args(router), s, dict(SLIME_SAMPLING)) for s in group))

    outs = asyncio.run(rollouts())
    traces = token_in_server.traces(ROLLOUT_ID_PREFIX)
    for out, sample in zip(outs, group, strict=True):
        assert isinstance(out, list)
        [filled] = out
        assert filled is sample
        assert (filled.status, filled.reward, filled.remove_sample) == (Sample.Status.COMPLETED, 1.0, False)
        calls = traces[filled.metadata["osmosis_rollout_id"]]["calls"]
        first, last = calls[0], calls[-1]
        assert filled.tokens == last["prompt_token_ids"] + last["completion_token_ids"]
        assert filled.response_length == len(filled.tokens) - len(first["prompt_token_ids"])
        trained = [lp for lp, m in zip(filled.rollout_log_probs, filled.loss_mask, strict=True) if m]
        assert trained == first["logprobs"] + last["logprobs"]
        for made in calls:  # slime's sampling, in the rollout's names, on every call; the ids token-in
            assert made["sampling"] == {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_tokens": 256}
            assert made["token_in"]["engine"] == "sglang-generate"
        slime_checks(out)
    # a forked rollout's list next to these in one group: slime's flattening gives Samples only
    forked = samples_of(result_of([*CLEAN, call(2, [1, 2, 3, 4, 5, 9], [7, 7])]), Sample(index=5))
    for batch in ([[outs[0], forked, outs[1]]], [[forked, *outs]]):
        flat = slime_flatten(batch)
        assert [type(s) for s in flat] == [Sample] * 4
        assert [s.reward for s in flat] == [1.0, 1.0, 1.0, 1.0]


def test_generate_reports_a_failed_rollout_on_the_sample(live_server, start_policy, monkeypatch):
    failing = start_policy(faults=[{"rollout_id": None, "times": 50, "kind": "status", "status": 500}])
    monkeypatch.setenv("OSMOSIS_SERVER_URL", live_server.url)
    monkeypatch.setenv("OSMOSIS_SERVER_TOKEN", live_server.token)
    monkeypatch.setenv("OSMOSIS_POLICY_URL", failing)
    sample = Sample(group_index=1, index=0, prompt=PROMPTS[0], label=LABELS[0])
    [out] = asyncio.run(generate(slime_args(), sample, dict(SLIME_SAMPLING), evaluation=False))
    assert (out.status, out.remove_sample, out.reward) == (Sample.Status.FAILED, True, 0.0)
    assert "policy_error" in out.metadata["osmosis_mask_detail"]
    slime_checks([out])
    monkeypatch.delenv("OSMOSIS_SERVER_URL")
    with pytest.raises(ValueError, match="OSMOSIS_SERVER_URL is not set"):
        asyncio.run(generate(slime_args(), Sample(prompt="x"), {}))


def test_the_documented_flag_names_the_generate_function_as_slimes_load_function_resolves_it():
    script = (REPO / "examples" / "slime_osmosis.sh").read_text()
    [path] = re.findall(r"--custom-generate-function-path (\S+)", script)
    module, _, name = path.rpartition(".")  # slime.utils.misc.load_function
    assert getattr(importlib.import_module(module), name) is generate
    assert "--apply-chat-template\n" not in script.replace("no --apply-chat-template", "")


def test_a_refused_rollout_is_raised_not_a_failed_sample(live_server, monkeypatch):
    monkeypatch.setenv("OSMOSIS_SERVER_URL", live_server.url)
    monkeypatch.setenv("OSMOSIS_SERVER_TOKEN", "not-the-token")
    monkeypatch.setenv("OSMOSIS_POLICY_URL", live_server.policy_url)
    sample = Sample(group_index=0, index=0, prompt=PROMPTS[0], label=LABELS[0], metadata={"n": array("i", [1])})
    with pytest.raises(Unauthorized, match="401"):  # a setup error: slime's run stops with it
        asyncio.run(generate(slime_args(), sample, dict(SLIME_SAMPLING)))


async def generate_answered(status: int, body: object, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """``generate`` on a sample against a stand-in rollout server answering every request ``status``."""
    async with answering(status, body) as url:
        monkeypatch.setenv("OSMOSIS_SERVER_URL", url)
        return await generate(slime_args(), Sample(group_index=0, index=0, prompt=PROMPTS[0]), {})


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_per_rollout_client_error_is_a_failed_sample_not_the_steps_end(case, monkeypatch):
    status, body = REFUSALS[case]

    [out] = asyncio.run(generate_answered(status, body, monkeypatch))
    assert (out.status, out.remove_sample, out.reward) == (Sample.Status.FAILED, True, 0.0)
    assert out.metadata["osmosis_mask_reason"] == "failed"
    assert out.metadata["osmosis_mask_detail"].startswith("infra_error: Rollout")
    slime_checks([out])


@pytest.mark.parametrize("case", sorted(SETUP_REFUSALS))
def test_a_setup_refusal_is_raised(case, monkeypatch):
    status, body = SETUP_REFUSALS[case]

    with pytest.raises(RolloutProtocolError, match=str(status)):
        asyncio.run(generate_answered(status, body, monkeypatch))


def test_a_rollout_top_p_below_one_is_refused_naming_the_flag(monkeypatch):
    monkeypatch.setenv("OSMOSIS_SERVER_URL", "http://127.0.0.1:9")
    with pytest.raises(ValueError, match=r"--rollout-top-p 0\.9: .*rollout_top_p_token_ids"):
        asyncio.run(generate(slime_args(rollout_top_p=0.9), Sample(prompt="x"), {"top_p": 0.9}))
    check_args(slime_args(rollout_top_p=1.0))
    script = (REPO / "examples" / "slime_osmosis.sh").read_text()
    assert "--rollout-top-p 1" in script
    assert "--group-rm" in script  # named: not to be used
