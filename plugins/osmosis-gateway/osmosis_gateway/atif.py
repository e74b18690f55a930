"""Harbor's Agent Trajectory Interchange Format (ATIF v1.7) from a rollout trace.

One ``agent`` step per model call, in the order the calls started (its answer, its tool calls, the
call's id, ``status`` and ``error`` in ``extra``), ``system`` / ``user`` steps for the messages the
rollout sent that no earlier step holds, and each tool result as an ``observation`` result of the
step whose message it follows. An agent step's ``metrics`` carry the call's ``prompt_token_ids``,
``completion_token_ids`` and ``logprobs`` when the call was captured. Harbor's viewer, Docent and
rLLM's bridge read it. Every document is valid for Harbor's own ``Trajectory`` model whatever the
trace holds; how a trace that is not clean is written:

* **A call that failed** (any status but ``ok``: an upstream error, a cut stream, a rollout that
  hung up, a request that was no chat completion, a capture that failed, ...) is an agent step like the
  others: ``extra`` holds its status, error and HTTP status, its message is the answer the gateway
  recorded (none or a part, then ``""``). Token ids go in ``metrics`` only for a captured call
  (``ok``, prompt and completion ids and logprobs all there); ids a call not captured holds are
  kept in ``metrics.extra`` under the same names, where no trainer takes them for training data.
  None is ever made up.
* **An answer the gateway did not record but the rollout received** (a stream that broke off after
  its first events, which an OpenAI client reads as a whole answer): when the next request carries
  that call's messages and then an assistant message, that message is the step's answer, with
  ``extra.answer = "from_next_request"`` (``"recorded"``: the gateway's record; ``"none"``). Its
  tool calls are then the step's, so the tool results that answer them are its observation
  (without it Harbor refuses the document: "source_call_id ... not found in step's tool_calls").
* **A tool result whose id no tool call of its step holds** (its call's answer was lost, the id was
  changed or made up on the way) is still an observation result of the step it follows, without
  ``source_call_id``; the id it carried is in the result's ``extra.tool_call_id``.
* **A call that does not continue the previous one** (a retry with another history, a second sample
  of the same prompt, two conversations in one rollout, a history the agent rewrote): a call's
  request is matched, message by message, against what each earlier call saw and answered; only
  what no earlier call holds becomes new steps, and ``extra.branch_from_step`` names the last step
  its request shares (``0``: none). A retry of a call that got no answer shares all of it.
* **An assistant message no traced call answered** (the prompt's earlier turns, a message the
  agent wrote itself): an agent step with ``is_copied_context: true`` (not training data), no
  ``llm_call_count`` and no metrics.
* **A tool call without an id** gets ``<call_id>/<n>`` (``extra.id_assigned = true``); malformed
  arguments are kept as sent (``{"_raw": ...}``).
* **The rollout as a whole:** root ``extra`` holds ``complete``, ``incomplete_reason``,
  ``capture`` (``text``: no ids anywhere) and ``call_statuses``; ``notes`` says in words what is
  missing; the ``final_metrics`` token totals add up the calls that report a count, and
  ``final_metrics.extra`` says how many do not. A rollout that made no call has no trajectory
  (ATIF needs a step): :func:`trace_to_atif` returns None.

Messages are matched by role and text (``<think>`` blocks and surrounding whitespace aside, which
templates and agents strip from earlier turns), a tool result also by its ``tool_call_id``, an
assistant message with tool calls by their ids (or names).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections import Counter
from typing import Any, Final

from osmosis_core import message_text
from osmosis_trainer.trace import RolloutTrace, TraceCall

__all__ = ["ATIF_VERSION", "trace_to_atif"]

ATIF_VERSION: Final = "ATIF-v1.7"

_THINK: Final = re.compile(r"<think>.*?</think>", re.DOTALL)
_TOOL_ROLES: Final = ("tool", "function")
_TOKEN_FIELDS: Final = ("prompt_token_ids", "completion_token_ids", "logprobs")

type _Key = tuple[Any, ...]


def _arguments(raw: Any) -> dict[str, Any]:
    """A tool call's arguments as an object: parsed JSON, or what was sent, kept under ``_raw`` (not
    JSON) or ``_value`` (JSON, or a value, that is not an object)."""
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if not isinstance(raw, str):
        return {"_value": raw}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"_raw": raw}
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


def _timestamp(unix: float) -> str | None:
    if not unix:
        return None
    try:
        return _dt.datetime.fromtimestamp(unix, tz=_dt.UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _messages(call: TraceCall) -> tuple[list[dict[str, Any]], int]:
    """The messages a call's request sent, and how many entries of them were not message objects."""
    try:
        request = call.request
    except ValueError:  # a request held as JSON text that does not parse (msgspec's DecodeError)
        return [], 0
    raw = request.get("messages") if isinstance(request, dict) else None
    if not isinstance(raw, list):
        return [], 0
    messages = [m for m in raw if isinstance(m, dict)]
    return messages, len(raw) - len(messages)


