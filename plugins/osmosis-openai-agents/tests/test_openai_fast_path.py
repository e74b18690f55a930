"""The fast path of the rollouts' OpenAI client (osmosis_core.openai_client) against this openai release.

It posts plain-JSON chat-completions requests without openai's typed request transform, through
openai internals (``AsyncCompletions._post``, ``make_request_options``, ``AsyncChat.completions``).
Measured on the 2-core machine (process CPU per call, 1,000 calls at 50 in flight, a tool call and
a tool result in the history): openai's normal path 1.8 to 2.4 ms, the fast path 0.9 to 1.4 ms.
These tests fail loudly, naming what changed, when an openai release breaks it.
"""

from __future__ import annotations

import inspect
import json

import anyio
import openai
import pytest

from osmosis_core import PolicyEndpoint, RolloutContext
from osmosis_core.http_session import http_scope
from osmosis_core.openai_client import fast_client_class, rollout_openai_client
from osmosis_core.testing import ScriptedPolicyServer

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
    assert isinstance(client.chat, AsyncChat) and isinstance(client.chat.completions, AsyncCompletions)
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
    from osmosis_core.openai_client import _plain_json

    assert not _plain_json({"messages": [{"role": "user", "content": value}]})
    assert _plain_json({"messages": MESSAGES, "tools": TOOLS, "temperature": 0.5})
