"""A trainer's sampling settings (``PolicyEndpoint.sampling``): their checks, how they win over the
workflow's, and that they reach the policy over real HTTP, in-process and from a worker process."""

from __future__ import annotations

import logging
import pickle

import anyio
import pytest

from osmosis_core import AgentWorkflow, ExecutionRequest, ExecutionResult, PolicyEndpoint, chat_completion
from osmosis_core._engine.registry import PluginRegistry
from osmosis_core._engine.workers import WorkerPool
from osmosis_core.hookspecs import hookimpl
from osmosis_core.plugin import SharedGateways
from osmosis_core.sampling import SAMPLING_PARAMS, apply_sampling, check_sampling, sampling_schema
from osmosis_core.testing import ScriptedPolicyServer, run_rollout
from osmosis_core.wire import policy_from_json, policy_to_json

TRAINER = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 64}


class AsksItsOwn(AgentWorkflow):
    """A workflow that names its own sampling, as agents do."""

    async def run(self, ctx):
        reply = await chat_completion(ctx.prompt, temperature=0.2, top_p=0.5, max_tokens=512, seed=3)
        return [*ctx.prompt, reply]


# -- the checks ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("temperature", [0, 0.7, 2, 5.0], [-0.1, float("inf"), float("nan"), "1", True]),
        ("top_p", [1e-9, 0.5, 1], [0, -0.1, 1.01, [0.5]]),
        ("top_k", [-1, 0, 1, 50], [-2, 1.0, 2.5, "5"]),
        ("min_p", [0, 0.05, 1], [-0.01, 1.5]),
        ("max_tokens", [1, 4096], [0, -1, 1.0, 16.5, "16", False]),
        ("stop", ["\n", ["</s>", "###"], []], [3, ["a", 1], {"a": 1}]),
        ("seed", [0, -(2**63), 2**63 - 1], [2**63, 1.0, "7"]),
        ("presence_penalty", [-2, 0, 2], [-2.5, 2.01]),
        ("frequency_penalty", [-2, 0.5, 2], [3, -3]),
        ("repetition_penalty", [0.5, 1, 1.2], [0, -1]),
    ],
)
def test_each_setting_takes_its_range_and_names_what_is_wrong(name, good, bad):
    for value in good:
        assert check_sampling({name: value}) == {name: value}
    for value in bad:
        with pytest.raises(ValueError, match=rf"^sampling\.{name}: expected "):
            check_sampling({name: value})


def test_numbers_come_back_as_floats_whole_numbers_as_ints_and_null_means_not_set():
    checked = check_sampling({"temperature": 1, "max_tokens": 8, "seed": None, "stop": None})
    assert checked == {"temperature": 1.0, "max_tokens": 8}
    assert type(checked["temperature"]) is float
    assert type(checked["max_tokens"]) is int
    assert check_sampling({}) == {}


