"""A trainer's sampling settings through the gateway, over real HTTP: what goes upstream is the
trainer's, the trace keeps what the rollout sent, and each call says what was set on it."""

from __future__ import annotations

import json

import pytest
from gateway_helpers import MULTIPLY_TOOL, QUESTION, UPSTREAM_KEY, post, run, stack

from osmosis_core import PolicyEndpoint
from osmosis_core.testing import ScriptedPolicyServer, calculator
from osmosis_gateway import PolicyGateway, trace_from_json, trace_to_atif

TRAINER = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 64, "top_k": 20}


def ask(**extra):
    return {"model": "osmosis-stub", "messages": QUESTION, "tools": [MULTIPLY_TOOL], **extra}


@pytest.mark.parametrize("stream", [False, True])
def test_the_trainers_settings_go_upstream_and_the_trace_keeps_what_the_rollout_sent(stream):
    async def main():
        async with stack() as (server, gateway):
            tuned = gateway.open_rollout("r-tuned", policy_version="step-3", sampling=TRAINER)
            plain = gateway.open_rollout("r-plain")  # the same gateway, no settings: the rollout's stand
            assert tuned.sampling is None  # the gateway sets them; the rollout's clients must not
            for policy in (tuned, plain):
                asked = ask(temperature=0.2, max_completion_tokens=512, stream=stream)
                status, _ = await post(policy.chat_completions_url, asked, token=policy.api_key)
                assert status == 200
            sent = {rid: server.requests_for(rid)[0].body for rid in ("r-tuned", "r-plain")}
            return sent, gateway.pop_trace("r-tuned"), gateway.pop_trace("r-plain")

    sent, tuned, plain = run(main)
    upstream = sent["r-tuned"]
    assert (upstream["temperature"], upstream["top_p"], upstream["top_k"]) == (1.0, 0.9, 20)
    assert upstream["max_completion_tokens"] == 64  # the rollout's cap, replaced under the name it used
    assert "max_tokens" not in upstream
    assert upstream["return_token_ids"] is True  # the adapter's fields still go
    assert (sent["r-plain"]["temperature"], sent["r-plain"]["max_completion_tokens"]) == (0.2, 512)
    assert "top_p" not in sent["r-plain"]

    [call] = tuned.calls
    assert tuned.complete
    assert call.status == "ok"
    assert call.captured
    assert call.request["temperature"] == 0.2  # as the rollout sent it
    assert call.request["max_completion_tokens"] == 512
    assert "top_p" not in call.request
    assert "top_k" not in call.request
    assert call.sampling == {"temperature": 1.0, "top_p": 0.9, "top_k": 20, "max_completion_tokens": 64}
    assert call.policy_version == "step-3"
    line = json.loads(json.dumps(tuned.to_json()))  # what traces.jsonl holds, and it reads back
    assert line["calls"][0]["sampling"] == call.sampling
    assert trace_from_json(line).calls[0].sampling == call.sampling
    [step] = [s for s in trace_to_atif(tuned)["steps"] if s["source"] == "agent"]
    assert step["extra"]["sampling"] == call.sampling
    assert step["extra"]["policy_version"] == "step-3"
    [untouched] = plain.calls
    assert untouched.sampling is None
    assert untouched.policy_version is None
    assert "sampling" not in next(s for s in trace_to_atif(plain)["steps"] if s["source"] == "agent")["extra"]


def test_the_upstreams_own_settings_apply_to_every_rollout_under_a_rollouts_own():
    async def main():
        async with ScriptedPolicyServer(calculator, flavor="vllm") as server:
            upstream = PolicyEndpoint(server.url, "osmosis-stub", sampling={"temperature": 0.8, "seed": 7})
            async with PolicyGateway(upstream) as gateway:
                for rollout_id, sampling in (("a", {"temperature": 1.0}), ("b", None)):
                    policy = gateway.open_rollout(rollout_id, sampling=sampling)
                    status, _ = await post(policy.chat_completions_url, ask(temperature=0.0), token=policy.api_key)
                    assert status == 200
                traces = [gateway.pop_trace(r) for r in ("a", "b")]
            return [server.requests_for(r)[0].body for r in ("a", "b")], traces

    (a, b), traces = run(main)
    assert (a["temperature"], a["seed"]) == (1.0, 7)
    assert (b["temperature"], b["seed"]) == (0.8, 7)
    assert [t.calls[0].sampling for t in traces] == [{"temperature": 1.0, "seed": 7}, {"temperature": 0.8, "seed": 7}]


