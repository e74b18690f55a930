"""multiply-harbor-strands: a Strands Agents multiply agent, each rollout in its own Harbor trial.

The workflow builds an ``OsmosisStrandsAgent`` with a ``multiply`` tool and asks it the row's
question. With ``--backend harbor`` (the run config's default here) every rollout runs inside an
isolated Harbor trial of the task in ``task/``: the workflow runs in the trial's sandbox against
the rollout's policy endpoint, and ``MultiplyGrader`` runs as the trial's verifier
(``task/tests/test.sh``), so the reward is Harbor's. The same file runs unchanged on the local
backend (``--backend local``).

The agent calls the policy through the ``OsmosisRolloutModel`` placeholder (the model name and URL
come from the run, never from this file) and registers its own history as the rollout's sample,
so ``run`` returns nothing. The grader gives 1.0 when the last message ends with
``#### <number>`` equal to the row's ``ground_truth``.

Run it:  osmosis run configs/eval/multiply-harbor-strands.toml --stub-policy
"""

from __future__ import annotations

import re

import attrs
from osmosis_core import AgentWorkflow, AgentWorkflowConfig, AgentWorkflowContext, Grader, GraderContext
from strands import tool

from osmosis_strands import OsmosisRolloutModel, OsmosisStrandsAgent


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers and return the product.

    Args:
        a: The first factor.
        b: The second factor.
    """
    product = a * b
    return int(product) if float(product).is_integer() else product


@attrs.define(kw_only=True)
class MultiplyConfig(AgentWorkflowConfig):
    """Settings, overridable from the run config's [rollout.workflow_config] table."""

    max_turns: int = 6
    temperature: float = 1.0
    max_tokens: int = 1024


class MultiplyWorkflow(AgentWorkflow[MultiplyConfig]):
    """Let a Strands agent with the multiply tool answer the row's question."""

    config_type = MultiplyConfig

    async def run(self, ctx: AgentWorkflowContext[MultiplyConfig]) -> None:
        system = "\n".join(str(m["content"]) for m in ctx.prompt if m.get("role") == "system") or None
        agent = OsmosisStrandsAgent(
            model=OsmosisRolloutModel(temperature=ctx.config.temperature, max_tokens=ctx.config.max_tokens),
            system_prompt=system,
            tools=[multiply],
            max_turns=ctx.config.max_turns,
        )
        await agent.invoke_async(ctx.user_prompt)  # the agent registers its history as the sample


ANSWER = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


class MultiplyGrader(Grader):
    """1.0 when the final ``#### <number>`` matches ground_truth (within 1e-6), else 0.0."""

    async def grade(self, ctx: GraderContext) -> float:
        match = ANSWER.search(ctx.sample.last_text())
        if match is None:
            return 0.0
        answer = float(match.group(1).replace(",", ""))
        return 1.0 if abs(answer - float(ctx.label)) <= 1e-6 * max(1.0, abs(answer)) else 0.0
