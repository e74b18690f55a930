"""Strands Agents for osmosis rollouts.

Write the agent with :class:`OsmosisStrandsAgent` (a ``strands.Agent``) and let it call the
rollout's policy through the :class:`OsmosisRolloutModel` placeholder; the agent registers its
history as the rollout's sample, so the workflow returns ``None``::

    from strands import tool
    from osmosis_core import AgentWorkflow, AgentWorkflowContext
    from osmosis_strands import OsmosisStrandsAgent, OsmosisRolloutModel

    @tool
    def multiply(a: float, b: float) -> float:
        \"\"\"Multiply two numbers.\"\"\"
        return a * b

    class MultiplyWorkflow(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> None:
            agent = OsmosisStrandsAgent(model=OsmosisRolloutModel(temperature=1.0), tools=[multiply])
            await agent.invoke_async(ctx.user_prompt)

Public names are imported lazily: importing this package (or its plugin module, which the
``osmosis`` CLI loads) does not import Strands; the first use of a Strands-backed name does.
"""

from osmosis_core.plugin import attach_stub

__version__ = "0.1.0"
__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