def _tool_calls(message: dict[str, Any]) -> list[Any]:
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


def _key(message: dict[str, Any], role: Any = None) -> _Key:
    """What two messages must share to be the same turn (see the module's docstring)."""
    role = message.get("role") if role is None else role
    text = _THINK.sub("", message_text(message)).strip()
    if role == "assistant":
        calls = tuple(
            str(tc.get("id") or (tc.get("function") or {}).get("name") or "")
            if isinstance(tc, dict) and isinstance(tc.get("function") or {}, dict)
            else repr(tc)
            for tc in _tool_calls(message)
        )
        return ("assistant", "" if calls else text, calls)
    if role in _TOOL_ROLES:
        return (role, str(message.get("tool_call_id") or message.get("name") or ""), text)
    return (str(role), text)


def _has_answer(response: dict[str, Any] | None) -> bool:
    if not isinstance(response, dict):
        return False
    return bool(message_text(response) or _tool_calls(response) or _reasoning(response))


def _reasoning(message: dict[str, Any]) -> str | None:
    for field in ("reasoning_content", "reasoning"):
        value = message.get(field)
        if isinstance(value, str) and value:
            return value
    return None


def _answer_fields(step: dict[str, Any], message: dict[str, Any], id_prefix: str) -> None:
    """Set an agent step's message, reasoning and tool calls from an assistant message."""
    step["message"] = message_text(message)
    reasoning = _reasoning(message)
    if reasoning is not None:
        step["reasoning_content"] = reasoning
    calls = []
    for n, tc in enumerate(_tool_calls(message)):
        if not isinstance(tc, dict):
            tc = {"function": {"arguments": tc}}
        function = tc.get("function")
        if not isinstance(function, dict):
            function = {} if function is None else {"arguments": function}
        entry: dict[str, Any] = {
            "tool_call_id": str(tc.get("id") or f"{id_prefix}/{n}"),
            "function_name": str(function.get("name") or ""),
            "arguments": _arguments(function.get("arguments")),
        }
        if not tc.get("id"):
            entry["extra"] = {"id_assigned": True}
        calls.append(entry)
    if calls:
        step["tool_calls"] = calls


def _metrics(call: TraceCall) -> dict[str, Any] | None:
    metrics: dict[str, Any] = {}
    usage = call.usage if isinstance(call.usage, dict) else {}
    for field in ("prompt_tokens", "completion_tokens"):
        count = _count(usage.get(field))
        if count is not None:
            metrics[field] = count
    cached = usage.get("prompt_tokens_details")
    if isinstance(cached, dict) and _count(cached.get("cached_tokens")) is not None:
        metrics["cached_tokens"] = cached["cached_tokens"]
    held = {f: getattr(call, f) for f in _TOKEN_FIELDS if getattr(call, f) is not None}
    if call.captured:
        metrics.update({f: list(v) for f, v in held.items()})
        metrics["prompt_tokens"] = len(held["prompt_token_ids"])
        metrics["completion_tokens"] = len(held["completion_token_ids"])
    elif held:  # not training data: kept where a trainer does not look for it
        metrics["extra"] = {f: list(v) for f, v in held.items()}
    return metrics or None


