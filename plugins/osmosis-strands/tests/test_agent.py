"""OsmosisStrandsAgent and OsmosisRolloutModel on real Strands, over real HTTP to a scripted policy server.

No mocks: every rollout runs through the core's LocalBackend (``run_rollout``), Strands' own event
loop and ``OpenAIModel``, openai's client and the core's pooled transport, against
``osmosis_core.testing.ScriptedPolicyServer`` (or, for stream shapes it cannot produce, a raw
asyncio server written here).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import anyio
import pytest
from strands import ModelRetryStrategy, tool
from strands.agent.conversation_manager import NullConversationManager

from osmosis_core import AgentWorkflow, AgentWorkflowContext, Grader, GraderContext, PolicyEndpoint, RolloutContext
from osmosis_core.testing import Fault, Reply, ScriptedPolicyServer, ToolCall, run_rollout, run_rollout_sync
from osmosis_strands import MalformedToolCall, OsmosisRolloutModel, OsmosisStrandsAgent, TurnLimitExceeded

SYSTEM = "You are a careful calculator. Use the multiply tool, then answer on the last line as: #### <number>"
SECRET = "sk-never-in-a-message-0123456789"


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers and return the product.

    Args:
        a: The first factor.
        b: The second factor.
    """
    product = a * b
    return int(product) if float(product).is_integer() else product


class MultiplyWorkflow(AgentWorkflow):
    """The template's workflow, with the agent's options taken from the row's metadata."""

    async def run(self, ctx: AgentWorkflowContext) -> None:
        options = dict(ctx.metadata.get("agent", {}))
        model = OsmosisRolloutModel(temperature=0.5, max_tokens=256, **options.pop("model", {}))
        agent = OsmosisStrandsAgent(model=model, system_prompt=SYSTEM, tools=[multiply], **options)
        await agent.invoke_async(ctx.user_prompt, **ctx.metadata.get("invoke", {}))


class MultiplyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> float:
        match = re.search(r"####\s*(-?\d+)", ctx.sample.last_text())
        return 1.0 if match and match.group(1) == str(ctx.label) else 0.0


def rollout(server: Any, *, user_prompt: str = "val1 = 6\nval2 = 7", label: str | None = "42", **kwargs: Any) -> Any:
    return run_rollout_sync(
        MultiplyWorkflow,
        MultiplyGrader if label is not None else None,
        policy=server,
        user_prompt=user_prompt,
        label=label,
        **kwargs,
    )


# -- the main path ----------------------------------------------------------------------------------


def test_tool_call_then_answer_records_the_sample_turn_by_turn(policy_server):
    outcome = rollout(policy_server, rollout_id="r-main")
    assert outcome.error is None
    assert outcome.reward == 1.0
    sample = outcome.sample

    # native Strands history (Bedrock-style content blocks), JSON-ready
    native = sample.messages
    assert [m["role"] for m in native] == ["user", "assistant", "user", "assistant"]
    assert native[0]["content"] == [{"text": "val1 = 6\nval2 = 7"}]
    call = native[1]["content"][0]["toolUse"]
    assert call["name"] == "multiply"
    assert call["input"] == {"a": 6, "b": 7}
    assert call["toolUseId"].startswith("call_")
    result = native[2]["content"][0]["toolResult"]
    assert result == {"toolUseId": call["toolUseId"], "status": "success", "content": [{"text": "42"}]}
    assert native[3]["content"] == [{"text": "The product is 42.\n#### 42"}]
    json.dumps(native)

    # the chat-completions copy, as Strands' OpenAIModel sends it (system prompt first)
    chat = sample.chat_messages
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant"]
    assert chat[0] == {"role": "system", "content": SYSTEM}
    assert chat[2]["tool_calls"] == [
        {
            "id": call["toolUseId"],
            "type": "function",
            "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'},
        }
    ]
    assert chat[3] == {"role": "tool", "tool_call_id": call["toolUseId"], "content": "42"}
    assert sample.last_text() == "The product is 42.\n#### 42"
    assert sample.system_prompt == SYSTEM
    assert sample.metrics["turns"] == 2
    assert sample.metrics["total_tokens"] > 0

    # what went over the wire: the rollout's model name, header, sampling params, not streamed (the default)
    requests = policy_server.requests_for("r-main")
    assert len(requests) == 2
    first = requests[0].body
    assert first["model"] == "osmosis-stub"
    assert first["stream"] is False
    assert first["temperature"] == 0.5
    assert first["max_tokens"] == 256
    assert [t["function"]["name"] for t in first["tools"]] == ["multiply"]
    assert requests[1].body["messages"] == chat[:4]  # the copy is exactly what was sent


