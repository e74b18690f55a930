"""A gateway's token-in upstream: a chat-completions request turned into the engine's token-id
request, and the engine's answer into a chat completion (the I/O is :class:`~osmosis_gateway.call.ModelCall`'s)."""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from osmosis_gateway.token_in.conversation import Conversation, Rendered
from osmosis_gateway.token_in.engines import (
    ENGINES,
    EngineAnswer,
    EngineName,
    engine_request,
    engine_root,
    read_engine_answer,
    room_for,
    sampling_of,
)
from osmosis_gateway.token_in.parse import ParsedReply, ToolParser, ToolParserName, load_tool_parser, parse_reply
from osmosis_gateway.token_in.render import ChatRenderer

__all__ = ["ContextFull", "Prepared", "Reply", "TokenIn", "tool_choice_notes"]


class ContextFull(ValueError):
    """The call's prompt alone fills the server's context (``context_length``): nothing is left to generate."""


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    """A message as a template reads it (as vLLM's chat route hands it over): content given as text
    parts joined into one string, tool-call arguments given as JSON text read into an object."""
    content = message.get("content")
    calls = message.get("tool_calls")
    if (
        not (isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content))
        and not calls
    ):
        return message
    message = dict(message)
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        message["content"] = "".join(str(p.get("text", "")) for p in content)
    if isinstance(calls, list):
        message["tool_calls"] = [_call_for_template(call) for call in calls]
    return message


