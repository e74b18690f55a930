"""The verl agent loop against verl itself (0.9.1, its CPU path): registered through an
``agent_loop_config_path`` YAML and built by verl's ``AgentLoopWorker._run_agent_loop`` (hydra), its
output post-processed and batched by verl's own ``_agent_loop_postprocess`` and ``_postprocess``,
with real rollouts of ``osmosis serve --traces``; and its token-in bridge in front of a server manager
that answers with verl's ``TokenOutput``, as verl's CPU tests fake one
(``tests/experimental/agent_loop/test_agent_loop_extra_fields_schema_on_cpu.py``).

Needs verl installed (the ``verl`` nox session); skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from conftest import REPO
from trainer_helpers import LABELS, PROMPTS, REFUSALS, SETUP_REFUSALS, answering

pytest.importorskip("verl.experimental.agent_loop.agent_loop", reason="verl is not installed (the verl nox session)")

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from osmosis_trainer import RolloutProtocolError, Unauthorized
from osmosis_trainer.verl import EXTRA_FIELDS, OsmosisAgentLoop, close_bridges
from osmosis_trainer.wire import ROLLOUT_ID_HEADER

PROMPT_LENGTH, RESPONSE_LENGTH = 256, 256


class ServerManager:
    """verl's ``LLMServerClient.generate``, faked as verl's CPU tests fake it: it records each call."""

    def __init__(self, *, tokens=(11, 12, 13), stop_reason="completed", steps=7):
        self.calls: list[tuple[str, list[int], dict[str, Any]]] = []
        self.tokens, self.stop_reason, self.steps = list(tokens), stop_reason, steps

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        logprobs = [-0.25] * len(self.tokens)
        return TokenOutput(
            token_ids=self.tokens, log_probs=logprobs, stop_reason=self.stop_reason,
            extra_fields={"global_steps": self.steps}, num_preempted=0,
        )  # fmt: skip


class RouterServerManager(ServerManager):
    """verl's ``LLMServerClient.generate`` in front of real token ids: it asks the stand-in SGLang router
    (``tests/token_engine.py``, a process with the policy's test tokenizer) and answers ``TokenOutput``
    with ``"completed"``, as verl's vLLM server does for a stop and a length cut alike."""

    def __init__(self, url):
        super().__init__()
        self.url = url

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        payload = {"input_ids": list(prompt_ids), "sampling_params": {}, "return_logprob": True}
        async with aiohttp.ClientSession() as session, session.post(self.url + "/generate", json=payload) as response:
            answer = await response.json()
        logprobs = [entry[0] for entry in answer["meta_info"]["output_token_logprobs"]]
        return TokenOutput(
            token_ids=answer["output_ids"], log_probs=logprobs, stop_reason="completed",
            extra_fields={"global_steps": self.steps}, num_preempted=0,
        )  # fmt: skip


class Tokenizer:
    """verl's CPU tests' tokenizer: what its agent loops and post-processing call."""

    padding_side = "right"
    pad_token_id = 0
    eos_token_id = 2

    def apply_chat_template(self, messages, *, tools=None, add_generation_prompt=True, tokenize=True, **kwargs):
        return [101, 102]

    def pad(self, encoded_inputs, *, padding, max_length, return_tensors, return_attention_mask):
        ids = list(encoded_inputs["input_ids"])
        pad = [0] * (max_length - len(ids))
        padded = pad + ids if self.padding_side == "left" else ids + pad
        mask = [0] * len(pad) + [1] * len(ids) if self.padding_side == "left" else [1] * len(ids) + [0] * len(pad)
        out = {"input_ids": torch.tensor([padded], dtype=torch.long)}
        if return_attention_mask:
            out["attention_mask"] = torch.tensor([mask], dtype=torch.long)
        return out

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(96 + i % 26) for i in ids)