def test_streaming_calls_work_the_same(policy_server):
    outcome = rollout(policy_server, rollout_id="r-s", metadata={"agent": {"model": {"stream": True}}})
    assert outcome.error is None
    assert outcome.reward == 1.0
    assert [r.stream for r in policy_server.requests_for("r-s")] == [True, True]


def test_fifty_concurrent_rollouts_each_use_their_own_endpoint_identity_and_sample(policy_server):
    async def main() -> dict[str, Any]:
        outcomes: dict[str, Any] = {}

        async def one(i: int) -> None:
            outcomes[f"c-{i}"] = await run_rollout(
                MultiplyWorkflow,
                MultiplyGrader,
                policy=policy_server,
                user_prompt=f"val1 = {i + 2}\nval2 = {i + 100}",
                label=str((i + 2) * (i + 100)),
                rollout_id=f"c-{i}",
            )

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(one, i)
        return outcomes

    started = time.perf_counter()
    outcomes = anyio.run(main)
    elapsed = time.perf_counter() - started
    assert len(outcomes) == 50
    for i in range(50):
        outcome = outcomes[f"c-{i}"]
        assert outcome.error is None, outcome.error
        assert outcome.reward == 1.0, outcome.error
        product = str((i + 2) * (i + 100))
        assert outcome.sample.last_text().endswith(f"#### {product}")
        assert outcome.sample.messages[0]["content"][0]["text"] == f"val1 = {i + 2}\nval2 = {i + 100}"
        requests = policy_server.requests_for(f"c-{i}")
        assert len(requests) == 2
        assert f"val1 = {i + 2}\n" in json.dumps(requests[0].body["messages"][1]).replace("\\n", "\n")
    assert len(policy_server.requests) == 100
    assert elapsed < 20


def test_one_client_pool_per_loop_and_one_delegate_per_rollout():
    """No client is built per model call: each rollout gets one view and one delegate, all on one pool."""

    async def main() -> None:
        async with ScriptedPolicyServer() as server:
            views = []
            for rid in ("v-1", "v-2"):
                with RolloutContext(rid, PolicyEndpoint(server.url, "m")) as ctx:
                    model = OsmosisRolloutModel()
                    agent = OsmosisStrandsAgent(model=model, tools=[multiply])
                    await agent.invoke_async("val1 = 2\nval2 = 3")  # two model calls
                    entries = [v for k, v in ctx.extras.items() if k.startswith("osmosis_strands.model.")]
                    assert len(entries) == 1
                    delegate = entries[0][3]
                    assert model._delegate() is delegate
                    view = delegate._custom_client  # the endpoint's view of the loop's client
                    assert view is not None
                    assert delegate.client_args == {}
                    assert view.max_retries == 0
                    model.update_config(params={"temperature": 0.1})
                    assert model._delegate() is not delegate  # a changed config makes a new delegate
                    assert model._delegate().config["params"] == {"temperature": 0.1}
                    views.append(view)
                assert [r.rollout_id for r in server.requests_for(rid)] == [rid, rid]
            # one view per endpoint, shared by its rollouts; each request still carries its own rollout id
            assert views[0] is views[1]

    anyio.run(main)


# -- safe defaults ----------------------------------------------------------------------------------


