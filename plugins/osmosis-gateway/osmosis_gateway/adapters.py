"""Per-upstream adapters: what the gateway adds to a request to get tokens, and how it reads them.

* ``vllm``: ``logprobs=true``, ``top_logprobs=0``, ``return_token_ids=true`` (vLLM >= 0.10.2:
  top-level ``prompt_token_ids``, per-choice ``token_ids``), and ``return_tokens_as_token_ids``
  so the logprob entries name their ids (``"token_id:N"``): the fallback source of the generated
  ids on an older vLLM, and a cross-check on a newer one.
* ``sglang``: ``return_token_ids`` (per-choice ``prompt_token_ids`` and ``token_ids``) plus
  ``logprobs``; SGLang gives no ids when streaming, so a streamed call is asked for unstreamed and
  the gateway streams the whole answer to the rollout (:func:`completion_events`).
* ``openai``: nothing added (the OpenAI API refuses unknown fields); the trace holds text only.
* ``sglang-generate``, ``vllm-completions``, ``trl-generate``: token-in engines; the gateway renders
  the chat itself and sends ids (:mod:`osmosis_gateway.token_in`), none of the above applies.

What the gateway added is taken out of the answer again, streamed or not, so the rollout sees an
ordinary chat completion. When sources disagree, or the token and logprob lists differ in
length, the call's capture fails: the answer still goes to the rollout unchanged.
"""

from __future__ import annotations

import json
from array import array
from typing import Any, Final, Literal

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["ADAPTERS", "TOKEN_IN_ADAPTERS", "AdapterName", "CallCapture", "completion_events", "prepare_request"]

AdapterName = Literal["vllm", "sglang", "openai", "sglang-generate", "vllm-completions", "trl-generate"]
ADAPTERS: Final = ("vllm", "sglang", "openai", "sglang-generate", "vllm-completions", "trl-generate")
TOKEN_IN_ADAPTERS: Final = ("sglang-generate", "vllm-completions", "trl-generate")
"""The adapters whose upstream takes token ids (:mod:`osmosis_gateway.token_in`): the gateway renders."""

_TOKEN_ID_PREFIX: Final = "token_id:"
_ID_AT: Final = len(_TOKEN_ID_PREFIX)
_ID_TOKEN: Final = "token_id:{}".format
_NEXT_TOKEN_ID: Final = "," + _TOKEN_ID_PREFIX
_INT_TEXT: Final = b"0123456789-,"


class _Entry(msgspec.Struct, gc=False):
    """One ``logprobs.content`` entry: only what the capture reads (``bytes``, ``top_logprobs`` are skipped)."""

    token: str
    logprob: float


class _Logprobs(msgspec.Struct, gc=False):
    content: list[_Entry] | None = None