def verl_config(**rollout):
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm", "prompt_length": PROMPT_LENGTH, "response_length": RESPONSE_LENGTH,
                    "multi_turn": {"tool_config_path": None}, **rollout,
                },
                "model": {"path": "dummy-model", "tokenizer_path": "dummy-model"},
            },
            "data": {"tool_config_path": None, "apply_chat_template_kwargs": {}, "return_raw_chat": True},
        }
    )  # fmt: skip


def agent_loop(server_manager=None, config=None, tokenizer=None, **options) -> OsmosisAgentLoop:
    config = config or verl_config()
    return OsmosisAgentLoop(
        trainer_config=DictConfigWrap(config),
        server_manager=server_manager or ServerManager(),
        tokenizer=tokenizer or Tokenizer(),
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        **options,
    )


class PostprocessWorker:
    """What verl's ``AgentLoopWorker`` post-processing reads of its worker (as verl's CPU test builds it)."""

    _compute_multi_modal_inputs = AgentLoopWorker._compute_multi_modal_inputs
    _compute_position_ids = AgentLoopWorker._compute_position_ids
    _get_mm_processor_kwargs = AgentLoopWorker._get_mm_processor_kwargs
    _compute_score = AgentLoopWorker._compute_score
    _compute_teacher_logprobs = AgentLoopWorker._compute_teacher_logprobs
    _pad_token_ids = AgentLoopWorker._pad_token_ids
    _agent_loop_postprocess = AgentLoopWorker._agent_loop_postprocess
    _run_agent_loop = AgentLoopWorker._run_agent_loop
    _postprocess = AgentLoopWorker._postprocess
    distillation_enabled = False
    reward_loop_worker_handles = None

    def __init__(self, config, server_manager):
        self.config = config
        self.tokenizer = Tokenizer()
        self.processor = None
        self.hf_model_type = None
        self.dataset_cls = RLHFDataset
        self.tools = []
        self.llm_client = server_manager
        self.rollout_config = config.actor_rollout_ref.rollout
        self.mm_processor_kwargs = {}


def rows():
    """The rows as verl's worker hands them to ``run``: each column a numpy object array (verl's
    ``non_tensor_batch``), a row its ``[i]``: ``raw_prompt`` an array of dicts, ``index`` an int64."""
    columns = {
        "raw_prompt": np.array(PROMPTS, dtype=object),
        "reward_model": np.array([{"ground_truth": label} for label in LABELS], dtype=object),
        "extra_info": np.array([{"index": np.int64(i), "split": "train"} for i in range(2)], dtype=object),
        "index": np.arange(2, dtype=np.int64),
    }
    return [{key: column[i] for key, column in columns.items()} for i in range(2)]


