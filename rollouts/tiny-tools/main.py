"""tiny-tools: a two-turn tool-calling rollout that a tiny model learns on a CPU in minutes.

The workflow asks the policy with one tool, ``lookup``. When the answer calls it, the tool answers
with the row's letters (its ``hidden`` metadata) and the policy answers once more; an answer
without a call ends the rollout. The grader scores the final answer by the share of its
characters that are among the label's letters (``uvwxyz``: ``"vvxq"`` scores 0.75 of its worth). A
rollout that never called the tool is worth a tenth (0 to 0.1); one that called it is worth at least
that much (0.1 to 1): a reward above 0.1 takes the lookup, and no answer without one ever outscores
an answer with one (else a model that has learnt the letters can learn to skip the tool, score 0.1
on every rollout, and stop learning: no reward differs within a group).

So the model must learn two things, through the tool turn: to call the tool in its first answer
(one token, ``<tool_call>``, in :mod:`osmosis_trainer.tiny_model`'s chat template) and to answer
with the letters after the tool's message. It is the task of osmosis's CPU training test (a random
1M-parameter model, one token per character, trained with TRL's GRPO): the mean reward goes from
about 0.02 to above 0.5 in 10 to 35 steps, and the share of rollouts that call the tool from about
0.15 to most of them.

Train on it (``examples/train_trl.py`` runs all of this)::

    osmosis serve configs/training/tiny-tools.toml --traces      # the rollouts, with token traces
    python examples/train_trl.py                                  # TRL's GRPOTrainer + the tiny model
"""

from __future__ import annotations

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
    message_text,
)

LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up the letters in the box.",
        "parameters": {"type": "object", "properties": {}},
    },
}


@attrs.define(kw_only=True)
class TinyToolsConfig(AgentWorkflowConfig):
    """Settings, overridable from the run config's [rollout.workflow_config] table."""

    max_tokens: int = 16
    """Each answer's cap (a trainer's ``max_tokens`` overrides it)."""


class TinyToolsWorkflow(AgentWorkflow[TinyToolsConfig]):
    """Ask; run the lookup calls of the first answer; ask once more."""

    config_type = TinyToolsConfig

    async def run(self, ctx: AgentWorkflowContext[TinyToolsConfig]) -> RolloutSample:
        hidden = str(ctx.metadata.get("hidden") or "")
        if not hidden:
            raise ValueError("the row's metadata needs the 'hidden' letters the lookup tool returns")
        messages: list[dict[str, Any]] = list(ctx.prompt)
        reply = await chat_completion(messages, tools=[LOOKUP_TOOL], max_tokens=ctx.config.max_tokens)
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": hidden})
        if calls:
            messages.append(await chat_completion(messages, tools=[LOOKUP_TOOL], max_tokens=ctx.config.max_tokens))
        return RolloutSample(messages=messages, metrics={"tool_calls": len(calls)})


NOT_LOOKED_UP: float = 0.1
"""What a rollout that never called the tool is worth at most; one that called it is worth at least this."""


class TinyToolsGrader(Grader):
    """The share of the label's letters in the final answer, scaled to 0.1-1 with a lookup and 0-0.1 without.

    >>> import asyncio
    >>> from osmosis_core import GraderConfig
    >>> def grade(*messages: dict) -> float:
    ...     sample = RolloutSample(messages=[{"role": "user", "content": "Which letters?"}, *messages])
    ...     context = GraderContext(sample, "uvwxyz", sample.messages[:1], {}, GraderConfig())
    ...     return round(asyncio.run(TinyToolsGrader().grade(context)), 3)
    >>> grade({"role": "assistant", "content": "vvxq"})
    0.075
    >>> call = {"id": "1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    >>> grade({"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "uvwxyz"},
    ...       {"role": "assistant", "content": "vvxq"})
    0.775
    """

    async def grade(self, ctx: GraderContext) -> float:
        letters = set(str(ctx.label or ""))
        if not letters:
            raise ValueError("the row's label must be the letters to answer with (ground_truth)")
        messages = ctx.sample.messages
        answer = message_text(messages[-1]) if messages and messages[-1].get("role") == "assistant" else ""
        share = sum(character in letters for character in answer) / len(answer) if answer else 0.0
        looked_up = any(message.get("role") == "tool" for message in messages)
        return NOT_LOOKED_UP + (1 - NOT_LOOKED_UP) * share if looked_up else NOT_LOOKED_UP * share