def test_defaults_print_nothing_keep_history_and_never_retry(capsys):
    agent = OsmosisStrandsAgent()
    assert isinstance(agent.model, OsmosisRolloutModel)
    assert isinstance(agent.conversation_manager, NullConversationManager)
    assert agent._retry_strategy._max_attempts == 1
    assert agent.max_turns == 8

    with ScriptedPolicyServer() as server:
        server.inject(Fault("status", status=429))
        throttled = rollout(server, rollout_id="r-429")
        assert throttled.error.category == "policy_error"
        assert "429" in throttled.error.message
        assert len(server.requests_for("r-429")) == 1  # no hidden retry
        assert rollout(server).reward == 1.0
    assert capsys.readouterr().out == ""  # Strands' default callback handler would print the stream


def test_an_explicit_retry_strategy_still_sees_throttling(policy_server):
    policy_server.inject(Fault("status", status=429))
    strategy = {"retry_strategy": ModelRetryStrategy(max_attempts=2, initial_delay=0)}
    outcome = rollout(policy_server, rollout_id="r-retry", metadata={"agent": strategy})
    assert outcome.error is None
    assert outcome.reward == 1.0
    assert [r.status for r in policy_server.requests_for("r-retry")] == [429, 200, 200]


def test_no_tools_sends_no_empty_tools_array():
    with ScriptedPolicyServer(script=lambda request: Reply(content="hello")) as server:

        class Plain(AgentWorkflow):
            async def run(self, ctx: AgentWorkflowContext) -> None:
                await OsmosisStrandsAgent().invoke_async(ctx.user_prompt)

        outcome = run_rollout_sync(Plain, policy=server, user_prompt="hi", rollout_id="r-nt")
        assert outcome.error is None
        assert outcome.sample.last_text() == "hello"
        (request,) = server.requests_for("r-nt")
        assert "tools" not in request.body
        assert "tool_choice" not in request.body


def test_model_names_and_client_arguments_are_refused():
    with pytest.raises(TypeError, match="Bedrock"):
        OsmosisStrandsAgent(model="gpt-4o-mini")
    for key in ("model_id", "client_args"):
        with pytest.raises(TypeError, match="running rollout"):
            OsmosisRolloutModel(**{key: "x"})
    with pytest.raises(ValueError, match="max_turns"):
        OsmosisStrandsAgent(max_turns=0)


def test_placeholder_outside_a_rollout_raises_a_clear_runtime_error():
    async def main() -> None:
        agent = OsmosisStrandsAgent()
        with pytest.raises(RuntimeError, match="outside a rollout") as info:
            await agent.invoke_async("hi")
        assert "OsmosisRolloutModel" in str(info.value)
        assert "AgentWorkflow" in str(info.value)

    anyio.run(main)
    assert OsmosisRolloutModel().get_config()["model_id"] == "OsmosisRolloutModel"