def test_an_agent_loop_config_entry_runs_osmosis_rollouts_through_verls_worker_into_its_batch(
    token_in_server, tmp_path, monkeypatch
):
    """The documented configuration end to end: ``osmosis serve`` with ``[traces] adapter =
    "sglang-generate"`` and the policy's tokenizer folder; the agent loop's bridge in front of verl's
    server manager (here one answering the stand-in router's token ids)."""
    entry = tmp_path / "agent_loops.yaml"
    entry.write_text(
        "- name: osmosis\n"
        "  _target_: osmosis_trainer.verl.OsmosisAgentLoop\n"
        f"  server_url: {token_in_server.url}\n"
        "  token_env: ROLLOUT_TOKEN\n"
        "  rollout_id_prefix: verl-e2e\n"
    )
    monkeypatch.setenv("ROLLOUT_TOKEN", token_in_server.token)
    for loaded in OmegaConf.load(entry):  # what AgentLoopWorker.__init__ does with agent_loop_config_path
        monkeypatch.setitem(_agent_loop_registry, loaded.name, loaded)
    config = verl_config()
    manager = RouterServerManager(token_in_server.engine_url)
    worker = PostprocessWorker(config, manager)
    sampling = {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}

    async def step():
        outputs = []
        for i, row in enumerate(rows()):
            trajectory = {"step": 3, "sample_index": i, "rollout_n": 0, "validate": False}
            outputs.append(await worker._run_agent_loop(dict(sampling), trajectory, agent_name="osmosis", **row))
        await close_bridges()
        return outputs

    internal = asyncio.run(step())
    batch = worker._postprocess(internal, input_non_tensor_batch=None)  # verl's batch of the step
    assert batch.batch["prompts"].shape == (2, PROMPT_LENGTH)
    assert batch.batch["responses"].shape == (2, RESPONSE_LENGTH)
    traces = token_in_server.traces("verl-e2e-")
    assert len(traces) == 2
    for i, output in enumerate(internal):
        extra = output.extra_fields
        assert extra["osmosis_mask_reason"] is None
        rollout_id = extra["osmosis_rollout_id"]
        calls = traces[rollout_id]["calls"]
        first, last = calls[0], calls[-1]
        prompt = first["prompt_token_ids"]
        response = last["prompt_token_ids"][len(prompt) :] + last["completion_token_ids"]
        # verl's left-padded prompt and right-padded response hold the trace's exact ids
        assert batch.batch["prompts"][i, PROMPT_LENGTH - len(prompt) :].tolist() == prompt
        assert batch.batch["responses"][i, : len(response)].tolist() == response
        mask = batch.batch["response_mask"][i, : len(response)].tolist()
        logprobs = batch.batch["rollout_log_probs"][i, : len(response)].tolist()
        assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == pytest.approx(
            first["logprobs"] + last["logprobs"]
        )
        assert 0 in mask  # the tool's answer between the turns
        # the grader's reward on the last response token (verl's rm_scores: its reward function skipped)
        assert batch.batch["rm_scores"][i].tolist() == [0.0] * (len(response) - 1) + [1.0] + [0.0] * (
            RESPONSE_LENGTH - len(response)
        )
        # verl's sampling on every call, with verl's per-turn budget (its dict has no max_tokens):
        # response_length, not the gateway's default nor the agent's
        for made in calls:
            assert made["sampling"] == {
                "temperature": 0.7, "top_p": 0.9, "top_k": -1, "repetition_penalty": 1.0, "max_tokens": RESPONSE_LENGTH,
            }  # fmt: skip
            assert made["token_in"]["engine"] == "sglang-generate"
        asked = [c for c in manager.calls if c[0] == rollout_id]  # sticky: every call under the rollout's id
        assert [c[1] for c in asked] == [c["prompt_token_ids"] for c in calls]
        assert {c[2]["max_tokens"] for c in asked} == {RESPONSE_LENGTH}
    for key in EXTRA_FIELDS:
        assert batch.non_tensor_batch[key].shape == (2,), key
    assert list(batch.non_tensor_batch["osmosis_masked"]) == [False, False]
    results = {
        line["rollout_id"]: line
        for line in map(json.loads, (token_in_server.run_dir / "results.jsonl").read_text().splitlines())
        if line["rollout_id"].startswith("verl-e2e-")
    }
    assert sorted(r["row"] for r in results.values()) == [0, 1]  # verl's int64 index, as the row
    assert batch.meta_info["metrics"][0]["generate_sequences"] > 0.0  # the policy is verl's engine


class ClampingServerManager(ServerManager):
    """verl's servers' budget (0.9.1): ``max_tokens`` lowered to ``max_model_len - len(prompt)``
    (``vllm_async_server.generate``), one fewer on SGLang (``async_sglang_server.generate``); it never
    ends on an end-of-sequence token here (a length cut), and says ``"completed"`` for it."""

    def __init__(self, max_model_len, engine="vllm"):
        super().__init__()
        self.max_model_len = max_model_len
        self.unused = 1 if engine == "sglang" else 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        max_tokens = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens", RESPONSE_LENGTH))
        max_tokens = max(1, min(max_tokens, self.max_model_len - len(prompt_ids) - self.unused))
        return TokenOutput(token_ids=[7] * max_tokens, log_probs=[-0.1] * max_tokens, stop_reason="completed")