class _Node:
    """A message of :class:`_Contexts`' trie: the calls whose context passes through it or ends here."""

    __slots__ = ("children", "ends", "last", "latest")

    def __init__(self) -> None:
        self.children: dict[_Key, _Node] = {}
        self.latest = -1
        self.ends: set[int] = set()
        self.last: tuple[dict[str, Any], _Node] | None = None
        """The message last matched to a child, and that child: an equal message needs no key."""


class _Contexts:
    """What each call so far saw and answered (its request's messages, then its answer) as a trie of
    message keys, with the step that holds each message: the earlier call a request goes on from is
    found in the length of the request (a message equal to the one matched before needs no key)."""

    def __init__(self) -> None:
        self.root = _Node()
        self.steps: list[list[int]] = []
        self.ends: list[_Node] = []

    def walk(self, messages: list[dict[str, Any]]) -> list[_Node]:
        """The trie's nodes along ``messages``, root first, as far as some earlier call's context goes."""
        path = [self.root]
        node = self.root
        for message in messages:
            last = node.last
            if last is not None and last[0] == message:
                child = last[1]
            else:
                found = node.children.get(_key(message))
                if found is None:
                    break
                child = found
                node.last = (message, found)
            path.append(child)
            node = child
        return path

    @staticmethod
    def parent(path: list[_Node]) -> int | None:
        """The call whose context goes furthest along ``path`` (of equals, one whose context ends
        there, then the latest); None before the first call."""
        node = path[-1]
        if node.latest < 0:
            return None
        return max(node.ends) if node.ends else node.latest

    def add(self, path: list[_Node], keys: list[_Key], steps: list[int]) -> int:
        """A call's context: ``path``, then the messages of ``keys``; ``steps`` holds them all."""
        index = len(self.steps)
        for node in path:
            node.latest = index
        node = path[-1]
        for key in keys:
            node = node.children.setdefault(key, _Node())
            node.latest = index
        node.ends.add(index)
        self.steps.append(steps)
        self.ends.append(node)
        return index

    def extend(self, index: int, key: _Key, step: int) -> None:
        """Add one message (an answer found later) to the context of call ``index``."""
        node = self.ends[index]
        node.ends.discard(index)
        node = node.children.setdefault(key, _Node())
        node.latest = max(node.latest, index)
        node.ends.add(index)
        self.ends[index] = node
        self.steps[index].append(step)


