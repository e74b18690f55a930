"""The trace of one rollout (every model call it made, as tokens when the upstream gives them), and
the trainer's view of it: token sequences stitched by exact token prefix, a loss mask, logprobs.

The policy gateway (osmosis-gateway) records these; they live here, on the trainer's side, so a
trainer reads a result's trace (or a run's ``traces.jsonl``) without osmosis-core.

>>> call = TraceCall(call_id="c1", index=0, status="ok", prompt_token_ids=[1, 2], completion_token_ids=[3, 4],
...                  logprobs=[-0.5, -0.25])
>>> trace = RolloutTrace("r-1", capture="tokens", calls=[call])
>>> view = trainer_view(trace)
>>> view.sequences[0].token_ids, view.sequences[0].loss_mask, view.sequences[0].logprobs
([1, 2, 3, 4], [0, 0, 1, 1], [0.0, 0.0, -0.5, -0.25])

Nothing here re-tokenizes: a call whose prompt does not start with an earlier call's prompt +
generation starts a new sequence (a *prefix break*, counted), as chat templates that re-render
past turns (Qwen3 strips earlier ``<think>`` blocks) make happen.
"""

from __future__ import annotations

import json
import os
import sys
import types
import typing
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol

import attrs
import cattrs
import msgspec
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

__all__ = [
    "CallStatus",
    "RolloutTrace",
    "TraceCall",
    "TrainerView",
    "TrainingSequence",
    "comparable_trace",
    "read_traces",
    "trace_from_json",
    "trainer_view",
    "view_of_json",
]

CallStatus = Literal[
    "ok",
    "capture_failed",
    "upstream_error",
    "unreadable",
    "no_answer",
    "cut",
    "client_gone",
    "cancelled",
    "bad_request",
    "pending",
]
"""How one call went. ``ok``: answered, the answer whole (a stream's ``[DONE]`` came) and captured.
Every other status makes the trace incomplete: ``capture_failed`` (the rollout got its answer, the
tokens were not captured), ``upstream_error`` (the upstream answered an error, sent one in its
stream, was unreachable, or its answer was too large; the rollout got that error), ``unreadable``
(the upstream's answer is not a chat completion), ``no_answer`` (the upstream sent nothing within
the gateway's read timeout), ``cut`` (the upstream's connection or stream broke off before the
answer was whole), ``client_gone`` (the rollout hung up before the end), ``cancelled`` (the
rollout's trace was taken, or the gateway stopped, while the call was in flight), ``bad_request``
(the rollout sent something that is not a chat-completions request). ``pending``: still in flight,
only in a trace read while its rollout runs (a trace taken out never holds one)."""

Capture = Literal["tokens", "text"]
"""What the upstream adapter captures: token ids and logprobs, or the text only (plain OpenAI)."""


def _ids(value: Iterable[int] | None) -> array[int] | None:
    if value is None or isinstance(value, array):
        return value
    return array("i", value)


def _floats(value: Iterable[float] | None) -> array[float] | None:
    if value is None or isinstance(value, array):
        return value
    return array("d", value)


def _request_key(value: dict[str, Any] | bytes) -> dict[str, Any]:
    """A request as a dict, whether held as one or as its JSON text."""
    if isinstance(value, bytes):
        decoded: dict[str, Any] = msgspec.json.decode(value)
        return decoded
    return value


def _request_dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"a call's request must be a JSON object, got {type(value).__name__}")
    return value


def _captured(call: TraceCall | _JsonCall) -> bool:
    """A call answered whole whose prompt ids, completion ids and logprobs (one per id) are all here."""
    return (
        call.status == "ok"
        and call.prompt_token_ids is not None
        and call.completion_token_ids is not None
        and call.logprobs is not None
        and len(call.logprobs) == len(call.completion_token_ids)  # else the mask and logprobs would misalign
    )