def bridge_generate(loop: OsmosisAgentLoop, payload: dict[str, Any]) -> dict[str, Any]:
    """POST ``payload`` to the loop's token-in bridge (SGLang's ``/generate``), as the gateway does; its answer."""

    async def one() -> dict[str, Any]:
        shared = await loop._shared()
        async with (
            aiohttp.ClientSession() as session,
            session.post(shared.bridge.url + "/generate", json=payload) as response,
        ):
            answer: dict[str, Any] = await response.json()
        await close_bridges()
        return answer

    return asyncio.run(one())


MODEL_CONTEXT = 600
"""The test model's ``max_position_embeddings`` (its ``config.json``): verl's context when
``max_model_len`` is unset."""


@pytest.mark.parametrize(
    ("max_model_len", "engine", "prompt", "requested", "generated"),
    [
        (None, "vllm", 300, 4096, 300),  # cut by the model's context (verl's default max_model_len), not the request
        (None, "vllm", 300, 64, 64),  # the request's budget
        (400, "vllm", 100, 4096, 300),  # rollout.max_model_len's room
        (400, "sglang", 100, 4096, 299),  # SGLang leaves one more token unused
        (None, "vllm", 10, None, RESPONSE_LENGTH),  # no max_tokens: verl's response_length
    ],
)
def test_a_generation_cut_by_the_context_is_a_length_finish(
    tmp_path, max_model_len, engine, prompt, requested, generated
):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": MODEL_CONTEXT}))
    config = verl_config(max_model_len=max_model_len, name=engine)
    config.actor_rollout_ref.model.path = str(tmp_path)
    manager = ClampingServerManager(max_model_len or MODEL_CONTEXT, engine)
    loop = agent_loop(manager, config=config, server_url="http://127.0.0.1:9")
    key = "max_new_tokens" if engine == "sglang" else "max_tokens"
    sampling = {} if requested is None else {"max_new_tokens": requested}
    answer = bridge_generate(loop, {"input_ids": [5] * prompt, "sampling_params": sampling, "return_logprob": True})
    assert len(answer["output_ids"]) == generated
    assert answer["meta_info"]["finish_reason"]["type"] == "length"
    assert manager.calls[0][2].get(key) == requested


def test_a_context_that_cannot_be_known_takes_no_generation_for_a_cut(tmp_path):
    """No max_model_len and no readable model config: verl's context is not known, so a generation
    that did not fill the request's budget is a stop, never a guessed cut."""
    manager = ClampingServerManager(PROMPT_LENGTH + RESPONSE_LENGTH)
    loop = agent_loop(manager, config=verl_config(), server_url="http://127.0.0.1:9")  # (model path "dummy-model")
    answer = bridge_generate(loop, {"input_ids": [5] * 300, "sampling_params": {"max_new_tokens": 4096}})
    assert len(answer["output_ids"]) == 212
    assert answer["meta_info"]["finish_reason"]["type"] == "stop"


async def run_answered(status: int, body: object) -> Any:
    """The loop's ``run`` of a row against a stand-in rollout server answering every request ``status``."""
    async with answering(status, body) as url:
        loop = agent_loop(server_url=url, policy_url="http://127.0.0.1:9/v1")
        return await loop.run({"temperature": 1.0}, **rows()[0])


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_per_rollout_client_error_is_a_masked_output_not_the_steps_end(case):
    status, body = REFUSALS[case]

    output = asyncio.run(run_answered(status, body))
    assert output.extra_fields["osmosis_mask_reason"] == "failed"
    assert output.extra_fields["osmosis_mask_detail"].startswith("infra_error: Rollout")
    assert f"(HTTP {status})" in output.extra_fields["osmosis_mask_detail"]
    assert set(output.response_mask) == {0}


