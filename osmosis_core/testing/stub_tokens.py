"""Token ids for the scripted policy server: it answers like vLLM when asked (``flavor="vllm"``).

A deterministic tokenizer of its own (words, single spaces and punctuation, each hashed to an id;
six special tokens) over a simple append-only chat template::

    <|im_start|>{role}\\n{content}<tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\\n

The prompt is the rendered conversation plus ``<|im_start|>assistant\\n``; the generated tokens are
the reply's content, its tool calls and ``<|im_end|>``. So a client that sends each answer back
unchanged finds every call's prompt + generation at the start of the next call's prompt, as with a
real append-only template. Tool-call arguments are rendered from their parsed JSON (as Qwen's
template does with ``tojson``), so a client that re-serialises them keeps the prefix.

``flavor="drifting"`` breaks that on purpose, as Qwen3's template does: every reply starts with a
``<think>...</think>`` block, and earlier assistant turns are rendered with it stripped.

The fields follow vLLM: ``return_token_ids`` gives the top-level ``prompt_token_ids`` and the
choice's ``token_ids``; ``logprobs`` gives ``logprobs.content`` entries (``"token_id:N"`` tokens
with ``return_tokens_as_token_ids``). Streaming: ``prompt_token_ids`` on the first chunk, each
chunk's ``token_ids`` and ``logprobs.content`` the delta. Nothing is tokenized unless asked.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any, Final, Literal

import attrs

from osmosis_core.records import message_text

__all__ = ["SPECIAL_TOKENS", "Flavor", "TokenAnswer", "encode", "logprob_of", "render_prompt", "token_answer"]

Flavor = Literal["openai", "vllm", "drifting"]
"""How the scripted server answers token requests: ``openai`` ignores them (text only), ``vllm``
answers them over an append-only template, ``drifting`` over a template that re-renders past turns."""

FLAVORS: Final = ("openai", "vllm", "drifting")

SPECIAL_TOKENS: Final[dict[str, int]] = {
    "<|im_start|>": 1,
    "<|im_end|>": 2,
    "<tool_call>": 3,
    "</tool_call>": 4,
    "<think>": 5,
    "</think>": 6,
}
_VOCAB: Final = 150_000
_FIRST_ID: Final = 100
_PIECE_RE: Final = re.compile(r"<\|im_start\|>|<\|im_end\|>|</?tool_call>|</?think>|\w+|\s|[^\w\s]")
_THINK_RE: Final = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
THINK_BLOCK: Final = "<think>\nI multiply the numbers.\n</think>\n"
"""What a drifting server's every reply starts with."""


def _piece_id(piece: str) -> int:
    special = SPECIAL_TOKENS.get(piece)
    if special is not None:
        return special
    return _FIRST_ID + zlib.crc32(piece.encode()) % _VOCAB


def encode(text: str) -> list[tuple[str, int]]:
    """``text`` as (piece, id) pairs; the pieces concatenate back to ``text``."""
    return [(piece, _piece_id(piece)) for piece in _PIECE_RE.findall(text)]


def logprob_of(position: int, token_id: int) -> float:
    """The deterministic log-probability of ``token_id`` generated at ``position`` (in (-2, 0))."""
    return -((token_id * 2654435761 + position * 40503) % 2000 + 1) / 1000.0


def _tool_call_text(name: str, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # malformed arguments are rendered as the string they are
    return json.dumps({"name": name, "arguments": arguments})


def _assistant_body(content: str, tool_calls: list[tuple[str, Any]]) -> str:
    return content + "".join(f"<tool_call>{_tool_call_text(n, a)}</tool_call>" for n, a in tool_calls)


def render_prompt(messages: list[Any], *, drifting: bool = False) -> list[int]:
    """The prompt's ids: every message rendered, then ``<|im_start|>assistant\\n``."""
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role") or "user")
        content = message_text(message)
        if role == "assistant":
            if drifting:
                content = _THINK_RE.sub("", content)  # as Qwen3 strips past reasoning
            calls = []
            for tc in message.get("tool_calls") or ():
                function = tc.get("function") if isinstance(tc, dict) else None
                if isinstance(function, dict):
                    calls.append((str(function.get("name")), function.get("arguments")))
            content = _assistant_body(content, calls)
        parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return [token_id for _, token_id in encode("".join(parts))]


@attrs.frozen
class TokenAnswer:
    """The token fields of one answer: what a request asked for, and the ids and logprobs to send."""

    prompt_ids: list[int]
    content: list[tuple[str, int]]
    """The content's (piece, id) pairs."""
    tool_calls: list[list[tuple[str, int]]]
    """Each tool call's (piece, id) pairs, ``<tool_call>`` to ``</tool_call>``."""
    end: list[tuple[str, int]]
    return_ids: bool
    logprobs: bool
    as_ids: bool

    @property
    def generated(self) -> list[tuple[str, int]]:
        """Every generated (piece, id), in order."""
        return [*self.content, *(p for call in self.tool_calls for p in call), *self.end]

    def fields(self, pairs: list[tuple[str, int]], start: int) -> dict[str, Any]:
        """The choice fields for ``pairs`` generated from position ``start`` (as asked)."""
        out: dict[str, Any] = {}
        if self.return_ids:
            out["token_ids"] = [token_id for _, token_id in pairs]
        if self.logprobs:
            entries = []
            for offset, (piece, token_id) in enumerate(pairs):
                token = f"token_id:{token_id}" if self.as_ids else piece
                entry = {"token": token, "logprob": logprob_of(start + offset, token_id)}
                entries.append({**entry, "bytes": list(piece.encode()), "top_logprobs": []})
            out["logprobs"] = {"content": entries}
        return out

    def decorate(self, doc: dict[str, Any]) -> None:
        """Add the token fields to a whole (non-streamed) completion document."""
        if self.return_ids:
            doc["prompt_token_ids"] = self.prompt_ids
        doc["choices"][0].update(self.fields(self.generated, 0))
        self.count(doc["usage"])

    def count(self, usage: dict[str, int]) -> None:
        """Real token counts in a ``usage`` object."""
        usage["prompt_tokens"] = len(self.prompt_ids)
        usage["completion_tokens"] = len(self.generated)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]


def token_answer(
    request: dict[str, Any], content: str | None, tool_calls: list[tuple[str, str]], flavor: str
) -> TokenAnswer | None:
    """The token fields a request asks for, or None (not asked, or a text-only flavour)."""
    if flavor == "openai":
        return None
    return_ids = request.get("return_token_ids") is True
    logprobs = request.get("logprobs") is True
    if not (return_ids or logprobs):
        return None
    messages = request.get("messages")
    prompt_ids = render_prompt(messages if isinstance(messages, list) else [], drifting=flavor == "drifting")
    calls = [encode(f"<tool_call>{_tool_call_text(name, args)}</tool_call>") for name, args in tool_calls]
    return TokenAnswer(
        prompt_ids=prompt_ids,
        content=encode(content or ""),
        tool_calls=calls,
        end=encode("<|im_end|>"),
        return_ids=return_ids,
        logprobs=logprobs,
        as_ids=request.get("return_tokens_as_token_ids") is True,
    )