@attrs.define(kw_only=True, on_setattr=attrs.setters.NO_OP)  # plain setattr: the gateway sets a dozen per call
class TraceCall:
    """One model call of a rollout, in the order the calls started."""

    call_id: str
    index: int
    """0 for the rollout's first call, then 1, 2, ... in the order they started."""
    status: CallStatus = "ok"
    error: str | None = None
    """Why the call is not ``ok`` (the upstream's error, the capture problem); never a key."""
    http_status: int | None = None
    stream: bool = False
    started_at: float = 0.0
    """Unix time the gateway received the call."""
    latency_sec: float = 0.0
    model: str | None = None
    policy_version: str | None = None
    sampling: dict[str, Any] | None = None
    """The trainer's sampling settings the gateway set on this call, as sent upstream (over what the
    rollout sent, which :attr:`request` keeps); None when it set none."""
    sampling_dropped: list[str] | None = None
    """The rollout's settings that shape the sampling distribution (``top_p``, ``min_p``, penalties...)
    the trainer's sampling did not set, so the gateway did not send them (the trainer decides the
    distribution); None when none was dropped."""
    _request: dict[str, Any] | bytes = attrs.field(factory=dict, alias="request", eq=_request_key, repr=False)
    """:attr:`request`, or its JSON text as the gateway keeps it (a fifth of the memory of the dicts)."""
    response: dict[str, Any] | None = None
    """The assistant message the rollout received (content, tool calls)."""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    prompt_token_ids: array[int] | None = attrs.field(default=None, converter=_ids)
    """The ids the upstream saw, as a compact ``array("i")`` (``list(...)`` for a list; a list or any
    iterable of ints given to the constructor is converted)."""
    completion_token_ids: array[int] | None = attrs.field(default=None, converter=_ids)
    logprobs: array[float] | None = attrs.field(default=None, converter=_floats)
    """One log-probability per completion token (``array("d")``)."""
    token_in: dict[str, Any] | None = None
    """How a token-in gateway made the call (None on a chat upstream): ``engine``, ``render``
    (``incremental``: the prompt is an earlier call's ids + its answer + only the new messages;
    ``full``: the whole conversation rendered), ``render_reason`` (why a later call was rendered
    whole), ``extends`` (the answered call it extends), ``tool_calls`` (how many were parsed) and
    ``tool_parse_error`` (why the generated text's tool calls could not be read: it went to the
    rollout as a plain message)."""

    @property
    def request(self) -> dict[str, Any]:
        """What the rollout sent: ``messages``, ``tools`` and the sampling parameters (as sent, before the
        gateway added its token fields). The gateway holds it as JSON text until it is first read."""
        value = self._request
        if isinstance(value, bytes):
            value = self._request = _request_key(value)
        return value

    @request.setter
    def request(self, value: dict[str, Any] | bytes) -> None:
        self._request = value

    @property
    def captured(self) -> bool:
        """Whether the call's prompt ids, completion ids and logprobs are all here."""
        return _captured(self)


@attrs.define(kw_only=True)
class RolloutTrace:
    """Every call one rollout made. ``complete`` is false when any call failed or was not captured;
    a trainer drops or masks such a rollout (``incomplete_reason`` says why, for people)."""

    rollout_id: str = attrs.field(kw_only=False)
    capture: Capture = "tokens"
    calls: list[TraceCall] = attrs.field(factory=list)
    incomplete_reason: str | None = None
    """The first reason the trace is incomplete; None when it is complete."""

    @property
    def complete(self) -> bool:
        """True when every call was answered whole and captured (as far as the adapter captures); a
        call still in flight (``pending``) makes it false too."""
        return self.incomplete_reason is None and all(call.status != "pending" for call in self.calls)

    def mark_incomplete(self, reason: str) -> None:
        """Record why the trace is incomplete (the first reason is kept)."""
        if self.incomplete_reason is None:
            self.incomplete_reason = reason

    def to_json(self) -> dict[str, Any]:
        """The JSON form (a ``traces.jsonl`` line holds it, with the row and sample index)."""
        data: dict[str, Any] = _converter.unstructure(self)
        data["complete"] = self.complete
        if data["incomplete_reason"] is None and not data["complete"]:
            pending = next(call.index for call in self.calls if call.status == "pending")
            data["incomplete_reason"] = f"call {pending} is still in flight"
        return data


_converter = cattrs.Converter(omit_if_default=False)

if sys.version_info < (3, 12):  # pragma: no cover - array is generic from Python 3.12 on

    class _ArrayHint:
        """What ``array[int]`` in the annotations below means on Python < 3.12, where ``array`` cannot
        be subscripted (3.11's ``typing.get_type_hints`` subscripts a hint's origin again)."""

        __class_getitem__: Any = classmethod(types.GenericAlias)

    _ARRAYS: tuple[Any, ...] = (array, _ArrayHint)
    # the annotations resolved here (cattrs would evaluate ``array[int]`` itself, and fail)
    for _cls in (TraceCall, RolloutTrace):
        attrs.resolve_types(_cls, localns={"array": _ArrayHint})
else:
    _ARRAYS = (array,)


