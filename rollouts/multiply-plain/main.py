"""multiply-plain: a tool-calling agent in plain Python, no agent framework.

The workflow sends the conversation to the rollout's policy endpoint (chat completions through
``osmosis_core.chat_completion``), runs the ``multiply`` tool whenever the model
calls it, and stops at the first answer without a tool call. The sample is the full message
history. The grader gives 1.0 when the last message ends with ``#### <number>`` equal to the
row's ``ground_truth``.

Run it with the run config that names this folder (``osmosis run configs/eval/multiply-plain.toml
--stub-policy``); a run config may also name a registered grader (``grader = "exact-match"``, from
osmosis-graders) instead of ``MultiplyGrader``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from osmosis_core import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    RolloutSample,
    chat_completion,
)

MULTIPLY_TOOL = {
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


def multiply(a: float, b: float) -> float:
    """The tool the agent may call."""
    return a * b


def run_tool(name: str, raw_arguments: str) -> str:
    """Run one tool call; errors go back to the model as the tool's answer."""
    if name != "multiply":
        return f"error: unknown tool {name!r}"
    try:
        args = json.loads(raw_arguments or "{}")
        product = multiply(float(args["a"]), float(args["b"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: bad arguments for multiply: {exc}"
    return str(int(product)) if product.is_integer() else str(product)


@attrs.define(kw_only=True)
class MultiplyConfig(AgentWorkflowConfig):
    """Settings, overridable from the run config's [rollout.workflow_config] table."""

    max_turns: int = 6
    temperature: float = 1.0
    max_tokens: int = 1024


class MultiplyWorkflow(AgentWorkflow[MultiplyConfig]):
    """Ask the policy, run its tool calls, repeat until it answers."""

    config_type = MultiplyConfig

    async def run(self, ctx: AgentWorkflowContext[MultiplyConfig]) -> RolloutSample:
        messages: list[dict[str, Any]] = list(ctx.prompt)
        turns = 0
        for turns in range(1, ctx.config.max_turns + 1):  # noqa: B007 - reported as a metric
            reply = await chat_completion(
                messages,
                tools=[MULTIPLY_TOOL],
                temperature=ctx.config.temperature,
                max_tokens=ctx.config.max_tokens,
            )
            messages.append(reply)
            calls = reply.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                if not call.get("id"):
                    raise ValueError("the model sent a tool call without an id")
                function = call.get("function") or {}
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "content": run_tool(function.get("name", ""), function.get("arguments", "")),
                    }
                )
        return RolloutSample(messages=messages, metrics={"turns": turns})


ANSWER = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


class MultiplyGrader(Grader):
    """1.0 when the final ``#### <number>`` matches ground_truth (within 1e-6), else 0.0."""

    async def grade(self, ctx: GraderContext) -> float:
        match = ANSWER.search(ctx.sample.last_text())
        if match is None:
            return 0.0
        answer = float(match.group(1).replace(",", ""))
        return 1.0 if abs(answer - float(ctx.label)) <= 1e-6 * max(1.0, abs(answer)) else 0.0


def __getattr__(name: str) -> object:
    """``app``: this rollout as a rollout server for a trainer (``pip install osmosis-server``, then
    ``uvicorn main:app`` from this folder). Made on first use, so ``osmosis run`` never needs it."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from osmosis_core import LocalBackend
    from osmosis_server import create_app

    app = globals()["app"] = create_app(LocalBackend(MultiplyWorkflow, grader=MultiplyGrader))
    return app