class _Builder:
    """The steps of one trajectory, built call by call (see the module's docstring)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.contexts = _Contexts()
        self.answerless: dict[int, int] = {}  # context index -> its call's step, while it has no answer
        self.echoed: list[int] = []
        self.branches: list[int] = []
        self.unmatched = 0

    def add(self, position: int, call: TraceCall) -> None:
        """The steps of the call at ``position``: what its request adds to the earlier call it goes on
        from (an answer that call lacked, messages, tool results), then its own agent step."""
        messages, skipped = _messages(call)
        path = self.contexts.walk(messages)
        parent = self.contexts.parent(path)
        shared = len(path) - 1
        known = len(self.contexts.steps[parent]) if parent is not None else 0
        context_steps = self.contexts.steps[parent][:shared] if parent is not None else []
        anchor = context_steps[-1] if context_steps else None
        timestamp = _timestamp(call.started_at)
        new = [(m, _key(m)) for m in messages[shared:]]
        first = 0
        if new and parent is not None and known and shared == known and parent in self.answerless:
            message, key = new[0]
            if message.get("role") == "assistant":
                anchor = self._echo(parent, message, key, call)
                context_steps.append(anchor)
                first = 1
        for offset in range(first, len(new)):
            anchor = self._context_message(new[offset][0], anchor, timestamp, call, shared + offset)
            context_steps.append(anchor)
        step = self._agent_step(call, skipped)
        self.steps.append(step)
        number = len(self.steps) - 1
        if position and (parent != position - 1 or shared < known):
            step["extra"]["branch_from_step"] = context_steps[shared - 1] + 1 if shared else 0
            self.branches.append(number + 1)
        keys = [key for _, key in new]
        answered = _has_answer(call.response)
        if answered:
            assert call.response is not None
            keys.append(_key(call.response, "assistant"))
            context_steps.append(number)
        index = self.contexts.add(path, keys, context_steps)
        if not answered:
            self.answerless[index] = number

    def _echo(self, parent: int, message: dict[str, Any], key: _Key, call: TraceCall) -> int:
        """Give the answerless call of context ``parent`` the answer ``call``'s request says it got."""
        number = self.answerless.pop(parent)
        step = self.steps[number]
        _answer_fields(step, message, step["extra"]["call_id"])
        step["extra"]["answer"] = "from_next_request"
        step["extra"]["answer_from_call"] = call.call_id
        self.contexts.extend(parent, key, number)
        self.echoed.append(number + 1)
        return number

    def _context_message(
        self, message: dict[str, Any], anchor: int | None, timestamp: str | None, call: TraceCall, index: int
    ) -> int:
        """Add a message of ``call``'s request that no step holds yet; the step that holds it."""
        role = message.get("role")
        if role in _TOOL_ROLES:
            if anchor is None:  # a tool result with nothing before it: a step of its own holds it
                self.steps.append({"source": "system", "message": "", "extra": {"role": role}})
                anchor = len(self.steps) - 1
            self._observe(self.steps[anchor], message)
            return anchor
        step: dict[str, Any]
        if role == "assistant":
            step = {"source": "agent", "message": "", "is_copied_context": True}
            _answer_fields(step, message, f"{call.call_id}/m{index}")
            step["extra"] = {"role": "assistant", "from_request_of": call.call_id}
        else:
            step = {"source": "system" if role in ("system", "developer") else "user", "message": message_text(message)}
            if role not in ("system", "user"):
                step["extra"] = {"role": role}
        if timestamp is not None:
            step["timestamp"] = timestamp
        self.steps.append(step)
        return len(self.steps) - 1

    def _observe(self, step: dict[str, Any], message: dict[str, Any]) -> None:
        result: dict[str, Any] = {"content": message_text(message)}
        call_id = message.get("tool_call_id")
        if call_id is not None and call_id != "":
            call_id = str(call_id)
            if any(tc["tool_call_id"] == call_id for tc in step.get("tool_calls", ())):
                result["source_call_id"] = call_id
            else:
                result["extra"] = {"tool_call_id": call_id}
                self.unmatched += 1
        if message.get("role") != "tool":
            result.setdefault("extra", {})["role"] = message.get("role")
            if message.get("name"):
                result["extra"]["name"] = message["name"]
        step.setdefault("observation", {"results": []})["results"].append(result)

    def _agent_step(self, call: TraceCall, skipped: int) -> dict[str, Any]:
        step: dict[str, Any] = {"source": "agent", "message": "", "llm_call_count": 1}
        timestamp = _timestamp(call.started_at)
        if timestamp is not None:
            step["timestamp"] = timestamp
        if isinstance(call.model, str):
            step["model_name"] = call.model
        answer = "none"
        if _has_answer(call.response):
            assert call.response is not None
            _answer_fields(step, call.response, call.call_id)
            answer = "recorded"
        metrics = _metrics(call)
        if metrics is not None:
            step["metrics"] = metrics
        extra: dict[str, Any] = {
            "call_id": call.call_id,
            "index": call.index,
            "status": call.status,
            "answer": answer,
            "http_status": call.http_status,
            "stream": call.stream,
            "finish_reason": call.finish_reason,
            "policy_version": call.policy_version,
            "latency_sec": round(call.latency_sec, 6),
        }
        if call.error:
            extra["error"] = call.error
        if call.sampling:
            extra["sampling"] = call.sampling  # the trainer's settings, set over the request's
        if skipped:
            extra["skipped_messages"] = skipped  # entries of the request's messages that were no message
        step["extra"] = extra
        return step