class _Answer(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    """An answer's (or a stream chunk's) top-level fields as vLLM writes them, in its order: each
    field's JSON text, the choices' fields too."""

    id: msgspec.Raw | UnsetType = UNSET
    object: msgspec.Raw | UnsetType = UNSET
    created: msgspec.Raw | UnsetType = UNSET
    model: msgspec.Raw | UnsetType = UNSET
    choices: list[dict[str, msgspec.Raw]] | UnsetType | None = UNSET
    service_tier: msgspec.Raw | UnsetType = UNSET
    system_fingerprint: msgspec.Raw | UnsetType = UNSET
    usage: msgspec.Raw | UnsetType = UNSET
    prompt_logprobs: msgspec.Raw | UnsetType = UNSET
    prompt_token_ids: msgspec.Raw | UnsetType = UNSET
    kv_transfer_params: msgspec.Raw | UnsetType = UNSET


# An answer is read as its fields' JSON text (msgspec.Raw) and only the fields the capture needs are
# decoded, into the types it expects: the logprob entries' other fields are never made into objects,
# and what the gateway takes out is dropped from the text without re-serialising the rest.
_ANSWER: Final = msgspec.json.Decoder(_Answer)
_TOP: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_CHOICES: Final = msgspec.json.Decoder(list[dict[str, msgspec.Raw]] | None)


def _fields(data: bytes) -> tuple[dict[str, msgspec.Raw], list[dict[str, msgspec.Raw]] | None]:
    """An answer's top-level fields and its choices' fields, as their JSON text (``top["choices"]``
    stays where it was, for the answer to be written back in its order).

    An answer as vLLM writes it (its fields, in its order, compact) is read in one pass, as an
    :class:`_Answer`, when writing that back gives the very bytes that came; any other (another
    server's fields, order or spacing) is read top level first, then the choices: the same fields,
    the choices read twice (3 % more of the gateway's instructions per call, callgrind).

    :raises msgspec.DecodeError: not a JSON object of such fields.
    """
    try:
        answer = _ANSWER.decode(data)
    except msgspec.DecodeError:
        pass
    else:
        if json_bytes(answer) == data:
            top: dict[str, Any] = {k: v for k, v in msgspec.structs.asdict(answer).items() if v is not UNSET}
            choices = answer.choices if answer.choices is not UNSET else None
            return top, choices
    top = _TOP.decode(data)
    raw_choices = top.get("choices")
    return top, None if raw_choices is None else _CHOICES.decode(raw_choices)


_IDS: Final = msgspec.json.Decoder(list[int] | None)
_LOGPROBS: Final = msgspec.json.Decoder(_Logprobs | None)
_ANY: Final = msgspec.json.Decoder()
json_bytes: Final = msgspec.json.Encoder().encode
"""Compact JSON, UTF-8 (msgspec: a tenth of json's time on a completion)."""
json_read: Final = _ANY.decode


def json_bytes_kept(doc: Any) -> bytes:
    """Compact JSON as json writes it: what msgspec refused to read (a NaN, an Infinity) is written
    back as it came, where msgspec would write null."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


_NULL: Final = msgspec.Raw(b"null")


class CallCapture:
    """What one call's answer carried, gathered from the whole document or chunk by chunk, and
    the fields the gateway added taken out of it as it passes."""

    __slots__ = (
        "_as_ids",
        "adapter",
        "content",
        "finish_reason",
        "gen_ids",
        "logprob_tokens",
        "logprobs",
        "malformed",
        "problem",
        "prompt_ids",
        "reasoning",
        "role",
        "sent_error",
        "strip_ids",
        "strip_logprobs",
        "tool_calls",
        "usage",
    )

    def __init__(self, adapter: AdapterName, *, strip_ids: bool, strip_logprobs: bool, as_ids: bool) -> None:
        self.adapter = adapter
        self.strip_ids = strip_ids
        self.strip_logprobs = strip_logprobs
        self._as_ids = as_ids
        self.prompt_ids: list[int] | None = None
        self.gen_ids: list[int] | None = None
        self.logprobs: list[float] | None = None
        self.logprob_tokens: list[Any] | None = None
        """The logprob entries' tokens when they may be ``"token_id:N"`` strings (None once one is
        missing); read as ids by :attr:`logprob_ids`."""
        self.problem: str | None = None
        self.malformed: str | None = None
        """Why the answer is not a chat completion (not an object, no choices, an event that is no
        JSON), when it is not: the call is then ``unreadable`` (or ``upstream_error``: :attr:`sent_error`)."""
        self.sent_error = False
        """Whether the upstream sent an error in place of the answer, with status 200 (in a stream)."""
        self.role = "assistant"
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    # -- reading and stripping ---------------------------------------------------------------------

    def feed_bytes(self, data: bytes, *, chunk: bool) -> bytes | None:
        """:meth:`feed` for a document's JSON text; the text without what the gateway added when it
        took something out (None: ``data`` goes on unchanged).

        The fields the capture reads are decoded alone (msgspec); a document of another shape than
        an OpenAI-compatible server sends is read whole by :meth:`feed`, with the same result.

        :raises ValueError: ``data`` is not JSON.
        """
        try:
            top, choices = _fields(data)
            usage = top.get("usage")
            usage_doc = None if usage is None else _ANY.decode(usage)
            prompt = top.get("prompt_token_ids")
            prompt_ids = None if prompt is None else _IDS.decode(prompt)
            parts = [
                _decode_parts(
                    choice.get("prompt_token_ids"),
                    choice.get("token_ids"),
                    choice.get("logprobs"),
                    choice.get("finish_reason"),
                    choice.get("delta" if chunk else "message"),
                )
                for choice in choices or ()
            ]
        except msgspec.DecodeError:  # not this shape (or not JSON): the general path decides
            return self._feed_json(data, chunk)
        changed = False
        if isinstance(usage_doc, dict):
            self.usage = usage_doc
        if prompt_ids is not None:
            self._prompt(prompt_ids)
        if self.strip_ids:
            for key in ("prompt_token_ids", "prompt_logprobs"):
                if key in top:
                    del top[key]
                    changed = True
        if choices is None:
            error = top.get("error")
            self._no_choices(chunk, None if error is None else _ANY.decode(error), "usage" in top)
        else:
            if len(choices) > 1:
                self.fail(f"the answer has {len(choices)} choices; a trace holds one (n=1)")
            for choice, part in zip(choices, parts, strict=True):
                self._read_choice(*part, chunk)
                if self.strip_ids:
                    for key in ("token_ids", "prompt_token_ids"):
                        if key in choice:
                            del choice[key]
                            changed = True
                if self.strip_logprobs and part[2] is not None:
                    choice["logprobs"] = _NULL
                    changed = True
            if changed:
                top["choices"] = choices  # type: ignore[assignment]  # (encoded as the list it is)
        return json_bytes(top) if changed else None

    def _feed_json(self, data: bytes, chunk: bool) -> bytes | None:
        """:meth:`feed_bytes` through json (which keeps a NaN or Infinity as it came; msgspec would
        write null)."""
        doc = json.loads(data)
        return json_bytes_kept(doc) if self.feed(doc, chunk=chunk) else None

    def _read_choice(
        self,
        prompt: list[int] | None,
        token_ids: list[int] | None,
        logprobs: _Logprobs | None,
        reason: Any,
        message: Any,
        chunk: bool,
    ) -> None:
        """What :meth:`_choice` reads, for a choice read by :meth:`feed_bytes` (the same steps in the
        same order; taking fields out changes nothing here)."""
        if prompt is not None:
            self._prompt(prompt)
        if token_ids is not None:
            if chunk and self.gen_ids is not None:
                self.gen_ids.extend(token_ids)
            else:
                self.gen_ids = token_ids
        if logprobs is not None and logprobs.content is not None:
            entries = logprobs.content  # (comprehensions: half the time of map with an attrgetter)
            tokens = [entry.token for entry in entries] if self._as_ids else None  # (only read then)
            self._add_logprobs([entry.logprob for entry in entries], tokens)
        if reason is not None:
            self.finish_reason = str(reason)
        if isinstance(message, dict):
            self._message(message, chunk)

    def feed(self, doc: Any, *, chunk: bool) -> bool:
        """Read one answer document (a whole completion, or one stream chunk) and take out what the
        gateway added; returns whether ``doc`` was changed."""
        if not isinstance(doc, dict):
            self.bad_answer("the answer is not a JSON object")
            return False
        changed = False
        usage = doc.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        prompt = doc.get("prompt_token_ids")
        if prompt is not None:
            self._prompt(prompt)
        if self.strip_ids:
            for key in ("prompt_token_ids", "prompt_logprobs"):
                if key in doc:
                    del doc[key]
                    changed = True
        choices = doc.get("choices")
        if not isinstance(choices, list):
            self._no_choices(chunk, doc.get("error"), "usage" in doc)
            return changed
        if len(choices) > 1:
            self.fail(f"the answer has {len(choices)} choices; a trace holds one (n=1)")
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            changed |= self._choice(choice, chunk)
        return changed

    def _choice(self, choice: dict[str, Any], chunk: bool) -> bool:
        changed = False
        if choice.get("prompt_token_ids") is not None:  # SGLang's place for them
            self._prompt(choice["prompt_token_ids"])
        token_ids = choice.get("token_ids")
        if token_ids is not None:
            if not isinstance(token_ids, list):
                self.fail("token_ids is not a list")
            elif chunk and self.gen_ids is not None:
                self.gen_ids.extend(token_ids)
            else:
                self.gen_ids = list(token_ids)
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            self._logprobs(logprobs.get("content"))
        if self.strip_ids:
            for key in ("token_ids", "prompt_token_ids"):
                if key in choice:
                    del choice[key]
                    changed = True
        if self.strip_logprobs and choice.get("logprobs") is not None:
            choice["logprobs"] = None
            changed = True
        reason = choice.get("finish_reason")
        if reason is not None:
            self.finish_reason = str(reason)
        message = choice.get("delta") if chunk else choice.get("message")
        if isinstance(message, dict):
            self._message(message, chunk)
        return changed

    def _prompt(self, ids: Any) -> None:
        if not isinstance(ids, list):
            self.fail("prompt_token_ids is not a list")
        elif self.prompt_ids is not None and self.prompt_ids != ids:
            self.fail("the answer carried two different prompt_token_ids")
        else:
            self.prompt_ids = ids

    def _logprobs(self, entries: Any) -> None:
        if entries is None:
            return
        try:  # one pass per field in comprehensions
            values = [entry["logprob"] for entry in entries]
        except (TypeError, KeyError):
            self.fail("a logprobs entry has no logprob")
            return
        try:
            tokens: list[Any] | None = [entry["token"] for entry in entries]
        except (TypeError, KeyError):
            tokens = None
        self._add_logprobs(values, tokens)

    def _add_logprobs(self, values: list[Any], tokens: list[Any] | None) -> None:
        if self.logprobs is None:
            self.logprobs = values
            self.logprob_tokens = [] if self._as_ids else None
        else:
            self.logprobs.extend(values)
        if self.logprob_tokens is not None:
            if tokens is None:
                self.logprob_tokens = None  # not ids after all: no second source
            else:
                self.logprob_tokens.extend(tokens)

    @property
    def logprob_ids(self) -> list[int] | None:
        """Generated ids read from ``"token_id:N"`` logprob tokens (None when one is not such)."""
        tokens = self.logprob_tokens
        if tokens is None:
            return None
        try:
            ids = [int(token[_ID_AT:]) for token in tokens if token[:_ID_AT] == _TOKEN_ID_PREFIX]
        except (TypeError, ValueError):
            return None
        return ids if len(ids) == len(tokens) else None

    def _message(self, message: dict[str, Any], chunk: bool) -> None:
        role = message.get("role")
        if isinstance(role, str):
            self.role = role
        content = message.get("content")
        if isinstance(content, str):
            self.content.append(content)
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str):
            self.reasoning.append(reasoning)
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            return
        for position, call in enumerate(calls):
            if not isinstance(call, dict):
                continue
            index = call.get("index", position) if chunk else position
            slot = self.tool_calls.get(index)
            if slot is None:
                slot = self.tool_calls[index] = {"id": None, "type": "function", "name": "", "arguments": ""}
            call_id = call.get("id")
            if call_id:
                slot["id"] = call_id
            function = call.get("function")
            if isinstance(function, dict):
                name = function.get("name")
                if isinstance(name, str):
                    slot["name"] += name
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    slot["arguments"] += arguments

    def fail(self, problem: str) -> None:
        """Record a capture failure (the first one is kept)."""
        if self.problem is None:
            self.problem = problem

    def bad_answer(self, problem: str, *, sent_error: bool = False) -> None:
        """Record that the answer is not a chat completion (the first reason is kept; ``sent_error``:
        the upstream sent an error instead); the capture fails with it."""
        if self.malformed is None:
            self.malformed = problem
            self.sent_error = sent_error
        self.fail(problem)

    def _no_choices(self, chunk: bool, error: Any, usage: bool) -> None:
        """A document without choices: an answer that is none, or an error the upstream sent in its
        stream (vLLM's when a generation fails mid-stream); a usage chunk has none, and is one."""
        if error is not None:
            detail = error.get("message", error) if isinstance(error, dict) else error
            self.bad_answer(f"the upstream sent an error{' event' if chunk else ''}: {detail}", sent_error=True)
        elif not chunk:
            self.bad_answer("the answer has no choices")
        elif not usage:
            self.bad_answer("an event of the stream has no choices")

    # -- the result --------------------------------------------------------------------------------

    @property
    def token_level(self) -> bool:
        """Whether this adapter captures tokens at all."""
        return self.adapter != "openai"

    def message(self) -> dict[str, Any]:
        """The assistant message the rollout received."""
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.content) if self.content else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(self.tool_calls.items())
            ]
        return message

    def tokens(self) -> tuple[array[int], array[int], array[float]] | None:
        """(prompt ids, generated ids, logprobs) once checked, as compact arrays (4 bytes an id
        instead of 36 in a list; a long prompt is most of a trace), or None with :attr:`problem` set."""
        if not self.token_level:
            return None
        if self.problem is not None:
            return None
        gen_ids = self.gen_ids
        tokens = self.logprob_tokens
        # the two sources agree when the tokens read "token_id:<id>" for the ids in order (checked
        # in C); anything else is read id by id
        if tokens is not None and self.logprobs and (gen_ids is None or not _named(tokens, gen_ids)):
            logprob_ids = self.logprob_ids
            if logprob_ids is None:
                pass  # not ids: no second source
            elif gen_ids is None:
                gen_ids = logprob_ids  # vLLM before return_token_ids: the "token_id:N" strings
            elif gen_ids != logprob_ids:
                self.fail("token_ids and the logprob tokens name different ids")
                return None
        if self.prompt_ids is None:
            self.fail(f"the upstream sent no prompt_token_ids ({_hint(self.adapter)})")
        elif gen_ids is None:
            self.fail(f"the upstream sent no generated token ids ({_hint(self.adapter)})")
        elif self.logprobs is None:
            self.fail("the upstream sent no logprobs")
        elif len(self.logprobs) != len(gen_ids):
            self.fail(f"{len(gen_ids)} generated token ids but {len(self.logprobs)} logprobs")
        if self.problem is not None or self.prompt_ids is None or gen_ids is None or self.logprobs is None:
            return None
        try:  # checks every element in C: an id that is no int, a logprob that is no number, fails
            return array("i", self.prompt_ids), array("i", gen_ids), array("d", self.logprobs)
        except (TypeError, OverflowError):
            self.fail("a token id is not an integer or a logprob is not a number")
            return None


