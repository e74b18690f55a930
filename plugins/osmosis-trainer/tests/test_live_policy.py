"""The live policy server over real HTTP: vLLM's answer shape, logprobs a trainer recomputes, the
tiny chat template's append-only prompts, sampling settings, refusals, and the weights it serves.

Needs torch and transformers (the ``train`` nox session; marker ``torch``)."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from osmosis_trainer.live_policy import LivePolicyServer, weights_fingerprint
from osmosis_trainer.tiny_model import END_TOKEN, char_tokenizer, tiny_model

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "d", "parameters": {}}}]
TOKENS = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(tokenizer, seed=1)


@pytest.fixture(scope="module")
def server(model, tokenizer):
    with LivePolicyServer(model, tokenizer, tool_parser="tiny", model_name="tiny") as live:
        yield live


def post(server, body, *, raw=False):
    request = urllib.request.Request(
        server.url + "/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read() if raw else json.load(response)


def refused(server, body):
    with pytest.raises(urllib.error.HTTPError) as caught:
        post(server, body)
    assert caught.value.code == 400
    return json.load(caught.value)["error"]["message"]


def recompute(model, prompt, generated, temperature=1.0):
    """The trainer's logprobs: one full forward pass, ``log_softmax(logits / temperature)``."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(generated)[:, None])[:, 0]


def test_an_answer_in_vllms_shape_whose_logprobs_the_trainer_recomputes(server, model, tokenizer):
    messages = [{"role": "user", "content": "What is in box 1?"}]
    answer = post(server, {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 20, **TOKENS})
    [choice] = answer["choices"]
    prompt = answer["prompt_token_ids"]
    assert prompt == tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    generated = choice["token_ids"]
    entries = choice["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{i}" for i in generated]
    assert answer["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(generated),
        "total_tokens": len(prompt) + len(generated),
    }
    assert answer["model"] == "m"
    assert answer["system_fingerprint"] == f"weights-{weights_fingerprint(model)}"
    if choice["finish_reason"] == "length":
        assert len(generated) == 20
    else:
        assert generated[-1] == tokenizer.eos_token_id  # the end token is among the ids, as vLLM gives it
    served = torch.tensor([e["logprob"] for e in entries])
    assert (served - recompute(model, prompt, generated)).abs().max().item() < 1e-5
    assert server.calls[-1].completion_tokens == len(generated)


def test_every_answer_sent_back_as_history_extends_the_token_prefix(server, tokenizer):
    """The tiny model's tokenizer and template: whatever a random model writes, tool calls
    included, the next prompt starts with this prompt and these generated ids (0 breaks in 24 calls)."""
    breaks = calls = 0
    for k in range(12):
        messages = [{"role": "user", "content": f"What is in box {k}?"}]
        first = post(server, {"messages": messages, "tools": TOOLS, "max_tokens": 16, "temperature": 1.3, **TOKENS})
        reply = first["choices"][0]["message"]
        messages.append(reply)
        for call in reply.get("tool_calls") or [{"id": "none"}]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "stuvwxyz"})
        second = post(server, {"messages": messages, "tools": TOOLS, "max_tokens": 16, **TOKENS})
        head = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
        breaks += second["prompt_token_ids"][: len(head)] != head
        calls += 2
    assert (breaks, calls) == (0, 24)


def test_a_tool_call_is_parsed_from_the_text_and_the_end_token_is_not_content(server):
    calls = 0
    for k in range(40):  # a random model writes <tool_call> in about one answer of six
        answer = post(server, {"messages": [{"role": "user", "content": f"go {k}"}], "tools": TOOLS, "max_tokens": 24})
        choice = answer["choices"][0]
        message = choice["message"]
        assert END_TOKEN not in (message["content"] or "")
        if message.get("tool_calls"):
            [call] = message["tool_calls"]
            assert call["type"] == "function"
            assert call["function"]["name"] == "lookup"
            assert call["id"]
            assert choice["finish_reason"] in ("tool_calls", "length")
            calls += 1
        else:
            assert choice["finish_reason"] in ("stop", "length")
    assert calls, "no tool call in 40 answers"
    no_tools = post(server, {"messages": [{"role": "user", "content": "x"}], "tool_choice": "none", "tools": TOOLS})
    assert "tool_calls" not in no_tools["choices"][0]["message"]


