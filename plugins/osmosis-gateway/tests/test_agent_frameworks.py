"""Strands and the OpenAI Agents SDK through the gateway, streaming on and off: they see ordinary
chat completions, and each rollout's trace is complete, with one prefix-stitched sequence."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import attrs
import pytest
from gateway_helpers import REPO, run, stack

from osmosis_core import AgentWorkflow, AgentWorkflowConfig, AgentWorkflowContext
from osmosis_core.testing import run_rollout
from osmosis_gateway import trainer_view

TEMPLATES = {
    "strands": REPO / "plugins/osmosis-strands/osmosis_strands/template/rollouts/multiply-local-strands/main.py",
    "openai": REPO
    / "plugins/osmosis-openai-agents/osmosis_openai_agents/template/rollouts/multiply-local-openai/main.py",
}


def load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"gateway_test_{name}_rollout", Path(TEMPLATES[name]))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@attrs.define(kw_only=True)
class StreamConfig(AgentWorkflowConfig):
    stream: bool = False


def strands_workflow() -> tuple[type[AgentWorkflow[Any]], Any]:
    pytest.importorskip("osmosis_strands", reason="osmosis-strands")
    from osmosis_strands import OsmosisRolloutModel, OsmosisStrandsAgent

    template = load("strands")

    class StrandsWorkflow(AgentWorkflow[StreamConfig]):
        config_type = StreamConfig

        async def run(self, ctx: AgentWorkflowContext[StreamConfig]) -> None:
            agent = OsmosisStrandsAgent(
                model=OsmosisRolloutModel(stream=ctx.config.stream),
                system_prompt="Use the multiply tool, then answer as #### <number>",
                tools=[template.multiply],
                max_turns=6,
            )
            await agent.invoke_async(ctx.user_prompt)

    return StrandsWorkflow, template.MultiplyGrader


def framework_rollout(framework: str, stream: bool) -> tuple[Any, Any, Any]:
    """The framework's multiply workflow, its grader and its config (streaming or not)."""
    if framework == "strands":
        workflow, grader = strands_workflow()
        return workflow, grader, StreamConfig(stream=stream)
    pytest.importorskip("osmosis_openai_agents", reason="osmosis-openai-agents")
    template = load("openai")
    return template.MultiplyWorkflow, template.MultiplyGrader, template.MultiplyConfig(streaming=stream)


async def two_rollouts(gateway: Any, framework: str, stream: bool) -> tuple[list[Any], list[Any]]:
    """Two multiply rollouts of ``framework`` through ``gateway``: their outcomes and traces."""
    workflow, grader, config = framework_rollout(framework, stream)
    outcomes, traces = [], []
    for n, (a, b) in enumerate([(12, 7), (3, 41)]):
        policy = gateway.open_rollout(f"{framework}-{n}")
        outcome = await run_rollout(
            workflow, grader, policy=policy, user_prompt=f"What is {a} times {b}?", label=a * b,
            workflow_config=config, rollout_id=f"{framework}-{n}",
        )  # fmt: skip
        outcomes.append(outcome)
        traces.append(gateway.pop_trace(f"{framework}-{n}"))
    return outcomes, traces


@pytest.mark.parametrize("framework", ["strands", "openai"])
@pytest.mark.parametrize("stream", [False, True])
def test_agent_frameworks_give_complete_traces(framework, stream):
    framework_rollout(framework, stream)  # (skipped here when the framework is not installed)

    async def main():
        async with stack() as (server, gateway):
            outcomes, traces = await two_rollouts(gateway, framework, stream)
            return outcomes, traces, [r.body.get("stream") is True for r in server.requests]

    outcomes, traces, streamed = run(main)
    assert all(s == stream for s in streamed)
    assert len(streamed) == 4
    for outcome, trace in zip(outcomes, traces, strict=True):
        assert outcome.workflow.ok
        assert outcome.grader is not None
        assert outcome.grader.sample.reward == 1.0
        assert trace.complete, trace.incomplete_reason
        assert [c.finish_reason for c in trace.calls] == ["tool_calls", "stop"]
        view = trainer_view(trace)
        # each framework sends its history back as it got it: the second call extends the first
        assert view.prefix_breaks == 0
        assert len(view.sequences) == 1
        assert view.delivered_fraction == 1.0


@pytest.mark.together
@pytest.mark.parametrize("framework", ["strands", "openai"])
@pytest.mark.parametrize("stream", [False, True])
def test_agent_frameworks_through_a_token_in_engine_give_one_sequence(framework, stream, tmp_path):
    """The same rollouts against SGLang's ``/generate`` (the scripted token engine): the gateway
    renders, parses the Hermes tool calls back, and each trace is one sequence of the engine's ids."""
    pytest.importorskip("tokenizers", reason="osmosis-gateway[token-in]")
    from osmosis_core import PolicyEndpoint
    from osmosis_core.testing.token_engine import ScriptedTokenEngine, write_test_tokenizer
    from osmosis_gateway import PolicyGateway
    from osmosis_gateway.token_in import TokenIn

    framework_rollout(framework, stream)  # (skipped here when the framework is not installed)
    folder = write_test_tokenizer(tmp_path / "tokenizer", "drifting")

    async def main():
        async with ScriptedTokenEngine(folder) as engine:
            upstream = PolicyEndpoint(engine.url, "policy")
            token_in = TokenIn("sglang-generate", folder)
            async with PolicyGateway(upstream, adapter="sglang-generate", token_in=token_in) as gateway:
                outcomes, traces = await two_rollouts(gateway, framework, stream)
                return outcomes, traces, engine.requests

    outcomes, traces, seen = run(main)
    assert len(seen) == 4
    for outcome, trace in zip(outcomes, traces, strict=True):
        assert outcome.workflow.ok, outcome.workflow
        assert outcome.grader is not None
        assert outcome.grader.sample.reward == 1.0
        assert trace.complete, trace.incomplete_reason
        assert [c.finish_reason for c in trace.calls] == ["tool_calls", "stop"]
        assert [c.token_in["render"] for c in trace.calls] == ["full", "incremental"], trace.calls[1].token_in
        view = trainer_view(trace)
        assert view.prefix_breaks == 0
        assert len(view.sequences) == 1
