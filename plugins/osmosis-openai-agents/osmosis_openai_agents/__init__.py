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

from osmosis_core.plugin import attach_stub

__version__ = "0.1.0"
__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