def test_synchronous_call_inside_the_workflow_is_refused(policy_server):
    class SyncCall(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            OsmosisStrandsAgent(tools=[multiply])(ctx.user_prompt)

    outcome = run_rollout_sync(SyncCall, policy=policy_server, user_prompt="val1 = 1\nval2 = 2")
    assert outcome.error.category == "agent_error"
    assert "await agent.invoke_async(...)" in outcome.error.message
    assert policy_server.requests == []


def test_synchronous_call_outside_an_event_loop_still_works(policy_server):
    """Plain Strands usage (a script, no running loop) inside a rollout context works as Strands does."""
    with RolloutContext("r-sync", PolicyEndpoint(policy_server.url, "m")) as ctx:
        result = OsmosisStrandsAgent(tools=[multiply])("val1 = 3\nval2 = 4")
    assert str(result).strip().endswith("#### 12")
    assert ctx.sample_source is not None
    assert len(policy_server.requests_for("r-sync")) == 2


def test_a_sync_tool_running_a_sub_agent_uses_its_own_loop_view(policy_server):
    """Strands runs a sync tool in a worker thread; a sub-agent called there runs on a fresh loop."""

    @tool(name="multiply")
    def multiply_by_asking(a: float, b: float) -> str:
        """Multiply two numbers by asking a helper agent.

        Args:
            a: The first factor.
            b: The second factor.
        """
        helper = OsmosisStrandsAgent(record_sample=False)
        return str(helper(f"{a:g} * {b:g}")).strip().rsplit("#### ", 1)[-1]

    class WithSubAgent(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            tools = [multiply_by_asking]
            await OsmosisStrandsAgent(system_prompt=SYSTEM, tools=tools).invoke_async(ctx.user_prompt)

    for i in range(2):
        outcome = run_rollout_sync(
            WithSubAgent, MultiplyGrader, policy=policy_server, user_prompt="val1 = 6\nval2 = 7", label="42",
            rollout_id=f"r-sub-{i}",
        )  # fmt: skip
        assert outcome.error is None, outcome.error
        assert outcome.reward == 1.0, outcome.error
        assert len(outcome.sample.messages) == 4  # the main agent's history, not the helper's
        assert len(policy_server.requests_for(f"r-sub-{i}")) == 3


# -- failures ---------------------------------------------------------------------------------------


def test_server_error_is_a_policy_error_naming_status_and_endpoint_not_the_key(policy_server):
    policy_server.inject(Fault("status", status=503))
    policy = PolicyEndpoint(policy_server.url, "osmosis-stub", api_key=SECRET)
    outcome = rollout(policy, rollout_id="r-503")
    error = outcome.workflow.error
    assert error.category == "policy_error"
    assert "503" in error.message
    assert policy_server.url + "/chat/completions" in error.message
    assert SECRET not in error.message
    (request,) = policy_server.requests_for("r-503")
    assert request.authorized
    assert request.status == 503
    assert [m["role"] for m in outcome.workflow.sample.messages] == ["user"]  # the partial history


BROKEN_ANSWERS = {
    "drop_mid_stream": "failed:",  # the connection cut in the middle of the answer
    "truncate": "",  # a well-formed HTTP answer that stops early: no finish_reason, no [DONE]; half a JSON body
    "html": "answered 200 with text/html",  # a proxy's page instead of a completion
    "drop": "Server disconnected",  # no answer at all
}


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("fault", sorted(BROKEN_ANSWERS))
def test_a_broken_answer_is_a_policy_error(policy_server, stream, fault):
    policy_server.inject(Fault(fault))
    outcome = rollout(policy_server, metadata={"agent": {"model": {"stream": stream}}})
    error = outcome.workflow.error
    assert error.category == "policy_error", error
    assert policy_server.url in error.message
    assert BROKEN_ANSWERS[fault] in error.message
    if fault == "truncate":
        assert ("finish_reason" if stream else "malformed JSON") in error.message
    assert len(policy_server.requests_for(outcome.workflow.rollout_id)) == 1  # never sent twice


NOT_A_COMPLETION = {
    "bad_json": (Fault("bad_json"), "malformed JSON"),
    "hello_world": (Fault("wrong_shape"), "no choices"),
    "choices_not_a_list": (Fault("wrong_shape", document={"choices": {"0": {}}}), "not a list"),
    "no_message_or_delta": (Fault("wrong_shape", document={"choices": [{"index": 0}]}), "without a"),
}


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("turn", [1, 2])
@pytest.mark.parametrize("answer", sorted(NOT_A_COMPLETION))
def test_an_answer_that_is_not_a_chat_completion_is_a_policy_error_on_any_turn(policy_server, stream, turn, answer):
    """Malformed JSON (in the body, or in an event of the stream) or JSON of the wrong shape, on the
    first model call or a later one (which Strands wraps in EventLoopException): policy_error
    naming the endpoint and the status (issue 16.4)."""
    fault, expected = NOT_A_COMPLETION[answer]
    if turn == 2:
        policy_server.inject(Fault("delay"))  # the first call is answered normally
    policy_server.inject(fault)
    policy = PolicyEndpoint(policy_server.url, "osmosis-stub", api_key=SECRET)
    outcome = rollout(policy, metadata={"agent": {"model": {"stream": stream}}})
    error = outcome.workflow.error
    assert error is not None, error
    assert error.category == "policy_error", error
    assert f"policy endpoint {policy_server.url}/chat/completions answered 200 with" in error.message, error.message
    assert expected in error.message
    assert SECRET not in error.message
    assert len(policy_server.requests_for(outcome.workflow.rollout_id)) == turn  # never sent twice


def test_unreachable_endpoint_is_a_policy_error():
    outcome = rollout(PolicyEndpoint("http://127.0.0.1:9/v1", "m", api_key=SECRET))
    assert outcome.workflow.error.category == "policy_error"
    assert "http://127.0.0.1:9/v1/chat/completions" in outcome.workflow.error.message
    assert SECRET not in outcome.workflow.error.message


async def _serve_raw_sse(events: list[str]) -> asyncio.Server:
    """A one-route server answering every request with these SSE data lines, then closing."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        writer.write(b"".join(f"data: {e}\n\n".encode() for e in events))
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


_ROLE_CHUNK = json.dumps(
    {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "The prod"}, "finish_reason": None}],
    }
)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([_ROLE_CHUNK, json.dumps({"error": {"message": "template failed"}}), "[DONE]"], "template failed"),
        ([_ROLE_CHUNK, "[DONE]"], "without a finish_reason"),
        ([_ROLE_CHUNK], "without a finish_reason"),
    ],
    ids=["error-event", "no-finish-reason", "no-done"],
)
def test_a_stream_broken_mid_answer_is_never_a_silent_empty_answer(events, expected):
    """Plain Strands records these as an ``end_turn`` answer; the rollout must fail instead."""

    async def main() -> Any:
        server = await _serve_raw_sse(events)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await run_rollout(
                MultiplyWorkflow,
                policy=PolicyEndpoint(f"http://127.0.0.1:{port}/v1", "m"),
                user_prompt="hi",
                metadata={"agent": {"model": {"stream": True}}},
            )

    outcome = anyio.run(main)
    assert outcome.workflow.error.category == "policy_error", outcome.workflow.error
    assert expected in outcome.workflow.error.message
    assert "127.0.0.1" in outcome.workflow.error.message


def test_slow_endpoint_past_the_agent_timeout_is_a_timeout(policy_server):
    policy_server.inject(Fault("delay", delay=3.0))
    started = time.perf_counter()
    outcome = rollout(policy_server, agent_timeout_sec=0.3)
    assert time.perf_counter() - started < 2.5
    assert outcome.workflow.error.category == "timeout"
    assert "0.3 s timeout" in outcome.workflow.error.message


def test_tool_call_without_an_id_fails_at_once_instead_of_looping():
    calls = [ToolCall("multiply", {"a": 6, "b": 7}, id=None)]
    with ScriptedPolicyServer(script=lambda request: Reply(tool_calls=calls)) as server:
        outcome = rollout(server, rollout_id="r-noid")
        error = outcome.workflow.error
        assert error.category == "validation_error", error
        assert MalformedToolCall.__name__ in error.message
        assert "without an id" in error.message
        assert len(server.requests_for("r-noid")) == 1


def test_unknown_tool_is_answered_as_an_error_and_the_rollout_goes_on():
    def script(request: dict[str, Any]) -> Reply:
        if request["messages"][-1]["role"] == "tool":
            return Reply(content="I could only guess.\n#### 42")
        return Reply(tool_calls=[ToolCall("divide", {"a": 6, "b": 7})])

    with ScriptedPolicyServer(script=script) as server:
        outcome = rollout(server, rollout_id="r-unknown")
        assert outcome.error is None
        assert outcome.reward == 1.0
        second = server.requests_for("r-unknown")[1].body["messages"]
        assert second[-1]["role"] == "tool"
        assert "Unknown tool: divide" in second[-1]["content"]
        result = outcome.sample.messages[2]["content"][0]["toolResult"]
        assert result["status"] == "error"


def test_turn_limit_fails_the_rollout_and_keeps_the_partial_history():
    always_call = Reply(tool_calls=[ToolCall("multiply", {"a": 2, "b": 3})])
    with ScriptedPolicyServer(script=lambda request: always_call) as server:
        outcome = rollout(server, rollout_id="r-loop", metadata={"agent": {"max_turns": 3}})
        error = outcome.workflow.error
        assert error.category == "agent_error", error
        assert TurnLimitExceeded.__name__ in error.message
        assert "3 model calls" in error.message
        assert len(server.requests_for("r-loop")) == 3
        # the core attaches the registered source's sample to the failed result
        sample = outcome.workflow.sample
        assert sample is not None
        assert sample.metrics["turns"] == 3
        assert [m["role"] for m in sample.messages] == ["user"] + ["assistant", "user"] * 3  # 3 calls, 3 results
        assert [m["role"] for m in sample.chat_messages][-2:] == ["assistant", "tool"]

        # the default limit (8), kept when the caller passes other limits
        server.clear()
        limited = rollout(server, rollout_id="r-loop8", metadata={"invoke": {"limits": {"output_tokens": 10**6}}})
        assert limited.workflow.error.category == "agent_error"
        assert len(server.requests_for("r-loop8")) == 8

        # opting out: the rollout succeeds with the truncated history
        kept = rollout(
            server, label=None, rollout_id="r-keep", metadata={"agent": {"max_turns": 2, "fail_on_turn_limit": False}}
        )
        assert kept.error is None
        assert len(kept.sample.messages) == 5


def test_registered_source_yields_the_partial_history_when_the_agent_raises(policy_server):
    """Straight on a RolloutContext: the source is registered before the first model call."""
    always_call = Reply(tool_calls=[ToolCall("multiply", {"a": 2, "b": 3})])

    async def main() -> None:
        async with ScriptedPolicyServer(script=lambda request: always_call) as server:
            with RolloutContext("r-partial", PolicyEndpoint(server.url, "m")) as ctx:
                agent = OsmosisStrandsAgent(tools=[multiply], max_turns=2)
                with pytest.raises(TurnLimitExceeded) as info:
                    await agent.invoke_async("val1 = 2\nval2 = 3")
                assert info.value.limit == 2
                assert info.value.turns == 2
                sample = await ctx.get_sample()
            assert len(sample.messages) == 5
            assert sample.metrics["turns"] == 2
            assert agent.last_stop_reason == "limit_turns"

    anyio.run(main)


# -- the sample source ------------------------------------------------------------------------------


def test_one_sample_per_rollout_helper_agents_opt_out(policy_server):
    class TwoAgents(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            helper = OsmosisStrandsAgent(record_sample=ctx.metadata["helper_records"])
            await helper.invoke_async("just say something")
            main = OsmosisStrandsAgent(system_prompt=SYSTEM, tools=[multiply])
            await main.invoke_async(ctx.user_prompt)

    ok = run_rollout_sync(
        TwoAgents, MultiplyGrader, policy=policy_server, user_prompt="val1 = 6\nval2 = 7", label="42",
        metadata={"helper_records": False},
    )  # fmt: skip
    assert ok.error is None
    assert ok.reward == 1.0
    assert len(ok.sample.messages) == 4

    clash = run_rollout_sync(
        TwoAgents, policy=policy_server, user_prompt="val1 = 6\nval2 = 7", metadata={"helper_records": True}
    )
    assert clash.error.category == "validation_error"
    assert "record_sample=False" in clash.error.message


def test_sample_is_json_ready_with_bytes_as_base64():
    png = b"\x89PNG\r\n\x1a\n-not-really"
    agent = OsmosisStrandsAgent(
        system_prompt="look",
        messages=[
            {
                "role": "user",
                "content": [{"text": "what is this?"}, {"image": {"format": "png", "source": {"bytes": png}}}],
            },
            {"role": "assistant", "content": [{"text": "a picture"}]},
        ],
    )
    sample = agent.rollout_sample()
    json.dumps(sample.messages)
    json.dumps(sample.chat_messages)
    import base64

    assert sample.messages[0]["content"][1]["image"]["source"]["bytes"] == base64.b64encode(png).decode()
    assert agent.messages[0]["content"][1]["image"]["source"]["bytes"] == png  # the agent's own history untouched
    assert sample.chat_messages[1]["content"][1]["type"] == "image_url"
    assert sample.last_text() == "a picture"
    assert sample.system_prompt == "look"
    assert sample.metrics == {"turns": 0}


class PromptAsHistory(AgentWorkflow):
    """osmosis-ai's documented use: the rollout's (chat-shaped) prompt handed to the agent as its history."""

    async def run(self, ctx: AgentWorkflowContext) -> None:
        await OsmosisStrandsAgent(messages=ctx.prompt, tools=[multiply]).invoke_async()


def test_the_chat_shaped_prompt_is_taken_as_the_agents_history(policy_server):
    outcome = run_rollout_sync(
        PromptAsHistory,
        MultiplyGrader,
        policy=policy_server,
        system_prompt="Use the tool; answer as #### <n>.",
        user_prompt="val1 = 6\nval2 = 7",
        label="42",
    )
    assert outcome.error is None
    assert outcome.reward == 1.0
    assert outcome.sample.system_prompt == "Use the tool; answer as #### <n>."
    assert outcome.sample.messages[0]["content"] == [{"text": "val1 = 6\nval2 = 7"}]
    sent = policy_server.requests_for(outcome.workflow.rollout_id)[0].body["messages"]
    assert sent[0] == {"role": "system", "content": "Use the tool; answer as #### <n>."}


def test_chat_messages_become_strands_blocks_or_a_clear_error():
    from osmosis_strands.messages import strands_messages

    history, system = strands_messages(
        [
            {"role": "user", "content": [{"type": "text", "text": "2 * 3"}]},
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "function": {"name": "multiply", "arguments": '{"a": 2, "b": 3}'}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "6"},
            {"role": "assistant", "content": [{"text": "#### 6"}]},  # already Strands' shape
        ]
    )
    assert system is None
    assert history[1]["content"] == [{"toolUse": {"toolUseId": "c1", "name": "multiply", "input": {"a": 2, "b": 3}}}]
    assert history[2] == {
        "role": "user",
        "content": [{"toolResult": {"toolUseId": "c1", "status": "success", "content": [{"text": "6"}]}}],
    }
    assert history[3]["content"] == [{"text": "#### 6"}]
    with pytest.raises(ValueError, match=r"messages\[0\]: a 'developer' message has no Strands form"):
        strands_messages([{"role": "developer", "content": "x"}])


@pytest.mark.parametrize("stream", [False, True])
def test_a_trainers_sampling_settings_win_over_the_models_own(policy_server, stream):
    """``osmosis serve``'s sampling_params reach the rollout as ``policy.sampling``: every turn goes
    out with the trainer's temperature, top_p and cap, not the model's (0.5, 256)."""
    trainer = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 48}
    policy = PolicyEndpoint(policy_server.url, "osmosis-stub", sampling=trainer)
    rollout_id = f"r-tuned-{stream}"
    outcome = rollout(policy, rollout_id=rollout_id, metadata={"agent": {"model": {"stream": stream}}})
    assert outcome.error is None
    assert outcome.reward == 1.0
    bodies = [r.body for r in policy_server.requests_for(rollout_id)]
    assert len(bodies) == 2
    for body in bodies:
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (1.0, 0.95, 48)
        assert body.get("stream", False) is stream
    plain = rollout(policy_server, rollout_id="r-untuned")
    assert [(r.body["temperature"], r.body["max_tokens"]) for r in policy_server.requests_for("r-untuned")] == [
        (0.5, 256),
        (0.5, 256),
    ]
    assert plain.reward == 1.0
