"""One rollout's conversation as one token sequence: each call's prompt ids extend an earlier call's.

A later call's prompt is the earlier call's prompt ids, its generated ids, and the rendering of only
the messages after the assistant message the gateway returned (:meth:`ChatRenderer.continuation`):
the engine sees one growing sequence, so the trainer's prefix stitching never breaks, whatever the
template does to the history when it renders it whole (strip past ``<think>`` blocks, reformat tool
calls). When the request does not extend an earlier call's conversation (the agent edited, dropped
or reordered a message, changed the tools or the template's options, or wrote an assistant message
itself) or the template cannot render a piece on its own, the whole conversation is rendered
instead and the call says why (``render_reason``): never a guess."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from osmosis_gateway.token_in.render import ChatRenderer, CloseMismatch, TemplateError

__all__ = ["Conversation", "Rendered", "Turn"]


def _text(content: Any) -> str:
    """A message's content as text (a list of text parts joined; None as empty)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _arguments(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text


def same_message(message: Any) -> Any:
    """What two sendings of one message share: its role, its text, its tool calls' names and
    arguments (as JSON values: re-serialised arguments are the same call), a tool answer's call id;
    not the spelling of its content (a string or text parts, None or empty)."""
    if not isinstance(message, dict):
        return message
    calls = [
        (f.get("name"), _arguments(f.get("arguments")))
        for call in message.get("tool_calls") or []
        if isinstance(call, dict) and isinstance(f := call.get("function"), dict)
    ]
    return (message.get("role"), _text(message.get("content")), calls, message.get("tool_call_id"))


@attrs.define
class Turn:
    """An answered call: the conversation it was sent, and the ids of its prompt and its answer."""

    messages: list[Any]
    """The request's messages, as :func:`same_message` compares them."""
    tools: str
    """The request's tools and template options, as JSON text."""
    reply: Any
    """The assistant message the gateway returned, compared so."""
    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    """(The traced call's own arrays: the conversation holds no copy of them.)"""
    call_index: int
    """The call's index in the rollout (``TraceCall.index``)."""
    finish_reason: str = "stop"
    stop_id: int | None = None
    """The id that ended the answer (:meth:`ChatRenderer.stop_id`), None when none did."""


@attrs.frozen
class Rendered:
    """A call's prompt ids and how they were made."""

    prompt_ids: list[int]
    mode: str
    """``incremental`` (an earlier call's ids + its answer + the new messages) or ``full``."""
    reason: str | None = None
    """Why a later call was rendered whole (None for the first call and for incremental ones)."""
    extends: int | None = None
    """The index of the call it extends (``TraceCall.index``)."""
    note: str | None = None
    """What an incremental prompt added that the engine did not generate (the close of a turn cut by length)."""


def _tools_key(tools: Any) -> str:
    return json.dumps(tools, sort_keys=True, ensure_ascii=False)


def _first_difference(earlier: list[Any], now: list[Any]) -> int:
    return next((i for i, (a, b) in enumerate(zip(earlier, now, strict=False)) if a != b), min(len(earlier), len(now)))


class Conversation:
    """The answered calls of one rollout, and the prompt ids of its next one."""

    __slots__ = ("turns",)

    def __init__(self) -> None:
        self.turns: list[Turn] = []

    def prompt(
        self,
        renderer: ChatRenderer,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Rendered, list[Any], str]:
        """The prompt of a call sending ``messages`` (and ``tools``, and the template's ``options``),
        with the compared form of its messages and its tools and options (for :meth:`answered`).

        :raises TemplateError: the template refused the whole conversation.
        """
        seen = [same_message(m) for m in messages]
        tools_key = _tools_key([tools, options or None])
        reason = None
        for index in range(len(self.turns) - 1, -1, -1):
            turn = self.turns[index]
            n = len(turn.messages)
            if tools_key != turn.tools or seen[:n] != turn.messages or len(seen) <= n + 1 or seen[n] != turn.reply:
                continue
            new = messages[n + 1 :]
            if any(m.get("role") == "assistant" for m in new):
                reason = f"an assistant message follows call {turn.call_index}'s answer that the policy did not write"
                break
            try:
                ids = renderer.continuation(turn.stop_id, turn.finish_reason, new, tools, options)
            except CloseMismatch as exc:
                reason = f"call {turn.call_index}'s answer did not end as the template closes an assistant turn: {exc}"
                break
            except TemplateError as exc:
                reason = f"the messages after call {turn.call_index}'s answer cannot be rendered alone: {exc}"
                break
            note = None
            if turn.finish_reason == "length":
                note = f"call {turn.call_index}'s answer was cut by length: the template's close of its turn follows it"
            prompt = [*turn.prompt_ids, *turn.completion_ids, *ids]
            return Rendered(prompt, "incremental", None, turn.call_index, note), seen, tools_key
        if reason is None and self.turns:
            last = self.turns[-1]
            if tools_key != last.tools:
                reason = "the tools or the template's options differ from the earlier calls'"
            else:
                history = [*last.messages, last.reply]
                at = _first_difference(history, seen)
                if at < len(history) and at < len(seen):
                    reason = f"message {at} differs from what the earlier calls sent and received"
                else:
                    reason = "the messages do not extend an earlier call's conversation and its answer"
        return Rendered(renderer.prompt_ids(messages, tools, options), "full", reason), seen, tools_key

    def answered(
        self,
        seen: list[Any],
        tools_key: str,
        reply: dict[str, Any],
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        call_index: int,
        *,
        finish_reason: str,
        stop_id: int | None,
    ) -> None:
        """Record an answered call (a later one may extend it): how its answer ended too
        (``finish_reason``, the engine's; ``stop_id``, :meth:`ChatRenderer.stop_id`)."""
        reply_key = same_message(reply)
        turn = Turn(seen, tools_key, reply_key, prompt_ids, completion_ids, call_index, finish_reason, stop_id)
        self.turns.append(turn)
