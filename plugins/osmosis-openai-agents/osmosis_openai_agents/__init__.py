"""osmosis-openai-agents: write an osmosis rollout with the OpenAI Agents SDK.

Give the agent the :class:`OsmosisRolloutModel` placeholder (the default of :class:`OsmosisAgent`)
and run it the normal way; the placeholder calls the rollout's policy endpoint and the rollout's
sample is registered without any code of yours::

    from agents import Runner, function_tool
    from osmosis_core import AgentWorkflow, AgentWorkflowContext
    from osmosis_openai_agents import OsmosisAgent

    @function_tool
    def multiply(a: float, b: float) -> float:
        "Multiply two numbers."
        return a * b

    agent = OsmosisAgent(name="calculator", instructions="Use the multiply tool.", tools=[multiply])

    class MultiplyWorkflow(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            await Runner.run(agent, ctx.prompt, max_turns=8)   # the sample is already registered

Importing this package (or its ``plugin`` module) does not import the Agents SDK: the names
below load it on first use.
"""

from typing import TYPE_CHECKING

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_openai_agents.integration import OsmosisAgent as OsmosisAgent
    from osmosis_openai_agents.integration import OsmosisRolloutModel as OsmosisRolloutModel
    from osmosis_openai_agents.integration import ToolCallWithoutIdError as ToolCallWithoutIdError

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "integration": ["OsmosisAgent", "OsmosisRolloutModel", "ToolCallWithoutIdError"],
    },
)
