"""A rollout of exactly one model call (for bench/run_throughput.py): ask, keep the answer, grade it."""

from __future__ import annotations

from osmosis_core import AgentWorkflow, AgentWorkflowContext, Grader, GraderContext, chat_completion


class OneCall(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        reply = await chat_completion(ctx.prompt)
        return [*ctx.prompt, reply]


class FinalAnswer(Grader):
    async def grade(self, ctx: GraderContext) -> float:
        return 1.0 if ctx.sample.last_text().rstrip().endswith(str(ctx.label)) else 0.0
