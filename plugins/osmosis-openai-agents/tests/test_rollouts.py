"""OsmosisAgent / OsmosisRolloutModel end to end: the real Agents SDK, real HTTP to a scripted policy server.

Each test runs rollouts the way a backend does (``osmosis_core.testing.run_rollout`` over
``LocalBackend``), with the author's normal ``Runner.run`` / ``Runner.run_streamed`` code and
nothing else: no session, hook or sample code.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import anyio
import attrs
import pytest
from agents import Agent, RunConfig, Runner, function_tool

from osmosis_core import AgentWorkflow, AgentWorkflowConfig, AgentWorkflowContext, Grader, GraderContext, PolicyEndpoint
from osmosis_core.testing import Fault, Reply, ScriptedPolicyServer, ToolCall, run_rollout, run_rollout_sync
from osmosis_openai_agents import OsmosisAgent, OsmosisRolloutModel, ToolCallWithoutIdError

INSTRUCTIONS = "You are a careful calculator. Use the multiply tool, then answer on the last line as: #### <number>"
SECRET = "sk-test-0123456789abcdef"


@function_tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    product = a * b
    return int(product) if product.is_integer() else product


# one agent object for every rollout: it holds no per-rollout state
AGENT = OsmosisAgent(name="calculator", instructions=INSTRUCTIONS, tools=[multiply])


@attrs.define(kw_only=True)
class Config(AgentWorkflowConfig):
    streaming: bool = False
    max_turns: int = 8
    tool_not_found_behavior: str = "return_error_to_model"
    run_sync: bool = False


class Workflow(AgentWorkflow[Config]):
    """The author's code: build nothing osmosis-specific, run the agent, return nothing."""

    config_type = Config

    async def run(self, ctx: AgentWorkflowContext[Config]) -> None:
        agent = AGENT
        if ctx.config.tool_not_found_behavior != "return_error_to_model":
            agent = AGENT.clone(tool_not_found_behavior=ctx.config.tool_not_found_behavior)
        if ctx.config.run_sync:
            Runner.run_sync(agent, ctx.prompt)
        elif ctx.config.streaming:
            streamed = Runner.run_streamed(agent, ctx.prompt, max_turns=ctx.config.max_turns)
            async for _event in streamed.stream_events():
                pass
        else:
            await Runner.run(agent, ctx.prompt, max_turns=ctx.config.max_turns)


class LastAnswerGrader(Grader):
    async def grade(self, ctx: GraderContext) -> float:
        return 1.0 if ctx.sample.last_text().strip().endswith(f"#### {ctx.label}") else 0.0


MODES = [pytest.param(False, id="run"), pytest.param(True, id="run_streamed")]


def _policy(server: ScriptedPolicyServer, api_key: str | None = None) -> PolicyEndpoint:
    return PolicyEndpoint(server.url, "policy-under-training", api_key=api_key)


def _calculate_with_key(server: ScriptedPolicyServer, streaming: bool) -> Any:
    """One rollout of 6 x 7 against ``server`` with the SECRET key."""
    return run_rollout_sync(
        Workflow,
        policy=_policy(server, SECRET),
        user_prompt="val1 = 6\nval2 = 7",
        workflow_config=Config(streaming=streaming),
    )


def _tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m.get("role") == "tool"]


# -- the happy path, turn by turn ----------------------------------------------------------------------