def _call_for_template(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    if not isinstance(arguments, dict):
        return call
    return {**call, "function": {**function, "arguments": arguments}}


@attrs.frozen
class Prepared:
    """One call's engine request and how its prompt was made."""

    body: dict[str, Any]
    rendered: Rendered
    seen: list[Any]
    tools_key: str
    capped: tuple[int, int] | None = None
    """The cap the call asked for and the one it was sent with, when ``context_length`` lowered it."""


@attrs.frozen
class Reply:
    """The engine's answer to one call and the assistant turn read out of it."""

    answer: EngineAnswer
    parsed: ParsedReply
    stop_id: int | None
    """The id that ended the generation (not text; :meth:`ChatRenderer.stop_id`)."""
    notes: dict[str, Any] = attrs.field(factory=dict)
    """What the call's trace says about the tool calls beyond their count (``tool_choice``, unknown tools)."""


def _function_name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def tool_choice_notes(
    tool_choice: Any, tools: Sequence[Mapping[str, Any]], calls: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """What a call's trace records about its parsed ``calls`` against the request: a ``tool_choice``
    of ``required`` or a named function (the gateway parses the text as generated: only constrained
    decoding could enforce either), whether the answer met it; calls naming a tool the request did
    not offer (kept, not dropped)."""
    notes: dict[str, Any] = {}
    names = [_function_name(call) for call in calls]
    wanted = _function_name(tool_choice) if isinstance(tool_choice, dict) else None
    if tool_choice == "required" or wanted is not None:
        met = bool(calls) if wanted is None else bool(calls) and all(n == wanted for n in names)
        notes["tool_choice_not_enforced"] = {"tool_choice": wanted or "required", "met": met}
    offered = {_function_name(tool) for tool in tools}
    unknown = sorted({n for n in names if n is not None and n not in offered})
    if unknown:
        notes["unknown_tools"] = unknown
    return notes


class TokenIn:
    """How a gateway talks to a token-in engine: the policy's renderer and tool parser, the route.

    :param engine: ``sglang-generate``, ``vllm-completions`` or ``trl-generate`` (:mod:`.engines`).
    :param tokenizer: the policy's tokenizer folder.
    :param chat_template: a ``.jinja`` file replacing the folder's template.
    :param tool_parser: ``hermes``, ``llama3_json``, ``mistral``, or the import path of a parser of
        the model's own format, ``"package.module:function"`` (:mod:`.parse`).
    :param context_length: the engine's context length (its ``--context-length``, vLLM's
        ``--max-model-len``): each call's cap is clamped to what its prompt leaves of it, and a call
        whose prompt alone fills it is refused.
    :raises ValueError: an unknown engine or parser, a bad ``context_length``; a folder that cannot
        serve (named).
    :raises ImportError: ``tokenizers`` or ``jinja2`` is not installed (``osmosis-gateway[token-in]``).
    """

    __slots__ = ("_parse", "context_length", "engine", "renderer", "tool_parser")

    def __init__(
        self,
        engine: EngineName,
        tokenizer: str | Path,
        *,
        chat_template: str | Path | None = None,
        tool_parser: ToolParserName | str = "hermes",
        context_length: int | None = None,
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"a token-in engine is one of {', '.join(ENGINES)}, got {engine!r}")
        if context_length is not None and (type(context_length) is not int or context_length < 2):
            raise ValueError(f"context_length is a whole number of tokens >= 2, got {context_length!r}")
        self.context_length = context_length
        """The server's context (prompt and generation), in tokens: each call's cap is clamped to what
        its prompt leaves (None: not known, the cap goes as set)."""
        missing = [name for name in ("tokenizers", "jinja2") if importlib.util.find_spec(name) is None]
        if missing:
            raise ImportError(
                f"the token-in adapter {engine} renders with tokenizers and jinja2, and {' and '.join(missing)} "
                "is not installed: pip install 'osmosis-gateway[token-in]'"
            )
        self._parse: ToolParserName | ToolParser = load_tool_parser(tool_parser)
        self.engine: EngineName = engine
        self.tool_parser: str = tool_parser
        """The parser's name (a format's, or an import path)."""
        self.renderer = ChatRenderer(tokenizer, chat_template)

    def url(self, base_url: str) -> str:
        """The engine route's URL under the policy's ``base_url``."""
        return engine_root(base_url) + ENGINES[self.engine]

    def prepare(self, conversation: Conversation, request: dict[str, Any], request_id: str, model: str) -> Prepared:
        """The engine request for a chat-completions ``request`` (messages and tools decoded, the
        trainer's sampling already set on it).

        :raises ValueError: not a request the gateway can render (``n`` > 1, messages that are not
            objects); :class:`~.render.TemplateError`: the template refused it; :class:`ContextFull`:
            its prompt alone fills ``context_length``.
        """
        messages = request.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of objects")
        tools = request.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ValueError("tools must be a list")
        if request.get("n") not in (None, 1):
            raise ValueError("a token-in policy answers one choice per call (n=1); ask for more rollouts instead")
        options = request.get("chat_template_kwargs")
        if options is not None and not isinstance(options, dict):
            raise ValueError("chat_template_kwargs must be an object")
        messages = [_for_template(m) for m in messages]
        rendered, seen, tools_key = conversation.prompt(self.renderer, messages, tools or None, options)
        sampling = sampling_of(request)
        capped = None
        if self.context_length is not None:
            room = room_for(self.engine, self.context_length, len(rendered.prompt_ids))
            if room < 1:
                raise ContextFull(
                    f"the prompt is {len(rendered.prompt_ids)} tokens and fills the server's context_length "
                    f"({self.context_length}): nothing is left to generate"
                )
            if sampling["max_tokens"] > room:
                capped = (sampling["max_tokens"], room)
                sampling["max_tokens"] = room
        body = engine_request(self.engine, rendered.prompt_ids, sampling, request_id, model)
        return Prepared(body, rendered, seen, tools_key, capped)

    def reply(self, doc: Any, request: Mapping[str, Any]) -> Reply:
        """The engine's answer ``doc`` and the assistant turn its generated ids hold, for the chat
        ``request`` it answers: tool calls are read only when the request offers tools and its
        ``tool_choice`` is not ``none`` (as vLLM does; a parser of a model's own format is given the
        tools); the id that stopped the generation is not text.

        :raises ValueError: ``doc`` is not the engine's answer.
        """
        answer = read_engine_answer(self.engine, doc)
        stop = self.renderer.stop_id(answer.token_ids, answer.finish_reason, answer.matched)
        text = self.renderer.decode(answer.token_ids, stop)
        tools = request.get("tools") or ()
        choice = request.get("tool_choice")
        if not tools or choice == "none":
            return Reply(answer, ParsedReply(text), stop)
        parsed = parse_reply(text, self._parse, tools)
        return Reply(answer, parsed, stop, tool_choice_notes(choice, tools, parsed.tool_calls))

    def completion(
        self, answer: EngineAnswer, parsed: ParsedReply, *, prompt_tokens: int, model: str, request_id: str,
        logprobs: bool,
    ) -> dict[str, Any]:  # fmt: skip
        """The chat completion the rollout gets (with ``logprobs`` content when it asked): its finish
        reason ``tool_calls`` when it holds calls and the engine stopped, ``length`` whenever the
        engine cut it (as vLLM says: a trainer's truncation check must see it)."""
        finish = "tool_calls" if parsed.tool_calls and answer.finish_reason == "stop" else answer.finish_reason
        choice: dict[str, Any] = {"index": 0, "message": parsed.message(), "logprobs": None, "finish_reason": finish}
        if logprobs:
            token = self.renderer.tokenizer.id_to_token
            choice["logprobs"] = {
                "content": [
                    {"token": token(i) or "", "logprob": lp, "bytes": None, "top_logprobs": []}
                    for i, lp in zip(answer.token_ids, answer.logprobs, strict=True)
                ]
            }
        n = len(answer.token_ids)
        return {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n},
        }
