"""Chat-completions messages (what a dataset row's prompt is) as Strands history.

``OsmosisStrandsAgent(messages=ctx.prompt)`` takes the rollout's prompt as it comes, in the
OpenAI chat shape, and Strands wants its own content blocks; osmosis-ai's integration converted
them too. A system message becomes the agent's system prompt; a string content (or a list of
``{"type": "text"}`` parts) becomes text blocks; an assistant's ``tool_calls`` become ``toolUse``
blocks and a ``tool`` message a ``toolResult`` block in a user turn. Messages already in Strands'
shape pass through unchanged.

>>> history, system = strands_messages([
...     {"role": "system", "content": "Answer with #### <n>."},
...     {"role": "user", "content": "val1 = 6\\nval2 = 7"},
... ])
>>> system, history
('Answer with #### <n>.', [{'role': 'user', 'content': [{'text': 'val1 = 6\\nval2 = 7'}]}])
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["strands_messages"]


def _text_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}]
    if isinstance(content, list):
        blocks = []
        for part in content:
            if isinstance(part, str):
                blocks.append({"text": part})
            elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                blocks.append({"text": part["text"]})
            elif isinstance(part, Mapping) and "type" not in part:
                blocks.append(dict(part))  # already a Strands content block
            else:
                raise ValueError(f"{where}: a content part Strands cannot take: {part!r}")
        return blocks
    raise ValueError(f"{where}: content must be a string or a list of parts, got {type(content).__name__}")


def _tool_use(call: Mapping[str, Any], where: str) -> dict[str, Any]:
    function = call.get("function") or {}
    raw = function.get("arguments") or "{}"
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except ValueError:
        raise ValueError(f"{where}: tool call arguments are not JSON: {raw!r}") from None
    return {"toolUse": {"toolUseId": call.get("id"), "name": function.get("name"), "input": arguments}}


def strands_messages(messages: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """``(history, system_prompt)`` for chat-completions ``messages`` (see the module docstring).

    :raises ValueError: a message or part that has no Strands form, naming it by position.
    """
    history: list[dict[str, Any]] = []
    system: list[str] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            system.extend(block["text"] for block in _text_blocks(content, where) if "text" in block)
        elif role == "tool":
            result = {"toolUseId": message.get("tool_call_id"), "status": "success"}
            history.append(
                {"role": "user", "content": [{"toolResult": {**result, "content": _text_blocks(content, where)}}]}
            )
        elif role in ("user", "assistant"):
            blocks = _text_blocks(content, where)
            blocks += [_tool_use(call, where) for call in message.get("tool_calls") or []]
            history.append({"role": role, "content": blocks})
        else:
            raise ValueError(f"{where}: a {role!r} message has no Strands form (system, user, assistant or tool)")
    return history, "\n\n".join(system) if system else None