@pytest.mark.parametrize("streaming", MODES)
def test_tool_call_then_answer_records_the_sample_turn_by_turn(policy_server: ScriptedPolicyServer, streaming: bool):
    outcome = run_rollout_sync(
        Workflow,
        LastAnswerGrader,
        policy=_policy(policy_server, SECRET),
        user_prompt="val1 = 6\nval2 = 7",
        label="42",
        workflow_config=Config(streaming=streaming),
    )
    assert outcome.error is None
    assert outcome.reward == 1.0
    sample = outcome.sample
    assert sample is not None
    json.dumps(sample.messages), json.dumps(sample.chat_messages)  # JSON-ready as they are

    # native history: the SDK's Responses-format items, what result.to_input_list() gives
    user, call, output, answer = sample.messages
    assert user == {"role": "user", "content": "val1 = 6\nval2 = 7"}
    assert call["type"] == "function_call"
    assert call["name"] == "multiply"
    assert json.loads(call["arguments"]) == {"a": 6, "b": 7}
    assert call["call_id"].startswith("call_")
    assert output == {"type": "function_call_output", "call_id": call["call_id"], "output": "42"}
    assert answer["type"] == "message"
    assert answer["role"] == "assistant"
    assert answer["content"][0]["text"] == "The product is 42.\n#### 42"
    assert sample.system_prompt == INSTRUCTIONS

    # chat-completions copy: exactly what the policy was sent, plus its last answer
    requests = policy_server.requests_for(outcome.workflow.rollout_id)
    assert len(requests) == 2
    assert sample.chat_messages[:-1] == requests[1].body["messages"]
    assert requests[0].body["messages"] == sample.chat_messages[:2]
    assert [m["role"] for m in sample.chat_messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert sample.chat_messages[2]["tool_calls"][0]["id"] == call["call_id"]
    assert sample.chat_messages[-1] == {"role": "assistant", "content": "The product is 42.\n#### 42"}
    assert sample.last_text() == "The product is 42.\n#### 42"

    # the wire: the rollout's model name and key, nothing for OpenAI's own API, no hidden settings
    for request in requests:
        assert request.body["model"] == "policy-under-training"
        assert request.authorized
        assert request.stream is streaming
        assert not {"store", "reasoning_effort", "prompt_cache_key", "metadata"} & set(request.body)
        assert [t["function"]["name"] for t in request.body["tools"]] == ["multiply"]
    if streaming:
        assert requests[0].body["stream_options"] == {"include_usage": True}
    assert sample.metrics["turns"] == 2
    assert sample.metrics["input_tokens"] > 0
    assert sample.metrics["output_tokens"] > 0


def test_sampling_params_of_the_placeholder_reach_the_endpoint(policy_server: ScriptedPolicyServer):
    agent = OsmosisAgent(
        name="calculator",
        instructions=INSTRUCTIONS,
        tools=[multiply],
        model=OsmosisRolloutModel(temperature=0.25, top_p=0.5, max_tokens=64, top_k=20),
        model_settings={"top_p": 0.75},  # the agent's own setting wins over the placeholder's default
    )

    class Sampled(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            await Runner.run(agent, ctx.prompt)

    outcome = run_rollout_sync(Sampled, policy=policy_server, user_prompt="val1 = 2\nval2 = 3")
    assert outcome.error is None
    body = policy_server.requests_for(outcome.workflow.rollout_id)[0].body
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["top_k"]) == (0.25, 0.75, 64, 20)


# -- concurrency -----------------------------------------------------------------------------------------


def test_fifty_concurrent_rollouts_each_use_their_own_id_sample_and_reward(policy_server: ScriptedPolicyServer):
    outcomes: dict[int, Any] = {}

    async def one(i: int) -> None:
        outcomes[i] = await run_rollout(
            Workflow,
            LastAnswerGrader,
            policy=policy_server,
            user_prompt=f"val1 = {i + 2}\nval2 = {i + 1000}",
            label=str((i + 2) * (i + 1000)),
            workflow_config=Config(streaming=i % 2 == 1),
            rollout_id=f"concurrent-{i}",
        )

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(one, i)

    anyio.run(main)
    assert len(outcomes) == 50
    for i, outcome in outcomes.items():
        assert outcome.error is None, (i, outcome.error)
        assert outcome.reward == 1.0, (i, outcome.error)
        product = str((i + 2) * (i + 1000))
        requests = policy_server.requests_for(f"concurrent-{i}")
        assert len(requests) == 2
        assert requests[0].body["messages"][1]["content"] == f"val1 = {i + 2}\nval2 = {i + 1000}"
        assert _tool_messages(requests[1].body)[0]["content"] == product
        assert outcome.sample.messages[0]["content"] == f"val1 = {i + 2}\nval2 = {i + 1000}"
        assert outcome.sample.messages[2]["output"] == product
    assert len(policy_server.requests) == 100


# -- policy failures ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", MODES)
def test_a_5xx_fails_the_rollout_with_policy_error_naming_status_and_endpoint(
    policy_server: ScriptedPolicyServer, streaming: bool
):
    policy_server.inject(Fault("status", status=503, message="overloaded"))
    outcome = _calculate_with_key(policy_server, streaming)
    error = outcome.workflow.error
    assert error is not None, error
    assert error.category == "policy_error", error
    assert "503" in error.message
    assert policy_server.url in error.message
    assert SECRET not in error.message
    assert len(policy_server.requests_for(outcome.workflow.rollout_id)) == 1  # no hidden retry
    assert outcome.workflow.sample is not None  # the history up to the failure: the prompt
    assert outcome.workflow.sample.messages == [{"role": "user", "content": "val1 = 6\nval2 = 7"}]


BROKEN_ANSWERS = {
    "drop_mid_stream": "failed:",  # the connection cut in the middle of the answer
    "truncate": "",  # a well-formed HTTP answer that stops early: no finish_reason, no [DONE]; half a JSON body
    "html": "answered 200 with text/html",  # a proxy's page instead of a completion
    "drop": "Server disconnected",  # no answer at all
}


@pytest.mark.parametrize("streaming", MODES)
@pytest.mark.parametrize("fault", sorted(BROKEN_ANSWERS))
def test_a_broken_answer_fails_the_rollout_with_policy_error(
    policy_server: ScriptedPolicyServer, streaming: bool, fault: str
):
    """Never a success with a partial answer (the SDK alone takes a cut stream for a short, complete answer)."""
    policy_server.inject(Fault(fault))  # type: ignore[arg-type]
    outcome = _calculate_with_key(policy_server, streaming)
    error = outcome.workflow.error
    assert error is not None, error
    assert error.category == "policy_error", error
    assert policy_server.url in error.message
    assert BROKEN_ANSWERS[fault] in error.message
    assert SECRET not in error.message
    if fault == "truncate":
        assert ("finish_reason" if streaming else "malformed JSON") in error.message
    assert len(policy_server.requests_for(outcome.workflow.rollout_id)) == 1  # never sent twice


NOT_A_COMPLETION = {
    "bad_json": (Fault("bad_json"), "malformed JSON"),
    "hello_world": (Fault("wrong_shape"), "no choices"),
    "choices_not_a_list": (Fault("wrong_shape", document={"choices": {"0": {}}}), "not a list"),
    "no_message_or_delta": (Fault("wrong_shape", document={"choices": [{"index": 0}]}), "without a"),
}


@pytest.mark.parametrize("streaming", MODES)
@pytest.mark.parametrize("turn", [1, 2])
@pytest.mark.parametrize("answer", sorted(NOT_A_COMPLETION))
def test_an_answer_that_is_not_a_chat_completion_is_a_policy_error_on_any_turn(
    policy_server: ScriptedPolicyServer, streaming: bool, turn: int, answer: str
):
    """Malformed JSON (in the body, or in an event of the stream) or JSON of the wrong shape, on the
    first model call or a later one: policy_error naming the endpoint and the status (issue 16.4)."""
    fault, expected = NOT_A_COMPLETION[answer]
    if turn == 2:
        policy_server.inject(Fault("delay"))  # the first call is answered normally
    policy_server.inject(fault)
    outcome = _calculate_with_key(policy_server, streaming)
    error = outcome.workflow.error
    assert error is not None, error
    assert error.category == "policy_error", error
    assert f"policy endpoint {policy_server.url}/chat/completions answered 200 with" in error.message, error.message
    assert expected in error.message
    assert SECRET not in error.message
    assert len(policy_server.requests_for(outcome.workflow.rollout_id)) == turn  # never sent twice


def test_an_unreachable_endpoint_is_a_policy_error():
    with ScriptedPolicyServer() as server:
        url = server.url
    outcome = run_rollout_sync(
        Workflow, policy=PolicyEndpoint(url, "m", api_key=SECRET), user_prompt="val1 = 1\nval2 = 2"
    )
    error = outcome.workflow.error
    assert error is not None, error
    assert error.category == "policy_error", error
    assert url in error.message
    assert SECRET not in error.message


@pytest.mark.parametrize("streaming", MODES)
def test_a_slow_endpoint_past_the_agent_timeout_is_a_timeout(policy_server: ScriptedPolicyServer, streaming: bool):
    policy_server.inject(Fault("delay", delay=3.0))
    started = time.perf_counter()
    outcome = run_rollout_sync(
        Workflow,
        policy=policy_server,
        user_prompt="val1 = 6\nval2 = 7",
        workflow_config=Config(streaming=streaming),
        agent_timeout_sec=0.5,
    )
    assert time.perf_counter() - started < 2.5
    error = outcome.workflow.error
    assert error is not None, error
    assert error.category == "timeout", error
    assert "0.5 s timeout" in error.message


# -- what the model does wrong -------------------------------------------------------------------------------


def _always_id_less_tool_call(request: dict[str, Any]) -> Reply:
    return Reply(tool_calls=[ToolCall("multiply", {"a": 6, "b": 7}, id=None)])


@pytest.mark.parametrize("streaming", MODES)
def test_a_tool_call_without_an_id_fails_at_once_with_validation_error(streaming: bool):
    with ScriptedPolicyServer(_always_id_less_tool_call) as server:
        outcome = run_rollout_sync(
            Workflow, policy=server, user_prompt="val1 = 6\nval2 = 7", workflow_config=Config(streaming=streaming)
        )
        requests = server.requests_for(outcome.workflow.rollout_id)
    error = outcome.workflow.error
    assert error is not None, error
    assert error.category == "validation_error", error
    assert ToolCallWithoutIdError.__name__ in error.message
    assert "without an id" in error.message
    assert len(requests) == 1  # not a loop
    assert outcome.workflow.sample is not None
    assert outcome.workflow.sample.messages[0]["role"] == "user"


def _calls_divide_first(request: dict[str, Any]) -> Reply:
    if any(m.get("role") == "tool" for m in request["messages"]):
        return Reply(content="I could not divide, so: #### 0")
    return Reply(tool_calls=[ToolCall("divide", {"a": 6, "b": 7})])


@pytest.mark.parametrize("streaming", MODES)
def test_an_unknown_tool_is_answered_to_the_model_as_an_error(streaming: bool):
    with ScriptedPolicyServer(_calls_divide_first) as server:
        outcome = run_rollout_sync(
            Workflow,
            LastAnswerGrader,
            policy=server,
            user_prompt="divide 6 by 7",
            label="0",
            workflow_config=Config(streaming=streaming),
        )
        requests = server.requests_for(outcome.workflow.rollout_id)
    assert outcome.error is None
    assert outcome.reward == 1.0
    assert len(requests) == 2
    (tool_message,) = _tool_messages(requests[1].body)
    assert "divide" in tool_message["content"]
    assert "not found" in tool_message["content"]
    assert outcome.sample.messages[2]["type"] == "function_call_output"
    assert "not found" in outcome.sample.messages[2]["output"]


def test_a_plain_agent_with_the_placeholder_in_its_run_config_gets_the_same_defaults():
    plain = Agent(name="calculator", instructions=INSTRUCTIONS, tools=[multiply])  # no model of its own

    class PlainAgentWorkflow(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            await Runner.run(plain, ctx.prompt, run_config=RunConfig(model=OsmosisRolloutModel(), workflow_name="w"))

    with ScriptedPolicyServer(_calls_divide_first) as server:
        outcome = run_rollout_sync(PlainAgentWorkflow, policy=server, user_prompt="divide 6 by 7")
        requests = server.requests_for(outcome.workflow.rollout_id)
    assert outcome.error is None, outcome.error
    assert len(requests) == 2
    assert "not found" in _tool_messages(requests[1].body)[0]["content"]
    assert outcome.sample.system_prompt == INSTRUCTIONS
    assert outcome.sample.last_text().endswith("#### 0")


def test_an_unknown_tool_fails_the_rollout_when_the_agent_says_raise_error():
    with ScriptedPolicyServer(_calls_divide_first) as server:
        outcome = run_rollout_sync(
            Workflow,
            policy=server,
            user_prompt="divide 6 by 7",
            workflow_config=Config(tool_not_found_behavior="raise_error"),
        )
        assert len(server.requests_for(outcome.workflow.rollout_id)) == 1
    error = outcome.workflow.error
    assert error is not None
    assert error.category == "agent_error"
    assert "divide" in error.message


def _always_multiply(request: dict[str, Any]) -> Reply:
    return Reply(tool_calls=[ToolCall("multiply", {"a": 6, "b": 7})])


@pytest.mark.parametrize("streaming", MODES)
def test_the_turn_limit_fails_the_rollout_and_keeps_the_partial_history(streaming: bool):
    with ScriptedPolicyServer(_always_multiply) as server:
        outcome = run_rollout_sync(
            Workflow,
            policy=server,
            user_prompt="val1 = 6\nval2 = 7",
            workflow_config=Config(streaming=streaming, max_turns=3),
        )
        requests = server.requests_for(outcome.workflow.rollout_id)
    assert len(requests) == 3
    error = outcome.workflow.error
    assert error is not None, error
    assert error.category == "agent_error", error
    assert "MaxTurnsExceeded" in error.message
    assert "3" in error.message
    sample = outcome.workflow.sample
    assert sample is not None  # the partial history, last turn's tool result included
    assert [m.get("type", m.get("role")) for m in sample.messages] == ["user"] + [
        "function_call",
        "function_call_output",
    ] * 3
    assert [m["role"] for m in sample.chat_messages] == ["system", "user"] + ["assistant", "tool"] * 3
    assert sample.metrics["turns"] == 3


def _always_broken_arguments(request: dict[str, Any]) -> Reply:
    return Reply(tool_calls=[ToolCall("multiply", '{"a": 6, "b": ')])


def test_invalid_tool_arguments_are_told_to_the_model_and_the_turn_limit_ends_the_loop():
    with ScriptedPolicyServer(_always_broken_arguments) as server:
        outcome = run_rollout_sync(
            Workflow, policy=server, user_prompt="val1 = 6\nval2 = 7", workflow_config=Config(max_turns=2)
        )
        requests = server.requests_for(outcome.workflow.rollout_id)
    assert len(requests) == 2
    (tool_message,) = _tool_messages(requests[1].body)
    assert "error" in tool_message["content"].lower()
    assert outcome.workflow.error is not None
    assert outcome.workflow.error.category == "agent_error"


# -- misuse ------------------------------------------------------------------------------------------------------


def test_the_placeholder_outside_a_rollout_is_a_clear_runtime_error():
    with pytest.raises(RuntimeError, match="outside a rollout"):
        asyncio.run(Runner.run(OsmosisAgent(name="calculator", tools=[multiply]), "val1 = 6\nval2 = 7"))
    with pytest.raises(RuntimeError, match="outside a rollout"):
        asyncio.run(Runner.run(Agent(name="plain", model=OsmosisRolloutModel()), "hello"))


def test_run_sync_inside_the_workflow_is_refused_pointing_to_await_runner_run(policy_server: ScriptedPolicyServer):
    outcome = run_rollout_sync(
        Workflow, policy=policy_server, user_prompt="val1 = 6\nval2 = 7", workflow_config=Config(run_sync=True)
    )
    error = outcome.workflow.error
    assert error is not None
    assert error.category == "agent_error"
    assert "run_sync" in error.message
    assert "await Runner.run(" in error.message
    assert policy_server.requests == []


def test_a_model_name_is_refused_and_none_means_the_placeholder():
    with pytest.raises(TypeError, match=r"api\.openai\.com"):
        OsmosisAgent(name="x", model="gpt-4o")
    assert isinstance(OsmosisAgent(name="x", model=None).model, OsmosisRolloutModel)
    assert isinstance(OsmosisAgent(name="x").model, OsmosisRolloutModel)


def test_tracing_is_switched_off_and_the_runner_wrapped_on_first_use_only():
    code = (
        "from agents import trace\n"
        "from agents.run import get_default_agent_runner\n"
        "import osmosis_openai_agents\n"
        "before = (type(trace('x')).__name__, type(get_default_agent_runner()).__name__)\n"
        "osmosis_openai_agents.OsmosisAgent(name='x')\n"
        "after = (type(trace('x')).__name__, type(get_default_agent_runner()).__name__)\n"
        "print(before, after)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_AGENTS_DISABLE_TRACING"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "('TraceImpl', 'AgentRunner') ('NoOpTrace', '_OsmosisRunner')"


class TunedWorkflow(AgentWorkflow[Config]):
    """An agent with sampling settings of its own (``ModelSettings``), as authors write them."""

    config_type = Config

    async def run(self, ctx: AgentWorkflowContext[Config]) -> None:
        from agents import ModelSettings

        agent = AGENT.clone(model_settings=ModelSettings(temperature=0.2, top_p=0.5, max_tokens=512))
        if ctx.config.streaming:
            async for _event in Runner.run_streamed(agent, ctx.prompt).stream_events():
                pass
        else:
            await Runner.run(agent, ctx.prompt)


@pytest.mark.parametrize("streaming", MODES)
def test_a_trainers_sampling_settings_win_over_the_agents_model_settings(
    policy_server: ScriptedPolicyServer, streaming: bool
):
    """``osmosis serve``'s sampling_params reach the rollout as ``policy.sampling``: every turn goes
    out with the trainer's settings, not the agent's ``ModelSettings``."""
    trainer = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 64, "top_k": 40}
    runs = {}
    for rollout_id, sampling in ((f"tuned-{streaming}", trainer), (f"plain-{streaming}", None)):
        runs[rollout_id] = run_rollout_sync(
            TunedWorkflow,
            LastAnswerGrader,
            policy=PolicyEndpoint(policy_server.url, "policy-under-training", sampling=sampling),
            user_prompt="val1 = 6\nval2 = 7",
            label="42",
            rollout_id=rollout_id,
            workflow_config=Config(streaming=streaming),
        )
    assert [outcome.reward for outcome in runs.values()] == [1.0, 1.0]
    tuned = [r.body for r in policy_server.requests_for(f"tuned-{streaming}")]
    plain = [r.body for r in policy_server.requests_for(f"plain-{streaming}")]
    assert len(tuned) == len(plain) == 2
    for body in tuned:
        assert (body["temperature"], body["top_p"], body["max_tokens"], body["top_k"]) == (1.0, 0.9, 64, 40)
    for body in plain:
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.2, 0.5, 512)
        assert "top_k" not in body