def test_settings_given_over_http_apply_and_bad_ones_are_refused_by_name():
    async def main():
        async with stack() as (server, gateway):
            base = gateway.url
            bad = {}
            for sampling in ({"temprature": 1.0}, {"top_p": 0}, [1]):
                bad[json.dumps(sampling)] = await post(
                    f"{base}/rollouts", {"rollout_id": "h-1", "sampling": sampling}, token=gateway.bearer
                )
            status, raw = await post(
                f"{base}/rollouts",
                {"rollout_id": "h-1", "policy_version": "v9", "sampling": {"temperature": 1.5, "stop": ["\n\n"]}},
                token=gateway.bearer,
            )  # the refusals opened nothing: the id is still free
            assert status == 201, raw
            opened = json.loads(raw)
            call = await post(f"{opened['base_url']}/chat/completions", ask(), token=opened["api_key"])
            assert call[0] == 200
            with pytest.raises(ValueError, match=r"sampling\.max_tokens: expected a whole number >= 1, got 0"):
                gateway.open_rollout("h-2", sampling={"max_tokens": 0})
            assert gateway.trace("h-2") is None
            return bad, server.requests_for("h-1")[0].body, gateway.pop_trace("h-1")

    bad, sent, trace = run(main)
    for (status, raw), named in zip(
        bad.values(),
        [
            "sampling.temprature: not a sampling parameter; did you mean 'temperature'?",
            "sampling.top_p: ",
            "sampling: expected an object",
        ],
        strict=True,
    ):
        assert status == 400
        assert named in json.loads(raw)["error"]["message"]
    assert (sent["temperature"], sent["stop"]) == (1.5, ["\n\n"])
    assert trace.calls[0].sampling == {"temperature": 1.5, "stop": ["\n\n"]}
    assert trace.calls[0].policy_version == "v9"
    assert UPSTREAM_KEY not in json.dumps(trace.to_json())


def test_the_agents_distribution_settings_the_trainer_left_unset_are_dropped_and_recorded():
    """TRL #4159/#6789: once a trainer sets sampling, the distribution is its alone; the agent's stop,
    seed and cap still go. Without a trainer's settings the agent's all go, as sent."""
    agents = {"top_p": 0.5, "min_p": 0.3, "presence_penalty": 1.5, "seed": 5, "stop": ["x"], "max_tokens": 7}

    async def main():
        async with stack() as (server, gateway):
            for rollout_id, sampling in (("t", {"temperature": 1.0}), ("plain", None)):
                policy = gateway.open_rollout(rollout_id, sampling=sampling)
                status, _ = await post(policy.chat_completions_url, ask(**agents), token=policy.api_key)
                assert status == 200
            sent = {rid: server.requests_for(rid)[0].body for rid in ("t", "plain")}
            return sent, gateway.pop_trace("t"), gateway.pop_trace("plain")

    sent, tuned, plain = run(main)
    assert {k: sent["t"].get(k) for k in (*agents, "temperature")} == {
        "top_p": None, "min_p": None, "presence_penalty": None, "seed": 5, "stop": ["x"], "max_tokens": 7,
        "temperature": 1.0,
    }  # fmt: skip
    [call] = tuned.calls
    assert call.sampling_dropped == ["top_p", "min_p", "presence_penalty"]
    assert call.request["top_p"] == 0.5  # the trace keeps what the rollout sent
    line = json.loads(json.dumps(tuned.to_json()))
    assert trace_from_json(line).calls[0].sampling_dropped == call.sampling_dropped
    assert all(sent["plain"][k] == v for k, v in agents.items())
    assert plain.calls[0].sampling_dropped is None
