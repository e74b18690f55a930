"""Tool calls read out of the text a policy generated, in the formats models are trained on.

* ``hermes`` (Qwen 2.5/3, Hermes, most open models): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  one block per call (a last one left open when its JSON is whole, as vLLM reads it), text around
  them the message's content; only the text after the last ``</think>`` is read for calls.
* ``llama3_json`` (Llama 3.1-3.3): the whole answer is a JSON object ``{"name": ..., "parameters": {...}}``
  (after an optional ``<|python_tag|>``), several separated by ``;``.
* ``mistral``: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}`` (v3 tokenizers), or
  ``name[ARGS]{...}`` per call (v11+); text before it the content.

What cannot be read as the format's calls (broken JSON, a call without a name, a block not
closed before more text) is never guessed at: the whole text reaches the rollout as a plain assistant message and the
reason is returned (the gateway counts it on the traced call).

A model with a format of its own gets a parser of its own, named by import path
(``tool_parser = "my_package.parsers:parse"``, as vLLM's ``--tool-parser-plugin``): a function
``(text, tools) -> (content, tool_calls)`` (a :data:`ToolParser`) given the generated text and the
request's tools; a ``ValueError`` it raises, or an answer not of that shape, is a malformed reply::

    def parse(text: str, tools: list[dict]) -> tuple[str | None, list[dict]]:
        head, sep, arguments = text.partition("<call>")
        if not sep:
            return text, []
        name = tools[0]["function"]["name"]
        return head or None, [{"type": "function", "function": {"name": name, "arguments": arguments}}]
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

import attrs

__all__ = ["TOOL_PARSERS", "ParsedReply", "ToolParser", "ToolParserName", "load_tool_parser", "parse_reply"]

ToolParserName = Literal["hermes", "llama3_json", "mistral"]
TOOL_PARSERS: Final = ("hermes", "llama3_json", "mistral")
ToolParser = Callable[[str, Sequence[Mapping[str, Any]]], tuple[str | None, list[dict[str, Any]]]]
"""A parser of a format of its own: ``(generated text, the request's tools) -> (content, tool calls)``,
the calls in OpenAI's shape (``{"function": {"name", "arguments": "<JSON text>"}}``; ``id`` and
``type`` are filled in when missing)."""

_HERMES_OPEN: Final = "<tool_call>"
_HERMES_CLOSE: Final = "</tool_call>"
_THINK_END: Final = "</think>"
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


def _hermes_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """The ``<tool_call>`` blocks of ``text`` (after any reasoning) and the text around them. Each
    block's JSON is read as JSON (a ``</tool_call>`` inside an argument's string does not end it);
    a last block left open is a call when its JSON is whole and nothing follows it (vLLM's
    ``<tool_call>(.*?)</tool_call>|<tool_call>(.*)``: a stop on ``</tool_call>`` leaves it off).

    :raises ValueError: a block's JSON is broken, or text follows it without ``</tool_call>``.
    """
    decoder = json.JSONDecoder()
    calls: list[dict[str, Any]] = []
    pieces: list[str] = []
    at = 0
    while (start := text.find(_HERMES_OPEN, at)) >= 0:
        pieces.append(text[at:start])
        begin = _skip_space(text, start + len(_HERMES_OPEN))
        value, end = decoder.raw_decode(text, begin)
        end = _skip_space(text, end)
        if text.startswith(_HERMES_CLOSE, end):
            at = end + len(_HERMES_CLOSE)
        elif end == len(text):
            at = end
        else:
            raise ValueError("a <tool_call> block is not closed")
        calls.append(_call(value, "hermes"))
    rest = "".join([*pieces, text[at:]])
    if _HERMES_CLOSE in rest:
        raise ValueError("a </tool_call> has no <tool_call>")
    return rest, calls


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _hermes(text: str) -> ParsedReply:
    """Calls are read after the last ``</think>`` only: a ``<tool_call>`` a model mentions while it
    reasons is not a call (the reasoning stays in the content, as it was generated)."""
    cut = text.rfind(_THINK_END)
    thought, answer = ("", text) if cut < 0 else (text[: cut + len(_THINK_END)], text[cut + len(_THINK_END) :])
    if _HERMES_OPEN not in answer and _HERMES_CLOSE not in answer:
        return ParsedReply(text)
    rest, calls = _hermes_calls(answer)
    return ParsedReply(_content(thought + rest), calls)


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


def load_tool_parser(name: str) -> ToolParserName | ToolParser:
    """``name`` as :func:`parse_reply` takes it: one of :data:`TOOL_PARSERS`, or the function an
    import path ``"package.module:function"`` names (imported now).

    :raises ValueError: neither (the message says which and why).
    """
    if name in TOOL_PARSERS:
        return name  # type: ignore[return-value]  # (one of TOOL_PARSERS)
    if ":" not in name:
        raise ValueError(
            f"tool_parser must be one of {', '.join(TOOL_PARSERS)} or an import path 'package.module:function', "
            f"got {name!r}"
        )
    from osmosis_core.plugin import load_object

    try:
        found = load_object(name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"tool_parser {name!r} cannot be imported: {type(exc).__name__}: {exc}") from None
    if not callable(found):
        raise ValueError(f"tool_parser {name!r} is a {type(found).__name__}, not a function (text, tools)")
    parser: ToolParser = found
    return parser


def _custom(read: ToolParser, text: str, tools: Sequence[Mapping[str, Any]]) -> ParsedReply:
    """What a parser of a format of its own read, checked.

    :raises ValueError: it raised one, or its answer is not ``(content, tool calls)``."""
    answer = read(text, tools)
    if not (isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], list)):
        raise ValueError(f"the parser returned {type(answer).__name__}, not (content, tool_calls)")
    content, found = answer
    if content is not None and not isinstance(content, str):
        raise ValueError(f"the parser's content is {type(content).__name__}, not text")
    calls = []
    for call in found:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name or not isinstance(arguments, str):
            raise ValueError(f"a tool call is not {{'function': {{'name': str, 'arguments': str}}}}: {call!r:.200}")
        call_id = call.get("id")
        calls.append({"id": call_id if isinstance(call_id, str) and call_id else _call_id("hermes"),
                      "type": "function", "function": {"name": name, "arguments": arguments}})  # fmt: skip
    return ParsedReply(content, calls)


def parse_reply(text: str, parser: ToolParserName | ToolParser, tools: Sequence[Mapping[str, Any]] = ()) -> ParsedReply:
    """The assistant turn ``text`` holds: its tool calls in ``parser``'s format and the text around
    them; the whole text as content, and why, when the calls cannot be read.

    :param parser: one of :data:`TOOL_PARSERS`, or a :data:`ToolParser` (given ``tools``, the
        request's).
    :raises ValueError: ``parser`` is neither.
    """
    if callable(parser):
        try:
            return _custom(parser, text, tools)
        except Exception as exc:  # (a parser of the user's: whatever it raises, the rollout gets the text)
            name = (
                f"{getattr(parser, '__module__', None) or '?'}.{getattr(parser, '__qualname__', type(parser).__name__)}"
            )
            return ParsedReply(_content(text), malformed=f"{name} cannot read the tool calls: {exc}")
    read = _PARSERS.get(parser)
    if read is None:
        raise ValueError(f"tool_parser must be one of {', '.join(TOOL_PARSERS)}, got {parser!r}")
    try:
        return read(text)
    except (ValueError, RecursionError) as exc:  # (json's JSONDecodeError is a ValueError)
        return ParsedReply(_content(text), malformed=f"{parser} tool calls cannot be read: {exc}")