def test_the_requests_sampling_settings_are_applied(server, model):
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, **TOKENS}
    greedy = [post(server, {**body, "temperature": 0})["choices"][0]["token_ids"] for _ in range(2)]
    assert greedy[0] == greedy[1]
    seeded = [post(server, {**body, "seed": 5})["choices"][0]["token_ids"] for _ in range(2)]
    assert seeded[0] == seeded[1]
    capped = post(server, {**body, "max_completion_tokens": 3})["choices"][0]
    assert len(capped["token_ids"]) <= 3
    # top_k: every token drawn is among the k likeliest, and its logprob is the truncated distribution's
    answer = post(server, {**body, "top_k": 2, "temperature": 0.7})
    choice = answer["choices"][0]
    prompt, generated = answer["prompt_token_ids"], choice["token_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1].float() / 0.7
    for position, token in enumerate(generated):
        top = torch.topk(logits[position], 2)
        assert token in top.indices.tolist()
        expected = torch.log_softmax(top.values, -1)[top.indices.tolist().index(token)]
        assert choice["logprobs"]["content"][position]["logprob"] == pytest.approx(expected.item(), abs=1e-5)


def test_what_the_server_does_not_serve_is_a_400_that_names_it(server):
    body = {"messages": [{"role": "user", "content": "x"}]}
    assert "n=2" in refused(server, {**body, "n": 2})
    assert "stop" in refused(server, {**body, "stop": ["x"]})
    assert "presence_penalty" in refused(server, {**body, "presence_penalty": 0.5})
    assert "tool_choice='required'" in refused(server, {**body, "tool_choice": "required"})
    assert "top_p must be in (0, 1]" in refused(server, {**body, "top_p": 0})
    assert "messages must be a non-empty list" in refused(server, {"messages": []})
    too_long = [{"role": "user", "content": "x" * 2000}]
    assert "maximum context length is 1024" in refused(server, {"messages": too_long})
    assert post(server, {**body, "presence_penalty": 0.0, "max_tokens": 1})["choices"]  # neutral values pass


def test_a_streamed_answer_carries_the_ids_in_its_chunks(server):
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 6, "stream": True, **TOKENS}
    raw = post(server, {**body, "stream_options": {"include_usage": True}}, raw=True).decode()
    events = [line[6:] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["prompt_token_ids"]
    assert chunks[0]["choices"][0]["token_ids"]
    ids = chunks[0]["choices"][0]["token_ids"]
    assert len(chunks[0]["choices"][0]["logprobs"]["content"]) == len(ids)
    assert chunks[1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[2]["usage"]["completion_tokens"] == len(ids)


def test_it_serves_the_model_object_itself_so_an_update_in_place_reaches_the_next_answer(tokenizer):
    model = tiny_model(tokenizer, seed=2)
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    with LivePolicyServer(model, tokenizer) as live:
        before = post(live, body)["system_fingerprint"]
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model(torch.tensor([[7, 8, 9]]), labels=torch.tensor([[7, 8, 9]])).loss.backward()
        optimizer.step()  # TRL's update: in place, no copy, no sync
        after = post(live, body)["system_fingerprint"]
        assert before != after == f"weights-{weights_fingerprint(model)}"
        assert [c.weights for c in live.calls] == [before[8:], after[8:]]
        assert json.load(urllib.request.urlopen(live.url + "/models"))["data"][0]["id"] == "live-policy"


def test_beyond_loopback_it_needs_a_token_and_refuses_requests_without_it(model, tokenizer):
    with pytest.raises(ValueError, match="pass api_key="):
        LivePolicyServer(model, tokenizer, host="0.0.0.0")
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    with LivePolicyServer(model, tokenizer, api_key="s3cret-key") as live:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            request = urllib.request.Request(
                live.url + "/chat/completions", data=json.dumps(body).encode(), headers=headers
            )
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(request, timeout=60)
            assert caught.value.code == 401
            assert "s3cret" not in caught.value.read().decode()
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(live.url + "/models", timeout=60)
        assert caught.value.code == 401
        request = urllib.request.Request(
            live.url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": "Bearer s3cret-key"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.load(response)["choices"]
        assert [call.completion_tokens for call in live.calls] == [1]  # the refused ones never reached the model


def test_a_body_it_will_not_read_closes_the_connection(server):
    import socket

    host, port = server.url.split("//")[1].split("/")[0].split(":")
    for length, status in ((str(10**9), b"413"), ("abc", b"400")):
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode())
            answer = b""
            while chunk := conn.recv(65536):  # the server closes: the loop ends
                answer += chunk
            assert answer.split(b" ")[1] == status


def test_min_p_then_top_p_keep_the_tokens_vllm_keeps_and_the_logprob_is_over_them(server, model):
    """vLLM's order: temperature, min_p (relative to the likeliest token), then top_p over what is left
    (min_p 0.4 leaves few tokens, so top_p over them differs from top_p over all: the order is tested)."""
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, **TOKENS}
    answer = post(server, {**body, "temperature": 0.8, "min_p": 0.4, "top_p": 0.5, "seed": 11})
    choice = answer["choices"][0]
    prompt, generated = answer["prompt_token_ids"], choice["token_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1 : -1].float() / 0.8
    for position, token in enumerate(generated):
        probabilities = torch.softmax(logits[position], -1).tolist()
        kept = [i for i, p in enumerate(probabilities) if p >= 0.4 * max(probabilities)]
        total = sum(probabilities[i] for i in kept)
        nucleus, mass = [], 0.0
        for i in sorted(kept, key=lambda i: -probabilities[i]):  # the smallest set whose mass reaches top_p
            if mass >= 0.5 * total:
                break
            nucleus.append(i)
            mass += probabilities[i]
        assert token in nucleus
        expected = math.log(probabilities[token] / mass)
        assert choice["logprobs"]["content"][position]["logprob"] == pytest.approx(expected, abs=1e-4)


def generate(server, body):
    """``POST /inference/v1/generate`` (the token route of ``trl vllm-serve``): (status, document)."""
    url = server.url.removesuffix("/v1") + "/inference/v1/generate"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_the_token_route_generates_from_the_ids_it_is_given_as_the_chat_route_does(server, model, tokenizer):
    messages = [{"role": "user", "content": "What is in box 2?"}]
    prompt = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    sampling = {"max_tokens": 24, "temperature": 0.9, "seed": 7}
    status, answer = generate(server, {"request_id": "r-0", "model": "m", "token_ids": prompt,
                                       "sampling_params": {**sampling, "logprobs": 0, "output_kind": 2}})  # fmt: skip
    assert status == 200, answer
    assert answer["request_id"] == "r-0"
    [choice] = answer["choices"]
    generated = choice["token_ids"]
    entries = choice["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{i}" for i in generated]
    served = torch.tensor([e["logprob"] for e in entries])
    assert (served - recompute(model, prompt, generated, temperature=0.9)).abs().max().item() < 1e-5
    assert choice["finish_reason"] in ("stop", "length")
    assert server.calls[-1].prompt_tokens == len(prompt)
    # the chat route, the same seed: the same ids (one generation, two ways in)
    chat = post(server, {"messages": messages, "tools": TOOLS, **sampling, **TOKENS})
    assert chat["prompt_token_ids"] == prompt
    assert chat["choices"][0]["token_ids"] == generated
    # no logprobs asked, none given (vLLM's SamplingParams.logprobs defaults to None)
    status, plain = generate(server, {"token_ids": prompt, "sampling_params": {"max_tokens": 2}})
    assert status == 200
    assert plain["choices"][0]["logprobs"] is None
    assert plain["request_id"].startswith("generate-")


def test_what_the_token_route_does_not_serve_is_a_400_that_names_it(server, tokenizer):
    ids = tokenizer.encode("hi")
    cases = [
        ({"token_ids": []}, "token_ids must be a non-empty list"),
        ({"token_ids": [len(tokenizer)]}, "token_ids must be a non-empty list of token ids (0 to"),
        ({"token_ids": ids, "sampling_params": []}, "sampling_params must be an object"),
        ({"token_ids": ids, "sampling_params": {"logprobs": 5}}, "sampling_params.logprobs"),
        ({"token_ids": ids, "sampling_params": {"n": 2}}, "n=2"),
        ({"token_ids": ids, "stream": True}, "stream"),
        ({"token_ids": [6] * 1024}, "maximum context length is 1024"),
    ]
    for body, why in cases:
        status, doc = generate(server, body)
        assert status == 400, (body, doc)
        assert why in doc["error"]["message"], (body, doc)
