"""The adapters' checks (what the gateway captures from each upstream) and their trainer view (the trace
record and the view themselves are tested in osmosis-trainer)."""

from __future__ import annotations

import json

import pytest
from gateway_helpers import MULTIPLY_TOOL, QUESTION, post, run, stack

from osmosis_core.testing.stub_tokens import THINK_BLOCK, render_prompt
from osmosis_gateway import adapters, trainer_view
from osmosis_gateway.adapters import prepare_request


def test_an_answer_with_a_nan_keeps_it_when_the_additions_are_stripped():
    """An answer the fast reader does not take (a NaN) is stripped through json, which writes the
    NaN back as it came (msgspec would have written null)."""
    capture = prepare_request({"messages": []}, "vllm")
    raw = json.dumps(completion(token_ids=[5], entries=[("token_id:5", -0.1)]) | {"score": float("nan")}).encode()
    stripped = capture.feed_bytes(raw, chunk=False)
    assert stripped is not None
    assert b"NaN" in stripped


def capture_of(doc, *, stream=False, request=None):
    body = {"messages": [], **(request or {})}
    capture = prepare_request(body, "vllm")
    if stream:
        for chunk in doc:
            capture.feed(chunk, chunk=True)
    else:
        capture.feed(doc, chunk=False)
    return capture, capture.tokens()


def completion(token_ids=None, entries=None, prompt=(1, 2)):
    choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    if entries is not None:
        choice["logprobs"] = {"content": entries}
    doc = {"choices": [choice]}
    if prompt is not None:
        doc["prompt_token_ids"] = list(prompt)
    return doc


def entry(token, logprob=-0.5):
    return {"token": token, "logprob": logprob, "top_logprobs": []}


def test_ids_from_token_id_strings_when_the_server_sends_no_token_ids():
    _capture, tokens = capture_of(completion(None, [entry("token_id:5"), entry("token_id:6", -1.0)]))
    assert [list(x) for x in tokens] == [[1, 2], [5, 6], [-0.5, -1.0]]


def test_sources_that_disagree_are_a_capture_failure():
    capture, tokens = capture_of(completion([5, 7], [entry("token_id:5"), entry("token_id:6")]))
    assert tokens is None
    assert "different ids" in capture.problem


def test_token_and_logprob_lists_of_different_lengths_are_a_capture_failure():
    capture, tokens = capture_of(completion([5, 6, 7], [entry("token_id:5"), entry("token_id:6")]))
    assert tokens is None
    assert "different ids" in capture.problem
    capture, tokens = capture_of(completion([5, 6, 7], [entry("a"), entry("b")]), request={"logprobs": True})
    assert tokens is None
    assert capture.problem == "3 generated token ids but 2 logprobs"


def test_missing_pieces_are_capture_failures():
    assert "no prompt_token_ids" in capture_of(completion([5], [entry("token_id:5")], prompt=None))[0].problem
    assert "no logprobs" in capture_of(completion([5], None))[0].problem
    assert (
        "two different prompt_token_ids"
        in capture_of([completion([5], [entry("token_id:5")]), completion([], [], prompt=(9,))], stream=True)[0].problem
    )
    assert "n=2" in capture_of(completion([5], [entry("token_id:5")]), request={"n": 2})[0].problem


def test_sglang_is_asked_without_streaming_and_puts_prompt_ids_on_the_choice():
    body = {"messages": [], "stream": True, "stream_options": {"include_usage": True}}
    capture = prepare_request(body, "sglang")
    assert capture.problem is None
    assert body["stream"] is False
    assert "stream_options" not in body
    capture = prepare_request({"messages": []}, "sglang")
    doc = completion([5], [entry("x")], prompt=None)
    doc["choices"][0]["prompt_token_ids"] = [1, 2]
    capture.feed(doc, chunk=False)
    assert [list(x) for x in capture.tokens()] == [[1, 2], [5], [-0.5]]
    assert "prompt_token_ids" not in doc["choices"][0]


@pytest.mark.parametrize("stream", [False, True])
def test_a_drifting_template_gives_counted_breaks_and_separate_sequences_with_the_ids_sent(stream):
    async def main():
        async with stack(flavor="drifting") as (_server, gateway):
            policy = gateway.open_rollout("r")
            messages = list(QUESTION)
            prompts = []
            for turn in range(3):
                body = {"model": "m", "messages": messages, "tools": [MULTIPLY_TOOL], "stream": stream}
                status, _raw = await post(policy.chat_completions_url, body, token=policy.api_key)
                assert status == 200
                prompts.append(render_prompt(messages, drifting=True))
                trace = gateway.trace("r")
                reply = trace.calls[-1].response
                assert reply["content"].startswith(THINK_BLOCK)
                messages = [*messages, {k: v for k, v in reply.items() if v is not None}]
                if reply.get("tool_calls"):
                    messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "84"})
                else:
                    messages.append({"role": "user", "content": f"And {turn} times 2?"})
            return gateway.pop_trace("r"), prompts

    trace, prompts = run(main)
    assert trace.complete
    assert [list(c.prompt_token_ids) for c in trace.calls] == prompts  # exactly what the server saw
    view = trainer_view(trace)
    assert view.prefix_breaks == 2
    assert len(view.sequences) == 3
    for sequence, c in zip(view.sequences, trace.calls, strict=True):
        assert sequence.token_ids == [*c.prompt_token_ids, *c.completion_token_ids]
        assert sum(sequence.loss_mask) == len(c.completion_token_ids)
    assert view.delivered_fraction == 1.0