def _decode_parts(
    prompt: msgspec.Raw | None,
    ids: msgspec.Raw | None,
    logprobs: msgspec.Raw | None,
    reason: msgspec.Raw | None,
    message: msgspec.Raw | None,
) -> tuple[list[int] | None, list[int] | None, _Logprobs | None, Any, Any]:
    """One choice's fields the capture reads (their JSON text; None: absent), decoded (before anything
    is recorded)."""
    return (
        None if prompt is None else _IDS.decode(prompt),
        None if ids is None else _IDS.decode(ids),
        None if logprobs is None else _LOGPROBS.decode(logprobs),
        None if reason is None else _ANY.decode(reason),
        None if message is None else _ANY.decode(message),
    )


def _named(tokens: list[Any], ids: list[Any]) -> bool:
    """Whether ``tokens`` are ``"token_id:<id>"`` for ``ids`` in order.

    Ids that are all integers (their JSON text only digits, minus signs and commas) are written in
    one go by msgspec and compared with the tokens joined, both with commas between: as the expected
    strings hold no comma and there are as many tokens as ids, equal texts are equal strings one by
    one. Anything else is compared string by string."""
    if len(tokens) == len(ids) and ids:
        try:
            text = json_bytes(ids)[1:-1]
            joined = ",".join(tokens)
        except (TypeError, ValueError, OverflowError):
            pass
        else:
            if not text.translate(None, _INT_TEXT):
                return joined == _TOKEN_ID_PREFIX + text.decode().replace(",", _NEXT_TOKEN_ID)
    return bool(tokens == list(map(_ID_TOKEN, ids)))


