"""The token-in bridge over real HTTP on 127.0.0.1: SGLang's ``/generate`` in and out, the rollout id
handed to the engine (sticky routing), SGLang's sampling names in the engine's, and every refusal."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from osmosis_trainer.bridge import TokenBridge
from osmosis_trainer.sglang import SamplingError, engine_sampling, sampling_from_sglang
from osmosis_trainer.wire import ROLLOUT_ID_HEADER


class Engine:
    """An engine that answers ``prompt[-1] + 1``, ``+ 2``, ... and records what it was asked."""

    def __init__(self, *, tokens: int = 2, finish: str = "stop", logprobs: object = "ok", fail: bool = False):
        self.seen: list[tuple[str, list[int], dict]] = []
        self.tokens, self.finish, self.logprobs, self.fail = tokens, finish, logprobs, fail

    async def __call__(self, request_id, prompt_ids, sampling_params):
        self.seen.append((request_id, prompt_ids, dict(sampling_params)))
        if self.fail:
            raise RuntimeError("the replica is gone")
        ids = [prompt_ids[-1] + k + 1 for k in range(self.tokens)]
        logprobs = [-0.5 * (k + 1) for k in range(self.tokens)] if self.logprobs == "ok" else self.logprobs
        return ids, logprobs, self.finish


def body(ids=(5, 6, 7), rid="r1-0", **extra):
    return {"input_ids": list(ids), "sampling_params": {}, "return_logprob": True, "rid": rid, "stream": False, **extra}


async def post(bridge, payload, *, headers=None, raw=None):
    async with aiohttp.ClientSession() as session:
        data = raw if raw is not None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
        async with session.post(bridge.url + "/generate", data=data, headers=headers) as response:
            return response.status, await response.json(content_type=None)


def run(engine, *calls, **options):
    """Start a bridge in front of ``engine``, make ``calls`` (coroutine functions of the bridge), stop it."""

    async def main():
        async with TokenBridge(engine, **options) as bridge:
            return bridge, [await call(bridge) for call in calls]

    return asyncio.run(main())


def test_an_sglang_generate_request_is_answered_in_sglangs_shape_with_the_rollout_id_as_the_request_id():
    engine = Engine()
    sampling = {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "max_new_tokens": 32, "seed": 3}

    async def two_calls(bridge):
        headers = {ROLLOUT_ID_HEADER: "rollout-a"}
        first = await post(bridge, body(rid="rollout-a-0", sampling_params=sampling), headers=headers)
        second = await post(bridge, body(ids=(5, 6, 7, 8, 9, 4), rid="rollout-a-1"), headers=headers)
        return first, second

    bridge, [(first, second)] = run(engine, two_calls)
    status, answer = first
    assert status == 200
    assert answer["output_ids"] == [8, 9]
    meta = answer["meta_info"]
    assert meta["id"] == "rollout-a-0"
    assert meta["output_token_logprobs"] == [[-0.5, 8, None], [-1.0, 9, None]]  # SGLang's (logprob, id, text)
    assert meta["finish_reason"] == {"type": "stop"}
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (3, 2)
    assert second[0] == 200
    assert second[1]["meta_info"]["id"] == "rollout-a-1"
    # every call of the rollout reaches the engine under the rollout's id (verl's sticky routing key)
    assert [seen[0] for seen in engine.seen] == ["rollout-a", "rollout-a"]
    assert engine.seen[1][1] == [5, 6, 7, 8, 9, 4]  # the ids exactly as sent
    # SGLang's names in vLLM's, and the logprobs asked for
    assert engine.seen[0][2] == {
        "temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "max_tokens": 32, "seed": 3, "logprobs": True,
    }  # fmt: skip
    usage = bridge.pop_usage("rollout-a")
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens, usage.finish_reasons) == (2, 9, 4, ["stop"] * 2)
    assert bridge.usage("rollout-a") is None


def test_the_sampling_names_follow_the_engine_and_text_only_settings_are_dropped():
    engine = Engine(finish="length")
    sampling = {
        "max_new_tokens": 8, "min_new_tokens": 2, "sampling_seed": 5, "top_k": 1 << 30, "stop": ["</a>"],
        "stop_token_ids": [2], "skip_special_tokens": False, "no_stop_trim": True, "n": 1,
    }  # fmt: skip

    async def one(bridge):
        return await post(bridge, body(sampling_params=sampling))

    _, [(status, answer)] = run(engine, one, names="sglang")
    assert status == 200
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    assert engine.seen[0][2] == {
        "max_new_tokens": 8, "min_new_tokens": 2, "sampling_seed": 5, "top_k": -1, "stop": ["</a>"],
        "stop_token_ids": [2], "logprobs": True,
    }  # fmt: skip
    assert engine_sampling({"max_new_tokens": 8, "min_new_tokens": 2, "sampling_seed": 5}, names="vllm") == {
        "max_tokens": 8,
        "min_tokens": 2,
        "seed": 5,
    }


def test_without_the_rollout_header_the_rid_routes_and_the_text_comes_from_the_decoder():
    engine = Engine()

    async def one(bridge):
        return await post(bridge, body(rid="solo-0", sampling_params={"skip_special_tokens": False}))

    _, [(status, answer)] = run(engine, one, decode=lambda ids, skip: f"{ids}:{skip}")
    assert status == 200
    assert engine.seen[0][0] == "solo-0"
    assert answer["text"] == "[8, 9]:False"


@pytest.mark.parametrize(
    ("payload", "status", "message"),
    [
        ({"text": "hello", "sampling_params": {}}, 400, "text prompts are not served"),
        ({"sampling_params": {}}, 400, "input_ids is required"),
        ({"input_ids": [[1, 2], [3]]}, 400, "one prompt per request"),
        ({"input_ids": []}, 400, "non-empty list"),
        ({"input_ids": [1, -2]}, 400, "non-negative integers, got -2"),
        ({"input_ids": [1], "stream": True}, 400, "non-streaming"),
        ({"input_ids": [1], "sampling_params": {"n": 2}}, 400, "sampling_params.n=2"),
        ({"input_ids": [1], "sampling_params": {"json_schema": "{}"}}, 400, "sampling_params.json_schema"),
        ({"input_ids": [1], "sampling_params": [1]}, 400, "sampling_params must be an object"),
        ([1, 2], 400, "a JSON object"),
    ],
)
def test_a_request_the_bridge_does_not_serve_is_refused_in_sglangs_error_shape_naming_why(payload, status, message):
    engine = Engine()

    async def one(bridge):
        return await post(bridge, payload)

    _, [(got, answer)] = run(engine, one)
    assert got == status
    assert message in answer["error"]["message"]
    assert engine.seen == []


def test_a_body_that_is_not_json_or_too_large_is_refused():
    async def calls(bridge):
        return await post(bridge, None, raw=b"{nope"), await post(bridge, body(ids=range(1, 5000)))

    _, [(bad, large)] = run(Engine(), calls, max_body_bytes=1000)
    assert bad[0] == 400
    assert "not JSON" in bad[1]["error"]["message"]
    assert large[0] == 413


def test_a_token_is_required_when_set_and_beyond_loopback():
    async def calls(bridge):
        return (
            await post(bridge, body()),
            await post(bridge, body(), headers={"Authorization": "Bearer wrong"}),
            await post(bridge, body(), headers={"Authorization": "Bearer s3cret"}),
        )

    bridge, [(none, wrong, right)] = run(Engine(), calls, api_key="s3cret")
    assert (none[0], wrong[0], right[0]) == (401, 401, 200)
    assert bridge.api_key == "s3cret"
    assert "s3cret" not in repr(bridge)
    with pytest.raises(ValueError, match="reachable from other machines: pass api_key"):
        TokenBridge(Engine(), host="0.0.0.0")
    with pytest.raises(ValueError, match="api_key is empty"):
        TokenBridge(Engine(), api_key=" ")
    with pytest.raises(RuntimeError, match="not started"):
        TokenBridge(Engine()).url  # noqa: B018


def test_an_engine_failure_or_a_broken_answer_is_an_error_not_a_guess():
    async def one(bridge):
        return await post(bridge, body(), headers={ROLLOUT_ID_HEADER: "r"})

    bridge, [(status, answer)] = run(Engine(fail=True), one)
    assert status == 500
    assert "RuntimeError: the replica is gone" in answer["error"]["message"]
    assert bridge.pop_usage("r").calls == 1
    _, [(status, answer)] = run(Engine(logprobs=None), one)
    assert (status, answer["error"]["message"]) == (502, "the engine returned no logprobs")
    _, [(status, answer)] = run(Engine(logprobs=[-0.1]), one)
    assert status == 502
    assert "1 logprobs for 2 tokens" in answer["error"]["message"]
    _, [(status, answer)] = run(Engine(finish="completed"), one)
    assert status == 502
    assert "'completed'" in answer["error"]["message"]


def test_slimes_sglang_sampling_dict_becomes_the_rollouts_sampling_params():
    # slime's GenerateState.sampling_params, with its defaults (sglang_rollout.py)
    slime = {
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 1024, "stop": None, "stop_token_ids": None,
        "skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False,
        "sampling_seed": 11,
    }  # fmt: skip
    sampling, dropped = sampling_from_sglang(slime)
    assert sampling is not None
    assert dropped == ()
    assert sampling.to_json() == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 1024, "seed": 11}
    _, dropped = sampling_from_sglang({**slime, "stop_token_ids": [7], "custom_params": {"x": 1}})
    assert dropped == ("custom_params", "stop_token_ids")
    with pytest.raises(ValueError, match=r"sampling_params\.top_p must be in \(0, 1\]"):
        sampling_from_sglang({"top_p": 0})
    with pytest.raises(SamplingError, match="not a setting this engine takes"):
        engine_sampling({"regex": "a+"}, names="vllm")


class RouterEngine:
    """An engine object answering token ids (as verl's server manager does): it asks the stand-in
    SGLang router (``tests/token_engine.py``, a process) and records what it asked and got."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: list[tuple[str, list[int], dict, list[int]]] = []

    async def __call__(self, request_id, prompt_ids, sampling_params):
        payload = {"input_ids": list(prompt_ids), "sampling_params": {}, "return_logprob": True}
        async with aiohttp.ClientSession() as session, session.post(self.url + "/generate", json=payload) as response:
            answer = await response.json()
        ids = answer["output_ids"]
        self.seen.append((request_id, list(prompt_ids), dict(sampling_params), ids))
        logprobs = [entry[0] for entry in answer["meta_info"]["output_token_logprobs"]]
        return ids, logprobs, answer["meta_info"]["finish_reason"]["type"]


def test_a_rollout_of_the_token_in_gateway_reaches_an_engine_object_through_the_bridge(token_in_server):
    """The documented configuration end to end: ``osmosis serve`` with ``[traces] adapter =
    "sglang-generate"`` and the policy's tokenizer folder renders the chat template and parses the
    tool call; its ``/generate`` calls reach an engine object through the bridge, under the rollout's id."""
    from trainer_helpers import LABELS, PROMPTS

    from osmosis_trainer import RolloutClient, RolloutRequest, SamplingParams, rollout_rows

    engine = RouterEngine(token_in_server.engine_url)

    async def rollout():
        async with TokenBridge(engine, api_key="bridge-secret-0123") as bridge:
            request = RolloutRequest(
                rollout_id="bridge-token-in-0", initial_messages=PROMPTS[0], label=LABELS[0],
                chat_completions_url=bridge.url, llm_api_key=bridge.api_key,
                sampling_params=SamplingParams(temperature=1.0, max_tokens=96),
            )  # fmt: skip
            async with RolloutClient(token_in_server.url, token=token_in_server.token) as client:
                return await client.run(request), bridge.pop_usage("bridge-token-in-0")

    result, usage = asyncio.run(rollout())
    assert result.ok, result.error
    assert result.reward == 1.0  # the tool call parsed from the ids, its answer graded
    calls = token_in_server.traces("bridge-token-in-")["bridge-token-in-0"]["calls"]
    assert len(calls) == len(engine.seen) == usage.calls == 2
    for made, (request_id, prompt, sampling, output) in zip(calls, engine.seen, strict=True):
        assert request_id == "bridge-token-in-0"  # every call under the rollout's id (sticky routing)
        assert (made["prompt_token_ids"], made["completion_token_ids"]) == (prompt, output)  # ids exact
        assert made["token_in"]["engine"] == "sglang-generate"
        assert sampling["max_tokens"] == 96  # the trainer's budget, in the engine's names
    assert calls[1]["token_in"]["render"] == "incremental"
    [row] = rollout_rows(result)
    assert (row.prefix_breaks, row.mask_reason) == (0, None)