def test_ids_that_are_not_integers_are_a_capture_failure_and_good_ones_are_stored_compactly():
    capture, tokens = capture_of(completion([5.5], [entry("x")]), request={"logprobs": True})
    assert tokens is None
    assert "not an integer" in capture.problem
    _, tokens = capture_of(completion([5], [entry("x")]), request={"logprobs": True})
    assert [t.typecode for t in tokens] == ["i", "i", "d"]  # 4 bytes an id, not a 36-byte int in a list


def vllm_answer(**changes):
    doc = completion([5, 6], [entry("token_id:5"), entry("token_id:6", -1.0)])
    doc["choices"][0]["logprobs"]["content"][0]["bytes"] = [104, 105]
    doc["choices"][0]["message"]["tool_calls"] = [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    doc |= {"id": "x", "usage": {"prompt_tokens": 2}, "prompt_logprobs": None, "kv_transfer_params": {"a": 1}}
    for path, value in changes.items():
        where = doc
        *keys, last = path.split("__")
        for key in keys:
            where = where[int(key)] if isinstance(where, list) else where[key]
        where[last] = value
    return doc


@pytest.mark.parametrize(
    "changes",
    [
        {},  # the shape a vLLM sends: read field by field
        {"choices__0__prompt_token_ids": [1, 2]},  # (SGLang's place for them)
        {"choices__0__prompt_token_ids": [9]},
        {"choices__0__token_ids": [5.5, 6]},  # shapes the field reader refuses: read whole by json
        {"choices__0__logprobs": [1]},
        {"choices__0__logprobs__content__1__token": 6},
        {"choices__0__logprobs__content__1__logprob": None},
        {"choices__0__token_ids": [5, 7]},
        {"choices__0__token_ids": None},
        {"prompt_token_ids": "12"},
        {"choices": None},
        {"choices": [{"index": 0}, 3]},
        {"choices__0__finish_reason": 3},
    ],
)
@pytest.mark.parametrize("chunk", [False, True])
@pytest.mark.parametrize("as_sent", [False, True])
def test_an_answer_read_from_its_bytes_gives_what_the_document_reader_gives(changes, chunk, as_sent):
    doc = vllm_answer(**changes)
    if chunk:
        for choice in doc.get("choices") or ():
            if isinstance(choice, dict) and "message" in choice:
                choice["delta"] = choice.pop("message")
    if as_sent:  # compact, in vLLM's order
        doc = in_order(doc, VLLM_ANSWER_ORDER)
        if isinstance(doc.get("choices"), list):
            doc["choices"] = [in_order(c, VLLM_CHOICE_ORDER) if isinstance(c, dict) else c for c in doc["choices"]]
        raw = json.dumps(doc, separators=(",", ":")).encode()
    else:
        raw = json.dumps(doc, indent=1).encode()  # (whitespace the field reader keeps)
    by_doc = prepare_request({"messages": []}, "vllm")
    changed = by_doc.feed(doc, chunk=chunk)
    by_bytes = prepare_request({"messages": []}, "vllm")
    stripped = by_bytes.feed_bytes(raw, chunk=chunk)
    assert (stripped is not None) == changed
    assert json.loads(stripped or raw) == doc  # the same fields taken out
    results = [(c.tokens(), c.message(), c.finish_reason, c.usage, c.problem) for c in (by_doc, by_bytes)]
    assert results[1] == results[0]


VLLM_ANSWER_ORDER = ("id", "object", "created", "model", "choices", "usage", "prompt_logprobs", "prompt_token_ids")
VLLM_CHOICE_ORDER = ("index", "message", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids")


def in_order(doc, order):
    """``doc`` with the keys named in ``order`` first, in that order (the others after them)."""
    return {**{k: doc[k] for k in order if k in doc}, **doc}


@pytest.mark.parametrize(
    "edit",
    [
        None,  # as vLLM sends it
        lambda doc: doc.update(extra={"a": [1.5, None]}),  # a field of another server
        lambda doc: doc.update(id=doc.pop("id")),  # another order
        lambda doc: doc["choices"][0].update(index=doc["choices"][0].pop("index")),
        lambda doc: doc["choices"][0].update(zzz=1),
    ],
)
def test_an_answer_in_another_shape_or_order_is_stripped_as_it_came(edit, monkeypatch):
    doc = in_order(vllm_answer(), VLLM_ANSWER_ORDER)
    doc["choices"][0] = in_order(doc["choices"][0], VLLM_CHOICE_ORDER)
    if edit is not None:
        edit(doc)
    else:  # as vLLM writes it: read in one pass, never by the reader of any fields in any order

        class Refuses:
            def decode(self, data):
                raise AssertionError("read twice")

        monkeypatch.setattr(adapters, "_TOP", Refuses())
    raw = json.dumps(doc, separators=(",", ":")).encode()
    capture = prepare_request({"messages": []}, "vllm")
    stripped = capture.feed_bytes(raw, chunk=False)
    expected = dict(doc)
    for key in ("prompt_token_ids", "prompt_logprobs"):
        expected.pop(key)
    choice = expected["choices"][0] = dict(doc["choices"][0])
    choice.pop("token_ids")
    choice["logprobs"] = None
    assert stripped == json.dumps(expected, separators=(",", ":")).encode()  # the same fields, in the same order
    assert [list(x) for x in capture.tokens()] == [[1, 2], [5, 6], [-0.5, -1.0]]


def test_an_answer_that_is_no_json_is_refused_by_the_bytes_reader():
    with pytest.raises(json.JSONDecodeError):
        prepare_request({"messages": []}, "vllm").feed_bytes(b'{"choices": [', chunk=False)
