"""file_agent: a tool-calling agent that can write files, for dataset-mode tasks (tests).

The workflow offers the policy a ``write_file`` tool, runs its calls in the trial's working folder
and stops at the first answer without a tool call. :func:`script` is the scripted "model" the
tests serve: it asks to write the file the instruction names ("Create the file P containing the
word W"), then answers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from osmosis_core import AgentWorkflow, AgentWorkflowContext, RolloutSample, chat_completion

WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write text to a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}


class FileAgent(AgentWorkflow):
    """Ask the policy, run its write_file calls, repeat until it answers."""

    async def run(self, ctx: AgentWorkflowContext) -> RolloutSample:
        messages: list[dict[str, Any]] = list(ctx.prompt)
        for _ in range(4):
            reply = await chat_completion(messages, tools=[WRITE_FILE])
            messages.append(reply)
            calls = reply.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                args = json.loads(call["function"]["arguments"])
                Path(args["path"]).write_text(args["content"] + "\n")
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"wrote {args['path']}"})
        return RolloutSample(messages=messages)


_ASK = re.compile(r"Create the file (\S+) containing the word (\w+)")


def script(request: dict[str, Any]) -> Any:
    """The scripted policy: one write_file call for the instruction's file, then a final answer."""
    from osmosis_core.testing import Reply, ToolCall

    messages = request.get("messages") or []
    if messages and messages[-1].get("role") == "tool":
        return Reply(content="Done.")
    users = [m for m in messages if m.get("role") == "user"]
    match = _ASK.search(str(users[-1].get("content") if users else ""))
    if match is None:
        return Reply(content="I cannot do that.")
    return Reply(tool_calls=[ToolCall("write_file", {"path": match.group(1), "content": match.group(2)})])
