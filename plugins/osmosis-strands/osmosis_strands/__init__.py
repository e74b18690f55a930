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

from typing import TYPE_CHECKING

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_strands.agent import OsmosisStrandsAgent as OsmosisStrandsAgent
    from osmosis_strands.errors import MalformedToolCall as MalformedToolCall
    from osmosis_strands.errors import TurnLimitExceeded as TurnLimitExceeded
    from osmosis_strands.model import OsmosisRolloutModel as OsmosisRolloutModel

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "agent": ["OsmosisStrandsAgent"],
        "errors": ["MalformedToolCall", "TurnLimitExceeded"],
        "model": ["OsmosisRolloutModel"],
    },
)
