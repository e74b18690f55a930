"""A multi-turn tool-calling rollout (for bench/trainer_rows.py): the user asks several products in turn.

The first question is the prompt; the others come from the row's metadata (``questions``: ``[[a, b],
...]``). For each question the model (the scripted calculator) calls ``multiply`` and then answers,
so a rollout of 5 questions makes 10 model calls, each prompt extending the last (one stitched token
sequence with the vLLM-flavoured stand-in and ``osmosis serve --traces``). Graded on the last answer.
"""

from __future__ import annotations

import json
from typing import Any

from osmosis_core import AgentWorkflow, AgentWorkflowContext, Grader, GraderContext, chat_completion

MULTIPLY = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two numbers and return the product.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}


class MultiTurn(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = list(ctx.prompt)
        questions = ctx.metadata.get("questions") or []
        for turn in range(len(questions) + 1):
            if turn:
                a, b = questions[turn - 1]
                messages.append({"role": "user", "content": f"val1 = {a}\nval2 = {b}"})
            for _ in range(4):
                reply = await chat_completion(messages, tools=[MULTIPLY])
                messages.append(reply)
                calls = reply.get("tool_calls") or []
                if not calls:
                    break
                for call in calls:
                    args = json.loads(call["function"]["arguments"])
                    product = float(args["a"]) * float(args["b"])
                    content = str(int(product)) if product.is_integer() else str(product)
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        return messages


class LastAnswer(Grader):
    async def grade(self, ctx: GraderContext) -> float:
        return 1.0 if ctx.sample.last_text().rstrip().endswith(f"#### {ctx.label}") else 0.0
