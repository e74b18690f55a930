"""The rollouts the tests serve: real AgentWorkflow / Grader classes run by the real LocalBackend."""

from __future__ import annotations

import asyncio

from osmosis_core import AgentWorkflow, AgentWorkflowContext, Grader, GraderContext, RolloutSample, chat_completion


class Trivial(AgentWorkflow):
    """No model call: the prompt and a fixed answer."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        return [*ctx.prompt, {"role": "assistant", "content": "#### 42"}]


class Sleepy(AgentWorkflow):
    """Waits ``metadata["sleep"]`` seconds; ``metadata["fail"]`` raises that message instead."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        await asyncio.sleep(float(ctx.metadata.get("sleep", 0)))
        if ctx.metadata.get("fail"):
            raise ValueError(ctx.metadata["fail"])
        return [*ctx.prompt, {"role": "assistant", "content": f"#### {ctx.metadata.get('answer', 42)}"}]


class OneCall(AgentWorkflow):
    """One call to the rollout's policy endpoint."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        reply = await chat_completion(ctx.prompt)
        return [*ctx.prompt, reply]


class EndsWithLabel(Grader):
    """1.0 when the last message ends with the label; waits ``metadata["grade_sleep"]`` first."""

    async def grade(self, ctx: GraderContext) -> float:
        await asyncio.sleep(float(ctx.metadata.get("grade_sleep", 0)))
        return 1.0 if ctx.sample.last_text().rstrip().endswith(str(ctx.label)) else 0.0


class Leaky(AgentWorkflow):
    """Puts the rollout's policy key in its sample (the server must redact it from every file)."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        from osmosis_core import get_rollout_context

        key = get_rollout_context().policy.api_key
        reply = await chat_completion(ctx.prompt)
        if ctx.metadata.get("fail"):
            raise ValueError(f"refusing key {key}")
        return [*ctx.prompt, {"role": "system", "content": f"the key was {key}"}, reply]


class NanMetric(AgentWorkflow):
    """One call, and a metric that is not a number (as a division by zero in a workflow gives)."""

    async def run(self, ctx: AgentWorkflowContext) -> RolloutSample:
        reply = await chat_completion(ctx.prompt)
        return RolloutSample(messages=[*ctx.prompt, reply], metrics={"ratio": float("nan"), "turns": 1})


class TwoCallsOfItsOwn(AgentWorkflow):
    """Two calls to the policy, each with sampling settings of the workflow's own (as agents set them)."""

    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        first = await chat_completion(ctx.prompt, temperature=0.2, top_p=0.5, max_tokens=512)
        history = [*ctx.prompt, first, {"role": "user", "content": "And once more?"}]
        second = await chat_completion(history, temperature=0.2, top_p=0.5, max_tokens=512)
        return [*history, second]
