"""Tool calls read out of the text a policy generated, in the formats models are trained on.

* ``hermes`` (Qwen 2.5/3, Hermes, most open models): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  one block per call, text around them the message's content.
* ``llama3_json`` (Llama 3.1-3.3): the whole answer is a JSON object ``{"name": ..., "parameters": {...}}``
  (after an optional ``<|python_tag|>``), several separated by ``;``.
* ``mistral``: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}`` (v3 tokenizers), or
  ``name[ARGS]{...}`` per call (v11+); text before it the content.

What cannot be read as the format's calls (broken JSON, a call without a name, a block never
closed) is never guessed at: the whole text reaches the rollout as a plain assistant message and the
reason is returned (the gateway counts it on the traced call).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from typing import Any, Final, Literal

import attrs

__all__ = ["TOOL_PARSERS", "ParsedReply", "ToolParserName", "parse_reply"]

ToolParserName = Literal["hermes", "llama3_json", "mistral"]
TOOL_PARSERS: Final = ("hermes", "llama3_json", "mistral")

_HERMES: Final = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_PYTHON_TAG: Final = "<|python_tag|>"
_MISTRAL: Final = "[TOOL_CALLS]"
_MISTRAL_ARGS: Final = "[ARGS]"
_MISTRAL_CALL_ID: Final = "[CALL_ID]"
_ALNUM: Final = string.ascii_letters + string.digits


@attrs.frozen
class ParsedReply:
    """An assistant turn as the rollout gets it."""

    content: str | None
    tool_calls: list[dict[str, Any]] = attrs.field(factory=list)
    """OpenAI-shaped: ``{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}``."""
    malformed: str | None = None
    """Why the text's tool calls could not be read (then ``content`` is the whole text, no calls)."""

    def message(self) -> dict[str, Any]:
        """The assistant message of a chat completion."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def _call_id(parser: ToolParserName) -> str:
    if parser == "mistral":  # (Mistral's templates refuse an id that is not 9 letters and digits)
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return "call_" + secrets.token_hex(12)


def _call(item: Any, parser: ToolParserName, *, arguments_key: str = "arguments") -> dict[str, Any]:
    """One OpenAI tool call from a parsed ``{"name", "arguments"}`` object.

    :raises ValueError: not such an object.
    """
    if not isinstance(item, dict):
        raise ValueError(f"a tool call is a JSON object, got {type(item).__name__}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call has no name")
    arguments = item.get(arguments_key, item.get("arguments", {}))
    if isinstance(arguments, str):  # (some models write the arguments as JSON text)
        arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments of {name!r} are not a JSON object")
    text = json.dumps(arguments, ensure_ascii=False)
    return {"id": _call_id(parser), "type": "function", "function": {"name": name, "arguments": text}}


def _content(text: str) -> str | None:
    text = text.strip()
    return text or None


def _hermes(text: str) -> ParsedReply:
    if "<tool_call>" not in text:
        return ParsedReply(text)
    calls = []
    for match in _HERMES.finditer(text):
        calls.append(_call(json.loads(match.group(1)), "hermes"))
    rest = _HERMES.sub("", text)
    if "<tool_call>" in rest or "</tool_call>" in rest:
        raise ValueError("a <tool_call> block is not closed")
    return ParsedReply(_content(rest), calls)


def _json_objects(text: str) -> list[Any]:
    """The JSON values of ``text``, one after another, separated by ``;`` or whitespace."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    at = 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
        if at == len(text):
            return values
        value, at = decoder.raw_decode(text, at)
        values.append(value)


def _llama3(text: str) -> ParsedReply:
    body = text.strip()
    tagged = body.startswith(_PYTHON_TAG)
    body = body.removeprefix(_PYTHON_TAG).strip()
    if not tagged and not body.startswith("{"):
        return ParsedReply(text)
    return ParsedReply(None, [_call(v, "llama3_json", arguments_key="parameters") for v in _json_objects(body)])


def _mistral(text: str) -> ParsedReply:
    before, marker, after = text.partition(_MISTRAL)
    if not marker:
        return ParsedReply(text)
    calls: list[dict[str, Any]] = []
    for part in after.split(_MISTRAL):
        part = part.strip()
        if part.startswith("["):  # v3: a JSON array of calls
            items = json.loads(part)
            if not isinstance(items, list):
                raise ValueError("[TOOL_CALLS] is not followed by a list")
            calls.extend(_call(item, "mistral") for item in items)
            continue
        name, args, arguments = part.partition(_MISTRAL_ARGS)  # v11: name[ARGS]{...}
        if not args:
            raise ValueError("[TOOL_CALLS] is followed by neither a JSON list nor name[ARGS]{...}")
        name = name.partition(_MISTRAL_CALL_ID)[0].strip()
        calls.append(_call({"name": name, "arguments": json.loads(arguments)}, "mistral"))
    return ParsedReply(_content(before), calls)


_PARSERS: Final = {"hermes": _hermes, "llama3_json": _llama3, "mistral": _mistral}


def parse_reply(text: str, parser: ToolParserName) -> ParsedReply:
    """The assistant turn ``text`` holds: its tool calls in ``parser``'s format and the text around
    them; the whole text as content, and why, when the calls cannot be read.

    :raises ValueError: ``parser`` is not one of :data:`TOOL_PARSERS`.
    """
    read = _PARSERS.get(parser)
    if read is None:
        raise ValueError(f"tool_parser must be one of {', '.join(TOOL_PARSERS)}, got {parser!r}")
    try:
        return read(text)
    except (ValueError, RecursionError) as exc:  # (json's JSONDecodeError is a ValueError)
        return ParsedReply(_content(text), malformed=f"{parser} tool calls cannot be read: {exc}")
