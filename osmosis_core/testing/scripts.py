"""Ready-made scripts for :class:`~osmosis_core.testing.policy_server.ScriptedPolicyServer`.

A script takes the parsed chat-completions request (``messages``, ``tools``, ...) and returns a
:class:`~osmosis_core.testing.policy_server.Reply`.

* :func:`calculator`: a rule-based stand-in for a model solving the "multiply" example, using the
  ``multiply`` tool when it is offered.
* :func:`echo`: answers with the last user message.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from osmosis_core.testing.policy_server import Reply, ToolCall

__all__ = ["calculator", "echo"]

_NUM: Final = r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)"

_VAL1_RE: Final = re.compile(rf"\bval1\s*[=:]\s*({_NUM})", re.IGNORECASE)
_VAL2_RE: Final = re.compile(rf"\bval2\s*[=:]\s*({_NUM})", re.IGNORECASE)
_PATTERNS: Final = (
    # "12 * 7", "12 x 7", "12 times 7", "12 multiplied by 7"
    re.compile(rf"(?<![\w.])({_NUM})\s*(?:\*|x|\u00d7|times|multiplied\s+by)\s*({_NUM})(?!\w)", re.IGNORECASE),
    # "multiply 12 and 7", "multiply 12 by 7", "product of 12 and 7"
    re.compile(rf"(?:multiply|product\s+of)\s+({_NUM})\s*(?:and|by|with|,)\s*({_NUM})", re.IGNORECASE),
)
# any standalone number: not glued to a word (so the "1" of "val1" is not one)
_STANDALONE_RE: Final = re.compile(rf"(?<![\w.])({_NUM})(?![\w])")

_NO_NUMBERS: Final = "I could not find two numbers to multiply.\n#### 0"


def _text(content: Any) -> str:
    """The text of a message ``content``: a string, or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return ""


def _messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, dict)]


def _last_user_index(messages: Sequence[dict[str, Any]]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def _number(text: str) -> int | float:
    if "." in text:
        return float(text)
    return int(text)


def _find_operands(text: str) -> tuple[int | float, int | float] | None:
    """The two numbers to multiply in ``text``, or None.

    Recognises ``val1 = 12`` / ``val2 = 7``, ``12 * 7``, ``12 x 7``, ``multiply 12 and 7``,
    ``What is 12 times 7?`` and, failing those, the first two standalone numbers.
    """
    v1, v2 = _VAL1_RE.search(text), _VAL2_RE.search(text)
    if v1 and v2:
        return _number(v1.group(1)), _number(v2.group(1))
    for pattern in _PATTERNS:
        match = pattern.search(text)
        if match:
            return _number(match.group(1)), _number(match.group(2))
    numbers = _STANDALONE_RE.findall(text)
    if len(numbers) >= 2:
        return _number(numbers[0]), _number(numbers[1])
    return None


def _format_number(value: int | float) -> str:
    """An int when integral, else the repr of the float."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer():
        return str(int(value))
    return repr(value)


def _offers_tool(request: dict[str, Any], name: str) -> bool:
    tools = request.get("tools")
    if not isinstance(tools, list):
        return False
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict) and function.get("name") == name:
            return True
        if tool.get("name") == name:  # flattened tool format
            return True
    return False


def _answer(result: str) -> Reply:
    return Reply(content=f"The product is {result}.\n#### {result}")


def calculator(request: dict[str, Any]) -> Reply:
    """A rule-based stand-in for a model solving the "multiply" example.

    * The last message is a tool result: answer ``The product is R.\\n#### R`` with R its content.
    * A ``multiply`` tool is offered and no tool result follows the last user message: call
      ``multiply({"a": x, "b": y})`` with the two numbers of the last user message.
    * Otherwise compute the product and answer the same way.
    * No two numbers found: ``I could not find two numbers to multiply.\\n#### 0``.
    """
    messages = _messages(request)
    if messages and messages[-1].get("role") == "tool":
        return _answer(_text(messages[-1].get("content")).strip())
    user = _last_user_index(messages)
    if user is None:
        return Reply(content=_NO_NUMBERS)
    operands = _find_operands(_text(messages[user].get("content")))
    if operands is None:
        return Reply(content=_NO_NUMBERS)
    a, b = operands
    tool_result_follows = any(m.get("role") == "tool" for m in messages[user + 1 :])
    if _offers_tool(request, "multiply") and not tool_result_follows:
        return Reply(tool_calls=(ToolCall("multiply", {"a": a, "b": b}),))
    return _answer(_format_number(a * b))


def echo(request: dict[str, Any]) -> Reply:
    """Answer with the content of the last user message (empty when there is none)."""
    messages = _messages(request)
    user = _last_user_index(messages)
    return Reply(content=_text(messages[user].get("content")) if user is not None else "")
