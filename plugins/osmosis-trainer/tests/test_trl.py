"""The TRL adapter against TRL's real ``GRPOTrainer`` (trl 1.16), a real ``osmosis serve --traces`` in
a process of its own, and the tiny model served live (``LivePolicyServer``): what reaches the
rollout server, what TRL gets back, and every way a row is masked instead of trained on.

Needs torch, transformers and trl (the ``train`` nox session; marker ``torch``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from conftest import rollout_server
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from osmosis_trainer import trace_from_json
from osmosis_trainer.live_policy import LivePolicyServer, weights_fingerprint
from osmosis_trainer.tiny_model import char_tokenizer, tiny_model
from osmosis_trainer.trl import ROW_FIELDS, OsmosisRollout, RolloutConfigError, osmosis_reward

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
TWO_TURNS = HERE / "rollouts" / "two_turns.toml"


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


@pytest.fixture
def model(tokenizer):
    return tiny_model(tokenizer, seed=0)


@pytest.fixture
def policy(model, tokenizer):
    with LivePolicyServer(model, tokenizer, tool_parser="tiny") as server:
        yield server


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with rollout_server(TWO_TURNS, tmp_path_factory.mktemp("two-turns")) as server:
        yield server


def dataset(*faults):
    """One row per fault (None: a clean row), each prompt its own."""
    return Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"row {i}"}], "ground_truth": f"label-{i}", "fault": fault or ""}
            for i, fault in enumerate(faults)
        ]
    )


def trainer_for(model, tokenizer, data, rollout_func, tmp_path, **settings):
    options = {
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 2 * len(data),
        "num_generations": 2,
        "max_steps": 1,
        "max_completion_length": 64,
        "learning_rate": 1e-2,
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "bf16": False,
        "disable_tqdm": True,
        "shuffle_dataset": False,
        **settings,
    }
    return GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=GRPOConfig(**options),
        train_dataset=data,
        reward_funcs=[osmosis_reward],
        rollout_func=rollout_func,
    )


class Recording:
    """The adapter, and what it handed TRL at each step."""

    def __init__(self, rollout):
        self.rollout = rollout
        self.outputs = []

    def __call__(self, prompts, trainer):
        output = self.rollout(prompts, trainer)
        self.outputs.append(output)
        return output


def results_lines(run_dir):
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def test_a_training_step_runs_one_rollout_per_row_and_trl_trains_on_the_traced_tokens(
    served, policy, model, tokenizer, tmp_path
):
    data = dataset(None, None)
    rollout = OsmosisRollout(served.url, token=served.token, policy_url=policy.url, dataset=data, max_tokens=12)
    recording = Recording(rollout)
    settings = {"temperature": 0.9, "top_p": 0.95, "top_k": 50, "max_completion_length": 60}
    trainer = trainer_for(model, tokenizer, data, recording, tmp_path, **settings)
    trainer.train()

    [output] = recording.outputs
    assert set(output) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", *ROW_FIELDS}
    assert all(len(values) == 4 for values in output.values())  # one row back per row given (2 prompts x 2)
    results = rollout.last_results
    assert [r.ok for r in results] == [True] * 4
    for index, result in enumerate(results):
        trace = trace_from_json(result.trace)
        first, second = trace.calls
        assert len(trace.calls) == 2
        assert trace.complete
        # the row is the trace's tokens, never re-tokenized: the first prompt, then everything after it
        assert output["prompt_ids"][index] == list(first.prompt_token_ids)
        between = list(second.prompt_token_ids[len(first.prompt_token_ids) + len(first.completion_token_ids) :])
        assert between, "the tool / user turn between the calls has tokens"
        expected = [*first.completion_token_ids, *between, *second.completion_token_ids]
        assert output["completion_ids"][index] == expected
        mask = [1] * len(first.completion_token_ids) + [0] * len(between) + [1] * len(second.completion_token_ids)
        assert output["env_mask"][index] == mask
        assert output["logprobs"][index] == [*first.logprobs, *[0.0] * len(between), *second.logprobs]
        assert output["osmosis_reward"][index] == result.reward
        assert output["osmosis_mask_reason"][index] is None
        for call in trace.calls:  # the trainer's sampling, on every call, and the policy version
            assert call.policy_version == "step-0"
            assert call.sampling == {
                "temperature": 0.9,
                "top_p": 0.95,
                "top_k": 50,
                "min_p": 0.0,
                "repetition_penalty": 1.0,
                "max_tokens": 12,
            }
    # the dataset row reached the server: its index, its label, its other columns as metadata
    lines = {line["rollout_id"]: line for line in results_lines(served.run_dir)}
    assert sorted(lines[r.rollout_id]["row"] for r in results) == [0, 0, 1, 1]
    # TRL's reward is the graders' (the mean over the rows)
    logged = trainer.state.log_history[0]
    assert logged["reward"] == pytest.approx(sum(r.reward for r in results) / 4, abs=1e-6)
    assert logged["osmosis/masked"] == 0.0
    assert rollout.stats.rollouts == 4
    assert rollout.stats.masked_rows == 0
    assert rollout.stats.steps[0].policy_version == "step-0"


def test_rows_that_must_not_be_trained_on_are_masked_and_left_out_of_their_groups(
    served, policy, model, tokenizer, tmp_path, caplog
):
    data = dataset("raise-odd", "rewrite", "incomplete", None)
    rollout = OsmosisRollout(served.url, token=served.token, policy_url=policy.url, dataset=data, max_tokens=8)
    recording = Recording(rollout)
    trainer = trainer_for(model, tokenizer, data, recording, tmp_path)
    with caplog.at_level(logging.WARNING, logger="osmosis_trainer.trl"):
        trainer.train()

    [output] = recording.outputs
    reasons = output["osmosis_mask_reason"]
    assert reasons == [
        None,
        "failed",
        "prefix_break",
        "prefix_break",
        "incomplete_trace",
        "incomplete_trace",
        None,
        None,
    ]
    for index, reason in enumerate(reasons):
        if reason is None:
            assert 1 in output["env_mask"][index]
            assert output["osmosis_reward"][index] is not None
        else:  # no loss on any of its tokens, no reward for TRL's group statistics
            assert set(output["env_mask"][index]) == {0}
            assert set(output["logprobs"][index]) == {0.0}
            assert output["osmosis_reward"][index] is None
            assert output["osmosis_mask_detail"][index]
    assert "RuntimeError" in output["osmosis_mask_detail"][1]
    assert output["osmosis_complete"][4] is False
    assert output["osmosis_prefix_breaks"][2] == 1
    # TRL left the masked rows out: its reward is the mean over the three others
    kept = [r.reward for r, reason in zip(rollout.last_results, reasons, strict=True) if reason is None]
    logged = trainer.state.log_history[0]
    assert logged["reward"] == pytest.approx(sum(kept) / 3, abs=1e-6)
    assert logged["osmosis/masked"] == pytest.approx(5 / 8)
    assert logged["osmosis/masked_failed"] == pytest.approx(1 / 8)
    assert logged["osmosis/masked_prefix_break"] == pytest.approx(2 / 8)
    assert logged["osmosis/masked_incomplete_trace"] == pytest.approx(2 / 8)
    assert logged["osmosis/prefix_breaks"] == pytest.approx(2 / 8)
    stats = rollout.stats
    assert stats.masked == {"failed": 1, "prefix_break": 2, "incomplete_trace": 2}
    assert stats.failed == {"agent_error": 1}
    assert stats.incomplete_traces == 2
    assert stats.prefix_breaks == 2
    assert "5 of 8 rows masked, not trained on (failed 1, incomplete_trace 2, prefix_break 2)" in caplog.text


def test_a_step_whose_every_row_is_masked_leaves_the_weights_as_they_were(served, policy, model, tokenizer, tmp_path):
    data = dataset("raise", "raise")
    rollout = OsmosisRollout(
        served.url, token=served.token, policy_url=policy.url, dataset=data, max_tokens=8, max_masked_steps=None
    )
    trainer = trainer_for(model, tokenizer, data, rollout, tmp_path)
    before = weights_fingerprint(model, values_per_tensor=10**9)
    trainer.train()
    assert rollout.stats.masked == {"failed": 4}
    assert weights_fingerprint(model, values_per_tensor=10**9) == before
    assert trainer.state.log_history[0]["reward"] is None  # no scorable row: TRL logs no reward
    assert trainer.state.log_history[0]["osmosis/masked"] == 1.0


def test_a_run_that_would_train_on_nothing_stops_with_the_reason(served, policy, model, tokenizer, tmp_path):
    data = dataset("raise", "raise")
    rollout = OsmosisRollout(served.url, token=served.token, policy_url=policy.url, dataset=data, max_tokens=8)
    trainer = trainer_for(model, tokenizer, data, rollout, tmp_path)
    with pytest.raises(RolloutConfigError, match=r"every rollout of the first step failed \(e\.g\. .*RuntimeError"):
        trainer.train()
    # every row masked for another reason (here: cut), step after step: stopped after max_masked_steps
    clean = dataset(None)
    rollout = OsmosisRollout(
        served.url, token=served.token, policy_url=policy.url, dataset=clean, max_tokens=8, max_masked_steps=2
    )
    trainer = trainer_for(model, tokenizer, clean, rollout, tmp_path, max_steps=5, max_completion_length=3)
    with pytest.raises(RolloutConfigError, match=r"2 steps in a row trained on nothing: every row masked \(truncated"):
        trainer.train()
    assert len(rollout.stats.steps) == 2


def test_a_row_cut_to_max_completion_length_is_masked_unless_kept(served, policy, model, tokenizer, tmp_path):
    data = dataset(None, None)
    outputs = {}
    for truncated in ("mask", "keep"):
        rollout = OsmosisRollout(
            served.url, token=served.token, policy_url=policy.url, dataset=data, max_tokens=8, truncated=truncated
        )
        recording = Recording(rollout)
        trainer = trainer_for(model, tokenizer, data, recording, tmp_path, max_completion_length=5)
        trainer.train()
        [outputs[truncated]] = recording.outputs
    cut, kept = outputs["mask"], outputs["keep"]
    assert all(len(ids) == 5 for ids in cut["completion_ids"])  # two calls of up to 8 tokens: always cut
    assert cut["osmosis_truncated"] == kept["osmosis_truncated"] == [True] * 4
    assert cut["osmosis_mask_reason"] == ["truncated"] * 4
    assert {m for mask in cut["env_mask"] for m in mask} == {0}
    assert cut["osmosis_reward"] == [None] * 4
    assert all("cut to 5 of its" in detail for detail in cut["osmosis_mask_detail"])
    assert kept["osmosis_mask_reason"] == [None] * 4
    assert all(1 in mask for mask in kept["env_mask"])
    assert None not in kept["osmosis_reward"]


def test_each_request_carries_the_rows_label_metadata_index_and_the_trainers_sampling(
    policy, model, tokenizer, tmp_path
):
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "a"}], "label": "1", "level": "easy"},
            {"prompt": [{"role": "user", "content": "b"}], "label": "2", "level": "hard"},
        ]
    )
    rollout = OsmosisRollout("http://127.0.0.1:9", dataset=data, run_id="run7")
    settings = {
        "top_k": 0,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "generation_kwargs": {"seed": 3, "do_sample": True},
    }
    trainer = trainer_for(model, tokenizer, data, rollout, tmp_path, **settings)
    prompts = [data[1]["prompt"]] * 2 + [data[0]["prompt"]] * 2  # as TRL hands them over
    with pytest.raises(RolloutConfigError, match="no policy for the rollouts to call"):
        rollout.requests(prompts, trainer)
    # TRL's vLLM server mode (trl vllm-serve)
    trainer.args.use_vllm, trainer.args.vllm_mode, trainer.args.vllm_server_base_url = (
        True,
        "server",
        "http://10.0.0.7:8000/",
    )
    requests = rollout.requests(prompts, trainer)
    assert [(r.row, r.sample_index, r.label, r.metadata) for r in requests] == [
        (1, 0, "2", {"level": "hard"}),
        (1, 1, "2", {"level": "hard"}),
        (0, 0, "1", {"level": "easy"}),
        (0, 1, "1", {"level": "easy"}),
    ]
    assert [r.rollout_id for r in requests] == [
        "run7-000000-c0-g0-s0",
        "run7-000000-c0-g0-s1",
        "run7-000000-c0-g1-s0",
        "run7-000000-c0-g1-s1",
    ]
    assert {r.chat_completions_url for r in requests} == {"http://10.0.0.7:8000/v1"}
    assert {r.policy_version for r in requests} == {"step-0"}
    assert requests[0].initial_messages == [{"role": "user", "content": "b"}]
    seeds = [r.sampling_params.seed for r in requests]
    assert requests[0].sampling_params.to_json() == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,  # TRL's 0 (off), as vLLM and SGLang read it
        "min_p": 0.05,
        "seed": seeds[0],  # generation_kwargs: the sampling fields among them
        "repetition_penalty": 1.1,
        "max_tokens": 64,  # max_completion_length
    }
    # the trainer's seed, made each rollout's own: one seed for a whole group would make its samples one
    assert len(set(seeds)) == 4
    assert seeds == [r.sampling_params.seed for r in rollout.requests(prompts, trainer)]  # reproducible
    trainer.args.vllm_mode = "colocate"
    with pytest.raises(RolloutConfigError, match="vllm_mode='colocate' runs vLLM inside the trainer"):
        rollout.requests(prompts, trainer)
    # data parallel, 2 rows a process, groups of 4: process 1 holds the last two samples of group 0
    trainer.args.num_generations = trainer.num_generations = 4
    trainer.args.vllm_mode = "server"
    trainer.accelerator = SimpleNamespace(num_processes=2, process_index=1)
    sliced = rollout.requests([data[0]["prompt"]] * 2, trainer)
    slots = [(r.rollout_id.split("-p1-")[1], r.row, r.sample_index) for r in sliced]
    assert slots == [("g0-s2", 0, 2), ("g0-s3", 0, 3)]


def test_setups_that_cannot_train_are_refused_with_the_reason(served, policy, model, tokenizer, tmp_path):
    data = dataset(None)
    prompts = [data[0]["prompt"]] * 2
    with rollout_server(TWO_TURNS, tmp_path / "plain", traces=False) as plain:
        no_traces = OsmosisRollout(plain.url, token=plain.token, policy_url=policy.url, dataset=data, max_tokens=4)
        trainer = trainer_for(model, tokenizer, data, no_traces, tmp_path)
        with pytest.raises(RolloutConfigError, match="start it with `osmosis serve CONFIG --traces`"):
            no_traces(prompts, trainer)
    rollout = OsmosisRollout(served.url, token=served.token, policy_url=policy.url, dataset=data, max_tokens=4)
    with pytest.raises(RolloutConfigError, match="prompt 0 of step 0 is not in the dataset"):
        rollout([[{"role": "user", "content": "not a row"}]] * 2, trainer)
    with pytest.raises(ValueError, match="row 1 differs from row 0"):  # not each prompt num_generations times
        rollout([data[0]["prompt"], [{"role": "user", "content": "x"}]], trainer)
    twins = Dataset.from_list([{"prompt": "same", "ground_truth": "1"}, {"prompt": "same", "ground_truth": "2"}])
    with pytest.raises(RolloutConfigError, match="rows 0 and 1 have the same prompt and different labels"):
        OsmosisRollout(served.url, policy_url=policy.url, dataset=twins)(["same", "same"], trainer)

    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key.
        """
        return key

    trainer.tools = [lookup]  # what GRPOTrainer(tools=...) sets
    with pytest.raises(RolloutConfigError, match="give the tools to the rollout's workflow"):
        OsmosisRollout(served.url, policy_url=policy.url)(prompts, trainer)


def test_the_reward_function_hands_trl_the_graders_reward_and_refuses_rows_without_one():
    rewards = osmosis_reward(
        ["a", "b", "c"],
        osmosis_reward=[0.5, 1.0, None],
        osmosis_mask_reason=[None, "incomplete_trace", "failed"],
        osmosis_prefix_breaks=[0, 0, 0],
    )
    assert rewards == [0.5, None, None]
    with pytest.raises(RolloutConfigError, match="unsloth #3573"):
        osmosis_reward(["a"], prompts=["p"])
