"""The fast path of the rollouts' OpenAI client (osmosis_openai.client) against this openai release.

It posts plain-JSON chat-completions requests without openai's typed request transform, through
openai internals (``AsyncCompletions._post``, ``make_request_options``, ``AsyncChat.completions``).
Measured on the 2-core machine (process CPU per call, 1,000 calls at 50 in flight, a tool call and
a tool result in the history): openai's normal path 1.8 to 2.4 ms, the fast path 0.9 to 1.4 ms.
These tests fail loudly, naming what changed, when an openai release breaks it.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import anyio
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from osmosis_core import PolicyEndpoint, RolloutContext
from osmosis_core.http import http_scope, start_http_server
from osmosis_core.testing import ScriptedPolicyServer
from osmosis_openai import fast_client_class, policy_error, rollout_openai_client

MESSAGES = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "val1 = 6\nval2 = 7"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}}
    ]},
    {"role": "tool", "tool_call_id": "c1", "content": "42"},
]  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {}}}}]


def test_the_openai_internals_it_uses_are_there():
    from openai._base_client import AsyncAPIClient, make_request_options
    from openai.resources.chat import AsyncChat
    from openai.resources.chat.completions.completions import AsyncCompletions

    assert openai.__version__.startswith("3."), f"re-check the fast path against openai {openai.__version__}"
    options = set(inspect.signature(make_request_options).parameters)
    assert {"extra_headers", "extra_query", "extra_body", "timeout", "security"} <= options, options
    post = set(inspect.signature(AsyncAPIClient.post).parameters)
    assert {"path", "body", "options", "cast_to", "stream", "stream_cls"} <= post, post
    client = fast_client_class()(api_key="k", base_url="http://127.0.0.1:9/v1")
    assert isinstance(client.chat, AsyncChat)
    assert isinstance(client.chat.completions, AsyncCompletions)
    assert client.chat.completions._post == client.post  # what the fast create() posts through


def test_the_fast_path_sends_what_openais_normal_path_sends():
    """Same body, headers and parsed answer, streamed or not; a typed request falls back."""

    async def main() -> None:
        async with ScriptedPolicyServer() as server, http_scope():
            bodies = []
            for client_class in (openai.AsyncOpenAI, fast_client_class()):
                client = client_class(api_key="k", base_url=server.url, max_retries=0)
                for stream in (False, True):
                    answer = await client.chat.completions.create(
                        model="m", messages=MESSAGES, tools=TOOLS, temperature=0.5, stream=stream,
                        extra_headers={"X-Extra": "1"},
                    )  # fmt: skip
                    if stream:
                        text = "".join([c.choices[0].delta.content or "" async for c in answer if c.choices])
                    else:
                        text = answer.choices[0].message.content
                    assert text == "The product is 42.\n#### 42"
                await client.close()
            bodies = [(json.dumps(r.body, sort_keys=True), r.authorized) for r in server.requests]
            assert bodies[:2] == bodies[2:]  # the fast path's requests equal openai's own
            with RolloutContext("fast", PolicyEndpoint(server.url, "m")):
                view = rollout_openai_client()
                assert type(view.chat.completions).__name__ == "FastCompletions"
                typed = await view.chat.completions.create(
                    model="m", messages=MESSAGES, response_format={"type": "text"}
                )  # not plain JSON -> openai's normal path
                assert typed.choices[0].message.content.endswith("#### 42")

    anyio.run(main)


@pytest.mark.parametrize("value", [object(), (1, 2), {1: "x"}])
def test_anything_but_plain_json_takes_openais_path(value):
    from osmosis_openai.client import _plain_json

    assert not _plain_json({"messages": [{"role": "user", "content": value}]})
    assert _plain_json({"messages": MESSAGES, "tools": TOOLS, "temperature": 0.5})


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_in_the_other_mode_is_a_policy_error(stream):
    """A server that answers a streaming request with a JSON completion (which openai would read as an
    empty stream), or a plain request with an event stream: policy_error naming endpoint and status."""
    from aiohttp import web

    from osmosis_core import PolicyError

    choice = {"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}
    completion = {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}

    async def answer(request: web.BaseRequest) -> web.StreamResponse:
        if stream:  # the request asks for a stream: answer with JSON
            return web.json_response(completion)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + json.dumps(completion).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    async def main() -> None:
        runner, port = await start_http_server(answer, "127.0.0.1", 0, max_body=1 << 20)
        url = f"http://127.0.0.1:{port}/v1"

        async def ask() -> None:
            reply = await rollout_openai_client().chat.completions.create(
                model="m", messages=MESSAGES[:2], stream=stream
            )
            if stream:
                [chunk async for chunk in reply]

        try:
            async with http_scope():
                with RolloutContext("mode", PolicyEndpoint(url, "m")), pytest.raises(PolicyError) as caught:
                    await ask()
        finally:
            await runner.cleanup()
        error = policy_error(caught.value)
        assert isinstance(error, PolicyError), caught.value
        assert f"policy endpoint {url}/chat/completions answered 200 with" in str(error)
        assert ("not the event stream" if stream else "an event stream to a request that asked for no stream") in str(
            error
        )

    anyio.run(main)


def _check_in_pieces(body: bytes, cuts: list[int]) -> Any:
    from osmosis_openai.client import _checked_stream

    class Pieces:
        async def __aiter__(self) -> Any:
            start = 0
            for cut in sorted(set(cuts)):
                yield body[start:cut]
                start = cut
            yield body[start:]

        async def aclose(self) -> None:
            pass

    async def main() -> list[bytes]:
        stream = _checked_stream(Pieces(), 1 << 20, "http://x/v1/chat/completions", 200, None, sse=True, chat=True)
        return [chunk async for chunk in stream]

    return anyio.run(main)


@settings(max_examples=60, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 2000), max_size=12), crlf=st.booleans(), bad=st.sampled_from([None, "json", "shape"])
)
def test_the_event_check_does_not_depend_on_where_the_network_cuts_the_stream(cuts, crlf, bad):
    """However the bytes arrive (a cut inside a line, between CR and LF), a good stream passes whole
    and a bad event fails the call with a PolicyError."""
    from osmosis_core import PolicyError
    from osmosis_core.testing.policy_server import Reply, _stream_events

    events = _stream_events(Reply(content="The product is 42.\n#### 42"), "m", 100, True)
    if bad is not None:
        events.insert(2, b'data: {"choices": [\n\n' if bad == "json" else b'data: {"hello": "world"}\n\n')
    body = b"".join(events)
    if crlf:
        body = body.replace(b"\n", b"\r\n")
    cuts = [c % (len(body) + 1) for c in cuts]
    if bad is None:
        assert b"".join(_check_in_pieces(body, cuts)) == body
    else:
        with pytest.raises(PolicyError, match="answered 200 with" + (" malformed JSON" if bad == "json" else " JSON")):
            _check_in_pieces(body, cuts)


def test_a_trainers_sampling_settings_win_over_the_frameworks_on_every_path():
    """``ctx.policy.sampling`` (osmosis serve's sampling_params) is set over what the framework asks
    for: its typed keywords, its own ``extra_body``, on the fast path, streamed, and on openai's path."""
    trainer = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 64, "top_k": 20}

    async def main() -> list[dict[str, Any]]:
        async with ScriptedPolicyServer() as server, http_scope():
            asked: dict[str, Any] = {
                "model": "m", "messages": MESSAGES, "temperature": 0.2, "max_tokens": 512,
                "extra_body": {"top_k": 5, "repetition_penalty": 1.1},
            }  # fmt: skip
            with RolloutContext("tuned", PolicyEndpoint(server.url, "m", sampling=trainer)):
                view = rollout_openai_client()
                await view.chat.completions.create(**asked)
                stream = await view.chat.completions.create(**asked, stream=True)
                _ = [chunk async for chunk in stream]
                await view.chat.completions.create(**asked, response_format={"type": "text"})  # openai's own path
                await view.chat.completions.create(model="m", messages=MESSAGES, max_completion_tokens=512)
            with RolloutContext("plain", PolicyEndpoint(server.url, "m")):
                await rollout_openai_client().chat.completions.create(**asked)
            return [r.body for r in server.requests]

    *tuned, capped, plain = anyio.run(main)
    for body in tuned:
        assert (body["temperature"], body["top_p"], body["max_tokens"], body["top_k"]) == (1.0, 0.9, 64, 20)
        assert body["repetition_penalty"] is None  # the framework's distribution setting the trainer left: unset
    assert capped["max_completion_tokens"] == 64
    assert "max_tokens" not in capped
    assert (plain["temperature"], plain["max_tokens"], plain["top_k"]) == (0.2, 512, 5)  # untouched without settings
    assert "top_p" not in plain