@pytest.mark.parametrize("case", sorted(SETUP_REFUSALS))
def test_a_setup_refusal_is_raised_out_of_run(case):
    status, body = SETUP_REFUSALS[case]

    with pytest.raises(RolloutProtocolError, match=str(status)):
        asyncio.run(run_answered(status, body))


def test_a_failed_rollout_is_a_masked_output_verl_batches_and_never_an_exception(
    live_server, start_policy, monkeypatch
):
    failing = start_policy(faults=[{"rollout_id": None, "times": 50, "kind": "status", "status": 500}])  # every call
    monkeypatch.setenv("ROLLOUT_TOKEN", live_server.token)
    loop = agent_loop(server_url=live_server.url, token_env="ROLLOUT_TOKEN", policy_url=failing)
    worker = PostprocessWorker(verl_config(), ServerManager())

    async def one():
        output = await loop.run({"temperature": 1.0}, **rows()[0])
        return output, await worker._agent_loop_postprocess(output, False, **rows()[0])

    output, internal = asyncio.run(one())
    assert isinstance(output, AgentLoopOutput)
    assert output.extra_fields["osmosis_mask_reason"] == "failed"
    assert "policy_error" in output.extra_fields["osmosis_mask_detail"]
    assert set(output.response_mask) == {0}
    assert output.reward_score == 0.0
    assert int(internal.response_mask.sum()) == 0  # nothing of it is trained


def test_the_bridge_hands_verls_server_manager_the_rollout_id_verls_sampling_names_and_reads_its_token_output():
    manager = ServerManager(tokens=[11, 12, 13, 14])
    loop = agent_loop(manager, server_url="http://127.0.0.1:9")

    async def calls():
        shared = await loop._shared()
        assert await loop._shared() is shared  # one bridge per worker (server manager) and event loop
        other = agent_loop(manager, server_url="http://127.0.0.1:9")
        assert await other._shared() is shared  # every agent loop of the worker uses it
        answers = []
        async with aiohttp.ClientSession() as session:
            for max_new_tokens in (4, 64):  # a generation that fills its budget is a length cut
                payload = {
                    "input_ids": [101, 102], "rid": "verl-x-0", "return_logprob": True, "stream": False,
                    "sampling_params": {"temperature": 0.5, "max_new_tokens": max_new_tokens,
                                        "skip_special_tokens": False},
                }  # fmt: skip
                headers = {ROLLOUT_ID_HEADER: "verl-x"}
                async with session.post(shared.bridge.url + "/generate", json=payload, headers=headers) as response:
                    answers.append((response.status, await response.json()))
        extras = shared.engine.pop_extras("verl-x")
        usage = shared.bridge.pop_usage("verl-x")
        await close_bridges()
        return answers, extras, usage

    answers, extras, usage = asyncio.run(calls())
    assert [status for status, _ in answers] == [200, 200]
    assert [a["meta_info"]["finish_reason"]["type"] for _, a in answers] == ["length", "stop"]
    assert answers[0][1]["output_ids"] == [11, 12, 13, 14]
    assert answers[0][1]["meta_info"]["output_token_logprobs"][0] == [-0.25, 11, None]
    assert answers[0][1]["text"] == "klmn"  # the tokenizer's decode
    assert [c[0] for c in manager.calls] == ["verl-x", "verl-x"]  # sticky: the rollout's id
    assert manager.calls[0][2] == {"temperature": 0.5, "max_tokens": 4, "logprobs": True}  # verl's vLLM names
    assert (extras.min_step, extras.max_step, extras.preempted) == (7, 7, 0)
    assert (usage.calls, usage.completion_tokens) == (2, 8)