def _hint(adapter: str) -> str:
    if adapter == "vllm":
        return "is it vLLM >= 0.10.2? for another server choose its adapter"
    return "is it SGLang with return_token_ids? streamed answers carry none"


def prepare_request(body: dict[str, Any], adapter: AdapterName) -> CallCapture:
    """Add the adapter's token fields to a request (in place); return the capture for its answer."""
    if adapter == "openai":
        return CallCapture(adapter, strip_ids=False, strip_logprobs=False, as_ids=False)
    strip_ids = body.get("return_token_ids") is not True
    strip_logprobs = body.get("logprobs") is not True
    body["return_token_ids"] = True
    as_ids = False
    if strip_logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = 0
        if adapter == "vllm" and "return_tokens_as_token_ids" not in body:
            body["return_tokens_as_token_ids"] = True  # the rollout never sees these entries
            as_ids = True
    elif adapter == "vllm":
        as_ids = body.get("return_tokens_as_token_ids") is True
    capture = CallCapture(adapter, strip_ids=strip_ids, strip_logprobs=strip_logprobs, as_ids=as_ids)
    if body.get("n", 1) not in (1, None):
        capture.fail(f"n={body.get('n')!r}: a trace holds one answer per call")
    if adapter == "sglang" and body.get("stream") is True:  # SGLang streams no ids: ask for the whole answer
        body["stream"] = False
        body.pop("stream_options", None)
    return capture


