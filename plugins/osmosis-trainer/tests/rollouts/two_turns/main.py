"""two-turns: the adapter tests' rollout. Two model calls whatever the model answers, with the tiny
model's tool format, and a fault per dataset row (its ``fault`` metadata), so each way a training row
gets masked happens on purpose, through the real stack:

* ``raise``: the workflow raises after the first call (a failed rollout: ``agent_error``);
  ``raise-odd``: only the group's odd samples (rollout ids ending ``-s1``, ``-s3``) fail;
* ``rewrite``: the first answer is edited (text put before it) before the second call: its tokens
  are no longer a prefix of the next prompt (a broken token prefix);
* ``incomplete``: a third call the policy refuses (``n=2``), caught (an incomplete trace);
* none: a clean rollout.

The reward is a deterministic function of the final answer (its length modulo 5, over 4), so a
test can tell the rewards TRL got from the graders'.
"""

from __future__ import annotations

from typing import Any

from osmosis_core import (
    AgentWorkflow,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    PolicyError,
    RolloutSample,
    chat_completion,
    message_text,
)

TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look it up.", "parameters": {}}}


class TwoTurnsWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> RolloutSample:
        fault = ctx.metadata.get("fault")
        messages: list[dict[str, Any]] = list(ctx.prompt)
        reply = await chat_completion(messages, tools=[TOOL])
        messages.append(reply)
        if fault == "raise" or (fault == "raise-odd" and int(ctx.rollout_id.rsplit("-s", 1)[1]) % 2):
            raise RuntimeError("the test rollout fails here on purpose")
        if fault == "rewrite":
            messages[-1] = {**reply, "content": "(edited)" + (reply.get("content") or "")}
        calls = reply.get("tool_calls") or []
        if calls:
            messages.extend({"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls)
        else:
            messages.append({"role": "user", "content": "go on"})
        messages.append(await chat_completion(messages, tools=[TOOL]))
        if fault == "incomplete":
            try:
                await chat_completion(messages, n=2)
            except PolicyError:
                pass
        return RolloutSample(messages=messages)


class TwoTurnsGrader(Grader):
    async def grade(self, ctx: GraderContext) -> float:
        return (len(message_text(ctx.sample.messages[-1])) % 5) / 4