def test_an_aborted_generation_and_the_sglang_backend():
    manager = ServerManager(stop_reason="aborted")
    loop = agent_loop(manager, config=verl_config(name="sglang"), server_url="http://127.0.0.1:9")

    answer = bridge_generate(loop, {"input_ids": [1], "sampling_params": {"max_new_tokens": 8, "sampling_seed": 3}})
    assert answer["meta_info"]["finish_reason"]["type"] == "abort"
    assert manager.calls[0][2] == {"max_new_tokens": 8, "sampling_seed": 3, "logprobs": True}  # SGLang's names


def test_a_refused_rollout_is_a_setup_error_raised_not_a_masked_sample(live_server):
    loop = agent_loop(server_url=live_server.url, token_env="NO_SUCH_TOKEN", policy_url=live_server.policy_url)
    with pytest.raises(Unauthorized, match="401"):
        asyncio.run(loop.run({}, **rows()[0]))


def test_the_agent_loop_refuses_what_it_cannot_run(monkeypatch):
    monkeypatch.delenv("OSMOSIS_SERVER_URL", raising=False)
    with pytest.raises(ValueError, match="no server_url"):
        agent_loop()
    loop = agent_loop(server_url="http://127.0.0.1:9", policy_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match=r"set data\.return_raw_chat=True"):
        asyncio.run(loop.run({}, index=0))
    bridged = agent_loop(server_url="http://127.0.0.1:9", bridge_token_env="BRIDGE_TOKEN")
    monkeypatch.delenv("BRIDGE_TOKEN", raising=False)
    with pytest.raises(ValueError, match=r"\$BRIDGE_TOKEN, which is unset"):
        asyncio.run(bridged._shared())
    open_bridge = agent_loop(server_url="http://127.0.0.1:9", bridge_host="0.0.0.0")
    with pytest.raises(ValueError, match="reachable from other machines"):
        asyncio.run(open_bridge._shared())


def test_a_bridge_on_every_address_needs_its_token_and_advertises_the_nodes_address(monkeypatch):
    import ray.util

    monkeypatch.setenv("BRIDGE_TOKEN", "s3cret-bridge")
    loop = agent_loop(server_url="http://127.0.0.1:9", bridge_host="0.0.0.0", bridge_token_env="BRIDGE_TOKEN")

    async def calls():
        shared = await loop._shared()
        local = shared.bridge.url.replace(ray.util.get_node_ip_address(), "127.0.0.1")
        statuses = []
        async with aiohttp.ClientSession() as session:
            for headers in ({}, {"Authorization": "Bearer s3cret-bridge"}):
                async with session.post(local + "/generate", json={"input_ids": [1]}, headers=headers) as response:
                    statuses.append(response.status)
        url, key = shared.bridge.url, shared.bridge.api_key
        await close_bridges()
        return url, key, statuses

    url, key, statuses = asyncio.run(calls())
    assert url.startswith(f"http://{ray.util.get_node_ip_address()}:")  # what the rollout server is told
    assert key == "s3cret-bridge"  # sent as each rollout's llm_api_key
    assert statuses == [401, 200]


def test_the_documented_agent_loop_config_is_what_verls_worker_instantiates(monkeypatch):
    import hydra

    example = REPO / "examples" / "verl_agent_loops.yaml"
    [entry] = OmegaConf.load(example)  # as AgentLoopWorker reads agent_loop_config_path
    assert entry.name == "osmosis"
    config = verl_config()
    loop = hydra.utils.instantiate(  # AgentLoopWorker._run_agent_loop's call
        config=entry,
        trainer_config=DictConfigWrap(config=config),
        server_manager=ServerManager(),
        tokenizer=Tokenizer(),
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=None,
    )
    assert isinstance(loop, OsmosisAgentLoop)
    assert (loop.server_url, loop.token_env) == ("http://rollouts:8100", "OSMOSIS_SERVER_TOKEN")
    assert (loop.bridge_host, loop.bridge_token_env, loop.mask_truncated) == ("0.0.0.0", "OSMOSIS_BRIDGE_TOKEN", False)