def _is_array(type_: Any) -> bool:
    return type_ in _ARRAYS or typing.get_origin(type_) in _ARRAYS


def _is_optional_array(type_: Any) -> bool:
    args = typing.get_args(type_)
    return len(args) == 2 and type(None) in args and any(_is_array(a) for a in args)


def _to_list(value: Any) -> list[Any] | None:
    """An array's values as a list; also a plain list a caller set (setting a field does not convert)."""
    if value is None:
        return None
    return value.tolist() if isinstance(value, array) else list(value)


_converter.register_unstructure_hook_func(_is_array, _to_list)
_converter.register_unstructure_hook_func(_is_optional_array, _to_list)
_converter.register_structure_hook_func(
    _is_array, lambda value, type_: array("d" if typing.get_args(type_) == (float,) else "i", value)
)

# TraceCall.request is kept as ``_request`` (a dict, or its JSON text): its JSON form is "request", a dict
_converter.register_unstructure_hook(
    TraceCall,
    make_dict_unstructure_fn(
        TraceCall,
        _converter,
        _request=override(
            rename="request",
            unstruct_hook=lambda value: (
                _request_key(value) if isinstance(value, bytes) else _converter.unstructure(value, dict[str, Any])
            ),
        ),
    ),
)
_converter.register_structure_hook(
    TraceCall,
    make_dict_structure_fn(
        TraceCall, _converter, _request=override(rename="request", struct_hook=lambda value, _: _request_dict(value))
    ),
)


def trace_from_json(data: dict[str, Any]) -> RolloutTrace:
    """A trace from its JSON form (extra keys such as ``row_index`` or ``complete`` are ignored).

    :raises cattrs.errors.BaseValidationError: a field has the wrong type.
    """
    fields = {a.name for a in attrs.fields(RolloutTrace)}
    return _converter.structure({k: v for k, v in data.items() if k in fields}, RolloutTrace)


@attrs.frozen
class TrainingSequence:
    """One training sample: a branch of the rollout's calls, stitched by exact token prefix."""

    token_ids: list[int]
    loss_mask: list[int]
    """1 on tokens the policy generated (trained on), 0 on prompt, tool and user tokens."""
    logprobs: list[float]
    """The sampling logprob of each generated token; 0.0 where the mask is 0."""
    call_ids: tuple[str, ...]
    """The calls this sequence is made of, root first."""
    policy_versions: tuple[str | None, ...]
    """The policy version of each of those calls (for off-policy correction)."""
    root_prompt_length: int
    """Tokens of the first call's prompt: where a trainer splits the prompt from the completion
    (:attr:`prompt_length` is later when that call's generation was trained in an earlier branch)."""

    @property
    def prompt_length(self) -> int:
        """Tokens before the first generated one."""
        return self.loss_mask.index(1) if 1 in self.loss_mask else len(self.loss_mask)


@attrs.frozen
class TrainerView:
    """What a trainer takes from one rollout's trace, and the counts it should watch."""

    rollout_id: str
    complete: bool
    incomplete_reason: str | None
    sequences: list[TrainingSequence]
    prefix_breaks: int
    """Calls that extend no earlier call (each starts a new sequence), not counting the first."""
    generated_tokens: int
    """Tokens the policy generated in the captured calls."""
    delivered_tokens: int
    """Generated tokens that are in some sequence with mask 1 (each counted once)."""
    calls: int = 0
    """The rollout's calls, captured or not."""
    uncaptured_calls: int = 0
    """Calls whose tokens are not here (failed, cut, cancelled, not captured): what they generated
    is unknown, and no sequence holds it."""

    @property
    def captured_calls(self) -> int:
        """Calls whose tokens are in the view."""
        return self.calls - self.uncaptured_calls

    @property
    def delivered_fraction(self) -> float:
        """Share of the rollout a trainer receives: of the captured calls' generated tokens, those in
        a sequence, times the share of the calls that were captured (a call not captured generated an
        unknown number of tokens, none of which a trainer gets: each counts as one call's share).
        1.0 only when every call was captured and no token was left out; 0.0 when no call was."""
        if not self.calls:
            return 1.0
        captured = self.captured_calls / self.calls
        tokens = self.delivered_tokens / self.generated_tokens if self.generated_tokens else 1.0
        return tokens * captured


