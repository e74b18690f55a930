"""shell_agent: a tool-calling agent that runs shell commands in its trial, for task-image tests.

The workflow offers the policy a ``run`` tool (``bash -c`` in the trial's working folder, output
returned) and stops at the first answer without a tool call. :func:`script` is the scripted "model"
the tests serve: it runs each line of the instruction that starts with ``Run:``, then answers; a
system prompt saying ``Do nothing.`` makes it answer at once.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

from osmosis_core import AgentWorkflow, AgentWorkflowContext, RolloutSample, chat_completion

RUN = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run a bash command in the working folder.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


class ShellAgent(AgentWorkflow):
    """Ask the policy, run its commands, repeat until it answers."""

    async def run(self, ctx: AgentWorkflowContext) -> RolloutSample:
        messages: list[dict[str, Any]] = list(ctx.prompt)
        for _ in range(8):
            reply = await chat_completion(messages, tools=[RUN])
            messages.append(reply)
            calls = reply.get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                command = json.loads(call["function"]["arguments"])["command"]
                done = await asyncio.to_thread(
                    subprocess.run, ["bash", "-c", command], capture_output=True, text=True, timeout=120
                )
                output = f"exit {done.returncode}\n{done.stdout}{done.stderr}"
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output[-4000:]})
        return RolloutSample(messages=messages)


def script(request: dict[str, Any]) -> Any:
    """The scripted policy: the instruction's ``Run:`` lines, one call each, in order; then an answer."""
    from osmosis_core.testing import Reply, ToolCall

    messages = request.get("messages") or []
    if any(m.get("role") == "system" and "Do nothing." in str(m.get("content")) for m in messages):
        return Reply(content="Nothing done.")
    users = [m for m in messages if m.get("role") == "user"]
    text = str(users[-1].get("content") if users else "")
    commands = [line.split("Run:", 1)[1].strip() for line in text.splitlines() if line.startswith("Run:")]
    done = sum(1 for m in messages if m.get("role") == "tool")
    if done >= len(commands):
        return Reply(content="Done.")
    return Reply(tool_calls=[ToolCall("run", {"command": commands[done]})])