def _tool_definitions(trace: RolloutTrace) -> list[dict[str, Any]] | None:
    for call in trace.calls:
        try:
            tools = call.request.get("tools") if isinstance(call.request, dict) else None
        except ValueError:
            continue
        if isinstance(tools, list) and any(isinstance(t, dict) for t in tools):
            return [t for t in tools if isinstance(t, dict)]
    return None


def _steps(numbers: list[int]) -> str:
    return f"Step {numbers[0]}" if len(numbers) == 1 else f"Steps {', '.join(map(str, numbers))}"


def _notes(trace: RolloutTrace, builder: _Builder) -> str | None:
    said = []
    if not trace.complete:
        said.append(f"Incomplete rollout: {trace.incomplete_reason}.")
    if builder.echoed:
        said.append(
            f"{_steps(builder.echoed)}: the gateway recorded no answer; the answer shown is the "
            "assistant message the rollout sent back in its next request (no token ids)."
        )
    if builder.branches:
        said.append(
            f"{_steps(builder.branches)}: the call does not continue the one before it "
            "(extra.branch_from_step: the last step its request shares)."
        )
    if builder.unmatched:
        said.append(
            f"{builder.unmatched} tool result(s) answer no tool call of their step (the id is in the result's "
            "extra.tool_call_id)."
        )
    return " ".join(said) or None


def trace_to_atif(
    trace: RolloutTrace, *, agent_name: str = "osmosis", extra: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The ATIF v1.7 trajectory of one rollout (a JSON-ready dict), or None when it made no call.

    Any trace gives a document Harbor's ``Trajectory`` model accepts: failed calls, lost answers,
    retries and branches are written as the module's docstring says.

    :param extra: root-level ``extra`` (the run's row and sample index, the reward, ...).
    """
    from osmosis_gateway import __version__

    if not trace.calls:
        return None
    builder = _Builder()
    for position, call in enumerate(trace.calls):
        builder.add(position, call)
    steps = [{"step_id": number, **step} for number, step in enumerate(builder.steps, 1)]
    agent: dict[str, Any] = {"name": agent_name, "version": __version__}
    model = next((c.model for c in trace.calls if isinstance(c.model, str) and c.model), None)
    if model is not None:
        agent["model_name"] = model
    tools = _tool_definitions(trace)
    if tools:
        agent["tool_definitions"] = tools
    final: dict[str, Any] = {}
    uncounted: dict[str, int] = {}
    calls = [s for s in steps if s["source"] == "agent" and s.get("llm_call_count") == 1]
    for field in ("prompt_tokens", "completion_tokens"):
        counted = [s["metrics"][field] for s in calls if field in s.get("metrics", {})]
        if counted:
            final[f"total_{field}"] = sum(counted)  # of the calls that have the count
        if len(counted) < len(calls):
            uncounted[f"calls_without_{field}"] = len(calls) - len(counted)
    final["total_steps"] = len(steps)
    if uncounted:
        final["extra"] = uncounted
    root: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": trace.rollout_id,
        "trajectory_id": trace.rollout_id,
        "agent": agent,
        "steps": steps,
        "final_metrics": final,
        "extra": {
            "complete": trace.complete,
            "incomplete_reason": trace.incomplete_reason,
            "capture": trace.capture,
            "call_statuses": dict(Counter(str(c.status) for c in trace.calls)),
            **(extra or {}),
        },
    }
    notes = _notes(trace, builder)
    if notes is not None:
        root["notes"] = notes
    return root