def test_an_unknown_key_is_refused_by_name_with_a_hint():
    with pytest.raises(ValueError, match=r"sampling\.temprature: not a sampling parameter; did you mean 'temperature'"):
        check_sampling({"temprature": 1.0})
    with pytest.raises(ValueError, match=r"sampling\.max_completion_tokens: not a sampling parameter; send max_tokens"):
        check_sampling({"max_completion_tokens": 64})
    with pytest.raises(ValueError, match=r"sampling\.logprobs: not a sampling parameter \(known: temperature, "):
        check_sampling({"logprobs": True})
    with pytest.raises(ValueError, match=r"^sampling: expected an object of sampling parameters, got an array$"):
        check_sampling([("temperature", 1.0)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^sampling\.temperature: .*; sampling\.top_p: .*; sampling\.n: ") as caught:
        check_sampling({"temperature": -1, "top_p": 2, "n": 4})
    assert str(caught.value).count("sampling.") == 3


def test_max_tokens_replaces_the_cap_under_whichever_name_the_agent_gave_it():
    """vLLM reads max_completion_tokens before max_tokens, and OpenAI's reasoning models take only
    max_completion_tokens: a cap under that name must be the one replaced."""
    cases = [
        ({}, {"max_tokens": 64}),
        ({"max_tokens": 512}, {"max_tokens": 64}),
        ({"max_completion_tokens": 512}, {"max_completion_tokens": 64}),
        ({"max_tokens": 512, "max_completion_tokens": 512}, {"max_tokens": 64, "max_completion_tokens": 64}),
    ]
    for sent, expected in cases:
        body = {"messages": [], "temperature": 0.2, **sent}
        assert apply_sampling(body, {"temperature": 1.0, "max_tokens": 64}) == {"temperature": 1.0, **expected}
        assert body == {"messages": [], "temperature": 1.0, **expected}


def test_the_schema_lists_every_setting_and_nothing_else():
    schema = sampling_schema()
    assert set(schema["properties"]) == set(SAMPLING_PARAMS)
    assert schema["additionalProperties"] is False
    assert schema["properties"]["top_p"] == {
        "type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1, "description": SAMPLING_PARAMS["top_p"].doc,
    }  # fmt: skip


# -- the endpoint ----------------------------------------------------------------------------------


def test_the_endpoint_checks_its_settings_and_carries_them_everywhere_it_goes():
    policy = PolicyEndpoint("http://127.0.0.1:9/v1", "m", "sk-key-123456", {"X-Org": "org-9"}, sampling=TRAINER)
    assert policy.sampling == TRAINER
    assert "temperature" in repr(policy)
    assert "sk-key" not in repr(policy)
    assert PolicyEndpoint("http://h/v1", "m").sampling is None
    assert PolicyEndpoint("http://h/v1", "m", sampling={"seed": None}).sampling is None  # nothing set
    with pytest.raises(ValueError, match=r"sampling\.top_p: expected a number > 0 and <= 1, got 0"):
        PolicyEndpoint("http://h/v1", "m", sampling={"top_p": 0})
    data = policy_to_json(policy)  # what a Harbor trial's request file holds: the settings, no secret
    assert data["sampling"] == TRAINER
    assert "sk-key" not in repr(data)
    assert "org-9" not in repr(data)
    assert policy_from_json(data, "sk-key-123456", {"X-Org": "org-9"}) == policy
    assert "sampling" not in policy_to_json(PolicyEndpoint("http://h/v1", "m"))  # as before, without any
    assert pickle.loads(pickle.dumps(policy)) == policy  # what a worker or a Ray actor gets


# -- over HTTP ---------------------------------------------------------------------------------------


def test_chat_completion_sends_the_trainers_settings_over_the_workflows():
    async def main():
        async with ScriptedPolicyServer() as server:
            trained = await run_rollout(
                AsksItsOwn, policy=PolicyEndpoint(server.url, "m", sampling=TRAINER), user_prompt="2 * 3"
            )
            plain = await run_rollout(AsksItsOwn, policy=PolicyEndpoint(server.url, "m"), user_prompt="2 * 3")
            return trained, plain, [r.body for r in server.requests]

    trained, plain, (first, second) = anyio.run(main)
    assert trained.error is None
    assert plain.error is None
    assert (first["temperature"], first["top_p"], first["max_tokens"], first["seed"]) == (1.0, 0.9, 64, 3)
    assert (second["temperature"], second["top_p"], second["max_tokens"], second["seed"]) == (0.2, 0.5, 512, 3)


class AsksInAWorker(AgentWorkflow):
    async def run(self, ctx):
        reply = await chat_completion(ctx.prompt, temperature=0.0, max_completion_tokens=2048)
        return [*ctx.prompt, reply]


def test_the_settings_reach_a_rollout_in_a_worker_process():
    pool = WorkerPool(AsksInAWorker, workers=2, max_concurrent=2)  # (forked before the server's thread starts)
    with ScriptedPolicyServer() as server:
        policy = PolicyEndpoint(server.url, "m", sampling={"temperature": 0.7, "max_tokens": 32, "stop": ["\n\n"]})
        results: list[ExecutionResult] = []

        async def keep(result: ExecutionResult) -> None:
            results.append(result)

        async def main() -> None:
            try:
                await pool.execute(ExecutionRequest("w-1", [{"role": "user", "content": "2 * 3"}], policy), keep, keep)
            finally:
                await pool.aclose()

        anyio.run(main)
        [body] = [r.body for r in server.requests]
    assert [r.ok for r in results] == [True], results
    assert body["temperature"] == 0.7
    assert body["max_completion_tokens"] == 32  # the worker's cap, replaced under its own name
    assert "max_tokens" not in body
    assert body["stop"] == ["\n\n"]


# -- a gateway plugin's side ---------------------------------------------------------------------------


class _Endpoint:
    """A third party's gateway whose ``open_rollout`` takes the rollout id only (as before the
    keywords were): it hands each rollout an endpoint of its own URL."""

    def __init__(self, upstream: PolicyEndpoint) -> None:
        self.upstream = upstream
        self.opened: list[tuple] = []

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def open_rollout(self, rollout_id: str) -> PolicyEndpoint:
        self.opened.append((rollout_id,))
        return PolicyEndpoint(f"http://127.0.0.1:9/gw/{rollout_id}", self.upstream.model)

    def pop_trace(self, rollout_id: str) -> None:
        return None


class _Keywords(_Endpoint):
    """One that takes both keywords (as osmosis-gateway's does)."""

    def open_rollout(self, rollout_id: str, *, policy_version=None, sampling=None) -> PolicyEndpoint:  # type: ignore[override]
        self.opened.append((rollout_id, policy_version, sampling))
        return PolicyEndpoint(f"http://127.0.0.1:9/gw/{rollout_id}", self.upstream.model)


def _gateways(kind: type) -> tuple[SharedGateways, list]:
    made: list = []

    class Plugin:
        @hookimpl
        def osmosis_policy_gateway(self, upstream, settings, source):
            made.append(kind(upstream))
            return made[-1]

    registry = PluginRegistry(load_entrypoints=False)
    registry.register(Plugin(), "a-gateway")
    return SharedGateways({}, source="$.traces", registry=registry), made


def test_a_gateway_that_takes_the_keywords_gets_them_and_is_shared_whatever_the_settings():
    async def main():
        gateways, made = _gateways(_Keywords)
        policy = PolicyEndpoint("http://127.0.0.1:9/v1", "m")
        one = await gateways.open(attrs_evolve(policy, sampling=TRAINER), "r-1", policy_version="step-3")
        two = await gateways.open(attrs_evolve(policy, sampling={"temperature": 0.6}), "r-2")
        three = await gateways.open(policy, "r-3")
        return made, (one, two, three)

    made, endpoints = anyio.run(main)
    [gateway] = made  # one upstream, one gateway: rollouts with other settings share it
    assert gateway.upstream.sampling is None  # made without any rollout's settings
    assert gateway.opened == [("r-1", "step-3", TRAINER), ("r-2", None, {"temperature": 0.6}), ("r-3", None, None)]
    assert all(endpoint.sampling is None for endpoint in endpoints)  # the gateway sets them, not the rollout


def test_a_gateway_that_takes_no_keywords_still_works_and_the_rollouts_clients_apply_the_settings(caplog):
    async def main():
        gateways, made = _gateways(_Endpoint)
        policy = PolicyEndpoint("http://127.0.0.1:9/v1", "m")
        plain = await gateways.open(policy, "r-0")
        with caplog.at_level(logging.WARNING, logger="osmosis_core.traces"):
            tuned = await gateways.open(attrs_evolve(policy, sampling=TRAINER), "r-1", policy_version="step-3")
            again = await gateways.open(policy, "r-2", policy_version="step-4")
        return made, plain, tuned, again

    made, plain, tuned, again = anyio.run(main)
    [gateway] = made
    assert gateway.opened == [("r-0",), ("r-1",), ("r-2",)]  # called as before, never with a keyword it lacks
    assert plain.sampling is None
    assert tuned.sampling == TRAINER  # left to the rollout's clients (chat_completion, the integrations)
    assert tuned.base_url.endswith("/gw/r-1")
    assert again.sampling is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1  # once per gateway class
    assert "_Endpoint takes no policy_version" in warnings[0]
    assert "'step-3'" in warnings[0]


def attrs_evolve(policy: PolicyEndpoint, **changes) -> PolicyEndpoint:
    import attrs

    return attrs.evolve(policy, **changes)