class _Tokens(Protocol):
    """What stitching reads of a captured call: a :class:`TraceCall`, or a call read straight from
    JSON (:func:`view_of_json`): its ids as arrays or as lists, the same to the algorithm."""

    @property
    def call_id(self) -> str: ...
    @property
    def policy_version(self) -> str | None: ...
    @property
    def prompt_token_ids(self) -> Sequence[int] | None: ...
    @property
    def completion_token_ids(self) -> Sequence[int] | None: ...
    @property
    def logprobs(self) -> Sequence[float] | None: ...


def _as_list(values: Sequence[Any]) -> list[Any]:
    return values.tolist() if isinstance(values, array) else list(values)


def trainer_view(trace: RolloutTrace, *, branches: Literal["all", "last"] = "all") -> TrainerView:
    """Stitch a trace's calls into training sequences by exact token prefix.

    Each captured call's parent is the earlier call whose prompt + generation is the longest prefix
    of its prompt; a call without one starts a new sequence. Every leaf of that forest is one
    sequence (``branches="all"``; a call shared by several branches has mask 1 in the first only, so
    no token is trained twice), or only the branch of the last call (``"last"``: what a trainer that
    wants one sample per rollout takes; ``delivered_fraction`` then says what it left out). Calls
    that were not captured are left out; the trace is then incomplete and says so, and the view
    counts them (``uncaptured_calls``, and ``delivered_fraction`` below 1.0).

    :raises ValueError: the trace holds text only (a plain-OpenAI upstream): there is nothing to train on.
    """
    _tokens_only(trace.rollout_id, trace.capture)
    captured = [c for c in trace.calls if c.captured]
    return _stitch(trace.rollout_id, trace.complete, trace.incomplete_reason, len(trace.calls), captured, branches)


def _tokens_only(rollout_id: str, capture: str) -> None:
    if capture != "tokens":
        raise ValueError(
            f"trace {rollout_id!r} holds text only (capture={capture!r}): "
            "the upstream gave no token ids, and re-tokenizing text is what this view refuses to do"
        )


def _stitch(
    rollout_id: str,
    complete: bool,
    incomplete_reason: str | None,
    call_count: int,
    calls: Sequence[_Tokens],
    branches: Literal["all", "last"],
) -> TrainerView:
    """The view of ``calls`` (the captured ones, in the order they started); see :func:`trainer_view`."""
    prompts: list[Sequence[int]] = [c.prompt_token_ids for c in calls]  # type: ignore[misc]
    generations: list[Sequence[int]] = [c.completion_token_ids for c in calls]  # type: ignore[misc]
    ends = [len(p) + len(g) for p, g in zip(prompts, generations, strict=True)]  # prompt + generation
    parents: list[int | None] = []
    by_length: list[int] = []  # the earlier calls, longest prompt + generation first (ties: earliest first)
    for j, prompt in enumerate(prompts):
        best: int | None = None
        for i in by_length:  # the first that is a prefix is the longest: usually the call just before
            middle = len(prompts[i])
            # its generation first (short, and where another branch differs), then its prompt
            if ends[i] <= len(prompt) and prompt[middle : ends[i]] == generations[i] and prompt[:middle] == prompts[i]:
                best = i
                break
        parents.append(best)
        at = next((k for k, i in enumerate(by_length) if ends[i] < ends[j]), len(by_length))
        by_length.insert(at, j)
    has_child = {p for p in parents if p is not None}
    leaves = [j for j in range(len(calls)) if j not in has_child]
    if branches == "last" and leaves:
        leaves = [leaves[-1]]
    trained: set[int] = set()
    sequences: list[TrainingSequence] = []
    for leaf in leaves:
        path: list[int] = []
        node: int | None = leaf
        while node is not None:
            path.append(node)
            node = parents[node]
        path.reverse()
        tokens = _as_list(prompts[leaf]) + _as_list(generations[leaf])
        mask = [0] * len(tokens)
        logprobs = [0.0] * len(tokens)
        for k in path:
            if k in trained:
                continue
            trained.add(k)
            start = len(calls[k].prompt_token_ids)  # type: ignore[arg-type]
            generated = calls[k].logprobs
            assert generated is not None  # (a captured call)
            mask[start : start + len(generated)] = [1] * len(generated)
            logprobs[start : start + len(generated)] = _as_list(generated)
        sequences.append(
            TrainingSequence(
                token_ids=tokens,
                loss_mask=mask,
                logprobs=logprobs,
                call_ids=tuple(calls[k].call_id for k in path),
                policy_versions=tuple(calls[k].policy_version for k in path),
                root_prompt_length=len(calls[path[0]].prompt_token_ids),  # type: ignore[arg-type]
            )
        )
    generated_tokens = sum(len(c.completion_token_ids or ()) for c in calls)
    delivered = sum(len(calls[k].completion_token_ids or ()) for k in trained)
    roots = sum(p is None for p in parents)
    return TrainerView(
        rollout_id=rollout_id,
        complete=complete,
        incomplete_reason=incomplete_reason,
        sequences=sequences,
        prefix_breaks=max(0, roots - 1),
        generated_tokens=generated_tokens,
        delivered_tokens=delivered,
        calls=call_count,
        uncaptured_calls=call_count - len(calls),
    )


