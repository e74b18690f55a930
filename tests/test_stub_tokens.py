"""The stand-in answers like vLLM when asked (flavor vllm / drifting), and like plain OpenAI otherwise."""

from __future__ import annotations

import json
import urllib.request

import pytest

from osmosis_core.testing import ScriptedPolicyServer, calculator
from osmosis_core.testing.stub_tokens import SPECIAL_TOKENS, THINK_BLOCK, encode, logprob_of, render_prompt

QUESTION = [{"role": "user", "content": "What is 12 times 7?"}]
TOOLS = [{"type": "function", "function": {"name": "multiply", "parameters": {}}}]
ASK = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0}


def post(server: ScriptedPolicyServer, body: dict) -> bytes:
    request = urllib.request.Request(
        server.url + "/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


def streamed(raw: bytes) -> list[dict]:
    return [json.loads(x[6:]) for x in raw.decode().splitlines() if x.startswith("data: {")]


def test_encode_is_deterministic_and_lossless():
    text = "<|im_start|>user\nWhat is 12 times 7?<|im_end|>"
    pairs = encode(text)
    assert "".join(p for p, _ in pairs) == text
    assert pairs == encode(text)
    assert pairs[0][1] == SPECIAL_TOKENS["<|im_start|>"]
    assert pairs[-1][1] == SPECIAL_TOKENS["<|im_end|>"]


@pytest.mark.parametrize("as_ids", [False, True])
def test_vllm_flavor_sends_the_same_tokens_streamed_or_not(as_ids):
    body = {"messages": QUESTION, "tools": TOOLS, **ASK, "return_tokens_as_token_ids": as_ids}
    with ScriptedPolicyServer(calculator, flavor="vllm") as server:
        whole = json.loads(post(server, body))
        chunks = streamed(post(server, {**body, "stream": True, "stream_options": {"include_usage": True}}))
    assert whole["prompt_token_ids"] == render_prompt(QUESTION)
    choice = whole["choices"][0]
    entries = choice["logprobs"]["content"]
    assert len(choice["token_ids"]) == len(entries) > 0
    assert choice["token_ids"][-1] == SPECIAL_TOKENS["<|im_end|>"]
    assert [e["logprob"] for e in entries] == [logprob_of(n, t) for n, t in enumerate(choice["token_ids"])]
    if as_ids:
        assert [e["token"] for e in entries] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert whole["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    ids = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])]
    logprobs = [e for c in chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content", [])]
    assert ids == choice["token_ids"]
    assert [e["logprob"] for e in logprobs] == [e["logprob"] for e in entries]
    assert chunks[-1]["usage"] == whole["usage"]


def test_the_template_is_append_only_and_the_drifting_one_is_not():
    with ScriptedPolicyServer(calculator, flavor="vllm") as server:
        first = json.loads(post(server, {"messages": QUESTION, "tools": TOOLS, **ASK}))
    assistant = first["choices"][0]["message"]
    history = [*QUESTION, assistant, {"role": "tool", "tool_call_id": "x", "content": "84"}]
    full = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert render_prompt(history)[: len(full)] == full
    reserialised = json.loads(json.dumps(assistant))  # arguments re-dumped compactly, as some SDKs do
    call = reserialised["tool_calls"][0]["function"]
    call["arguments"] = json.dumps(json.loads(call["arguments"]), separators=(",", ":"))
    assert render_prompt([*QUESTION, reserialised])[: len(full)] == full

    with ScriptedPolicyServer(calculator, flavor="drifting") as server:
        first = json.loads(post(server, {"messages": QUESTION, **ASK}))
    answer = first["choices"][0]["message"]
    assert answer["content"].startswith(THINK_BLOCK)
    full = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    again = render_prompt([*QUESTION, answer, {"role": "user", "content": "thanks"}], drifting=True)
    assert again[: len(full)] != full
    assert again[: len(first["prompt_token_ids"])] == first["prompt_token_ids"]


@pytest.mark.parametrize("flavor", ["openai", "vllm"])
def test_nothing_extra_unless_asked_and_never_from_plain_openai(flavor):
    with ScriptedPolicyServer(calculator, flavor=flavor) as server:
        plain = json.loads(post(server, {"messages": QUESTION}))
        asked = json.loads(post(server, {"messages": QUESTION, **ASK}))
    for doc in (plain, asked) if flavor == "openai" else (plain,):
        assert "prompt_token_ids" not in doc
        assert "token_ids" not in doc["choices"][0]
        assert doc["choices"][0]["logprobs"] is None


def test_an_unknown_flavor_is_refused():
    with pytest.raises(ValueError, match="flavor must be one of"):
        ScriptedPolicyServer(flavor="tgi")  # type: ignore[arg-type]