def completion_events(doc: dict[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """The stream chunks of a whole completion: the role, the content, each tool call, the finish
    (and the usage when asked), as an OpenAI-compatible server streams them. The choice's
    ``logprobs`` (when the rollout asked for them) ride on the first chunk of generated output, or
    the finish chunk when there is none; a client joins ``logprobs.content`` over the chunks."""
    base: dict[str, Any] = {k: doc[k] for k in ("id", "created", "model", "system_fingerprint") if k in doc}
    base["object"] = "chat.completion.chunk"
    chunks: list[dict[str, Any]] = []
    pending: list[Any] = [None]

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, *, output: bool = True) -> None:
        logprobs, pending[0] = (pending[0], None) if output else (None, pending[0])
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        chunks.append({**base, "choices": [choice]})

    for position, choice in enumerate(doc.get("choices") or []):
        index = choice.get("index", position)
        message = choice.get("message") or {}
        pending[0] = choice.get("logprobs")
        chunk(index, {"role": message.get("role", "assistant"), "content": ""}, output=False)
        for key in ("reasoning_content", "content"):
            if message.get(key):
                chunk(index, {key: message[key]})
        for i, call in enumerate(message.get("tool_calls") or []):
            chunk(index, {"tool_calls": [{"index": i, **call}]})
        chunk(index, {}, choice.get("finish_reason"))
    if include_usage and doc.get("usage") is not None:
        chunks.append({**base, "choices": [], "usage": doc["usage"]})
    return chunks