class _JsonCall(msgspec.Struct):
    """The fields of one call of a trace's JSON form that the view reads (checked by msgspec)."""

    call_id: str
    index: int
    status: str = "ok"
    policy_version: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        if (
            self.completion_token_ids is not None
            and self.logprobs is not None
            and len(self.logprobs) != len(self.completion_token_ids)
        ):
            raise ValueError(
                f"call {self.index} has {len(self.logprobs)} logprobs for {len(self.completion_token_ids)} tokens"
            )

    @property
    def captured(self) -> bool:
        return _captured(self)


class _JsonTrace(msgspec.Struct):
    rollout_id: str
    capture: str = "tokens"
    calls: list[_JsonCall] = []
    incomplete_reason: str | None = None


def view_of_json(data: dict[str, Any], *, branches: Literal["all", "last"] = "all") -> TrainerView:
    """``trainer_view(trace_from_json(data))``, read straight from the JSON form: the ids stay the
    lists they are (no arrays built, no ``TraceCall``), checked on the way by msgspec, at about a
    third of the cost. What a trainer turning results into rows uses (:func:`osmosis_trainer.rollout_rows`).

    :raises ValueError: ``data`` is not a trace (the message names the field, ``$.calls[1].logprobs``),
        or holds text only.
    """
    try:
        trace = msgspec.convert(data, _JsonTrace)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a trace: {exc}") from None
    _tokens_only(trace.rollout_id, trace.capture)
    pending = next((call.index for call in trace.calls if call.status == "pending"), None)
    reason = trace.incomplete_reason
    if reason is None and pending is not None:
        reason = f"call {pending} is still in flight"
    captured = [c for c in trace.calls if c.captured]
    return _stitch(trace.rollout_id, reason is None, reason, len(trace.calls), captured, branches)


def read_traces(path: str | os.PathLike[str]) -> dict[tuple[int, int], tuple[dict[str, Any], RolloutTrace]]:
    """The latest trace of each (row, sample) in a run's ``traces.jsonl``, with its line.

    A resumed run appends; as for ``results.jsonl``, the last line of a pair counts.

    :raises ValueError: a line that is not a trace, naming the file and the line number.
    """
    found: dict[tuple[int, int], tuple[dict[str, Any], RolloutTrace]] = {}
    with open(path, encoding="utf-8") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                trace = trace_from_json(line)
                key = (int(line["row_index"]), int(line["sample_index"]))
            except (ValueError, KeyError, TypeError, cattrs.BaseValidationError) as exc:
                raise ValueError(f"{path}:{number}: not a trace line ({type(exc).__name__}: {exc})") from None
            found[key] = (line, trace)
    return found


def comparable_trace(line: dict[str, Any]) -> dict[str, Any]:
    """A ``traces.jsonl`` line without what differs from run to run: call ids, times, and the
    tool-call ids a model makes up (echoed back in the next request). Two runs of the same rows
    against a deterministic policy (the stand-in) give equal forms whatever backend ran them."""
    calls = []
    for call in line["calls"]:
        call = {k: v for k, v in call.items() if k not in ("call_id", "started_at", "latency_sec")}
        response = dict(call.get("response") or {})
        if response.get("tool_calls"):
            response["tool_calls"] = [{**t, "id": None} for t in response["tool_calls"]]
        messages = []
        for message in (call.get("request") or {}).get("messages", ()):
            message = {k: v for k, v in message.items() if k != "tool_call_id"}
            if message.get("tool_calls"):
                message["tool_calls"] = [{**t, "id": None} for t in message["tool_calls"]]
            messages.append(message)
        calls.append(call | {"response": response, "request": {**(call.get("request") or {}), "messages": messages}})
    keys = ("row_index", "sample_index", "complete", "incomplete_reason", "capture")
    return {k: line.get(k) for k in keys} | {"calls": calls}
