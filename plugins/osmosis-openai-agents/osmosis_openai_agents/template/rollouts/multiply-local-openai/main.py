"""multiply-local-openai: a tool-calling agent on the OpenAI Agents SDK.

The workflow runs an ``OsmosisAgent`` with a ``multiply`` tool through the SDK's own
``Runner.run`` (or ``Runner.run_streamed``). The agent's model is the ``OsmosisRolloutModel``
placeholder: each call goes to this rollout's policy endpoint, and the conversation is recorded
as the rollout's sample, so ``run`` returns nothing. The grader gives 1.0 when the last message
ends with ``#### <number>`` equal to the row's ``ground_truth``.

Defaults that matter for training: tracing is off, an unknown tool is answered to the model as an
error, a run that reaches ``max_turns`` fails the rollout (its partial history is kept), and the
client never retries on its own.

Run it:  osmosis run configs/eval/multiply-local-openai.toml --stub-policy
"""

from __future__ import annotations

import re

import attrs
from agents import Runner, function_tool
from osmosis_core import AgentWorkflow, AgentWorkflowConfig, AgentWorkflowContext, Grader, GraderContext
from osmosis_openai_agents import OsmosisAgent, OsmosisRolloutModel

DEFAULT_INSTRUCTIONS = (
    "You are a careful calculator. Use the multiply tool, then answer on the last line as: #### <number>"
)


@function_tool
async def multiply(a: float, b: float) -> float:
    """Multiply two numbers and return the product (async: no worker-thread hop per call).

    Args:
        a: The first factor.
        b: The second factor.
    """
    product = a * b
    return int(product) if product.is_integer() else product


@attrs.define(kw_only=True)
class MultiplyConfig(AgentWorkflowConfig):
    """Settings, overridable from the run config's [rollout.workflow_config] table."""

    max_turns: int = 6
    temperature: float = 1.0
    max_tokens: int = 1024
    streaming: bool = False


class MultiplyWorkflow(AgentWorkflow[MultiplyConfig]):
    """Run the agent on the row's prompt; the placeholder model registers the sample."""

    config_type = MultiplyConfig

    async def run(self, ctx: AgentWorkflowContext[MultiplyConfig]) -> None:
        # the row's system prompt becomes the agent's instructions (the SDK sends them first)
        system = "\n\n".join(str(m["content"]) for m in ctx.prompt if m.get("role") == "system")
        conversation = [m for m in ctx.prompt if m.get("role") != "system"]
        agent = OsmosisAgent(
            name="calculator",
            instructions=system or DEFAULT_INSTRUCTIONS,
            tools=[multiply],
            model=OsmosisRolloutModel(temperature=ctx.config.temperature, max_tokens=ctx.config.max_tokens),
        )
        if ctx.config.streaming:
            streamed = Runner.run_streamed(agent, conversation, max_turns=ctx.config.max_turns)
            async for _event in streamed.stream_events():
                pass  # text deltas, tool calls, ... as they happen
        else:
            await Runner.run(agent, conversation, max_turns=ctx.config.max_turns)


ANSWER = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


class MultiplyGrader(Grader):
    """1.0 when the final ``#### <number>`` matches ground_truth (within 1e-6), else 0.0."""

    async def grade(self, ctx: GraderContext) -> float:
        match = ANSWER.search(ctx.sample.last_text())
        if match is None:
            return 0.0
        answer = float(match.group(1).replace(",", ""))
        return 1.0 if abs(answer - float(ctx.label)) <= 1e-6 * max(1.0, abs(answer)) else 0.0
