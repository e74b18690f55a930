"""Helpers of the ATIF tests: traces that are not clean (built, generated, or made over real HTTP),
and the two checks a trajectory must pass.

* :func:`check_atif` needs no Harbor: Harbor 0.25.0's own JSON Schema of its ``Trajectory`` model
  (``harbor_trajectory.schema.json``, which ``test_atif_harbor.py`` keeps equal to the model's) and
  the four rules the model's validators add to it. The gateway's own nox session runs it.
* ``test_atif_harbor.py`` (marked ``together``: the ``plugins_all`` session, where osmosis-harbor
  installs Harbor) puts the same traces through ``Trajectory.model_validate`` itself.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import typing
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import aiohttp
from gateway_helpers import MULTIPLY_TOOL, QUESTION, stack
from hypothesis import strategies as st

from osmosis_core.testing import Fault
from osmosis_gateway import trace_to_atif
from osmosis_gateway.trace import CallStatus, RolloutTrace, TraceCall

SCHEMA = Path(__file__).with_name("harbor_trajectory.schema.json")
STATUSES = sorted(set(typing.get_args(CallStatus)) | {"unreadable", "no_answer", "cancelled"})
"""Every call status, with the ones the gateway is getting (a call built in memory takes any)."""
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


@cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))


def check_atif(document: dict[str, Any]) -> None:
    """Fail unless ``document`` (as JSON) passes Harbor's schema and its ``Trajectory`` validators."""
    document = json.loads(json.dumps(document))  # what a reader of the file gets
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator().iter_errors(document)]
    assert not problems, "\n".join(problems)
    for index, step in enumerate(document["steps"]):
        where = f"steps[{index}]"
        assert step["step_id"] == index + 1, f"{where}.step_id: {step['step_id']} (sequential from 1)"
        if step["source"] != "agent":
            present = [f for f in AGENT_ONLY if step.get(f) is not None]
            assert not present, f"{where}: {present} on a {step['source']} step"
        elif step.get("llm_call_count") == 0:
            assert step.get("metrics") is None, f"{where}: metrics with llm_call_count 0"
            assert step.get("reasoning_content") is None, f"{where}: reasoning_content with llm_call_count 0"
        if step.get("timestamp") is not None:
            try:
                _dt.datetime.fromisoformat(step["timestamp"].replace("Z", "+00:00"))
            except ValueError as exc:
                raise AssertionError(f"{where}.timestamp: {exc}") from None
        ids = {tc["tool_call_id"] for tc in step.get("tool_calls") or ()}
        for result in (step.get("observation") or {}).get("results", ()):
            source = result.get("source_call_id")
            assert source is None or source in ids, f"{where}: source_call_id {source!r} is not in its tool_calls {ids}"
    assert not document.get("subagent_trajectories"), "no subagent trajectories are written"


def harbor_trajectory(config: Any) -> Any:
    """Harbor's ``Trajectory`` model. Without Harbor: a failure in a ``-m together`` run (the
    ``plugins_all`` session installs it with osmosis-harbor), else a skip (the gateway's session
    checks the same documents with :func:`check_atif`)."""
    try:
        from harbor.models.trajectories import Trajectory
    except ImportError as exc:
        import pytest

        if "together" in (config.getoption("markexpr") or ""):
            pytest.fail(f"Harbor is not installed in a `-m together` run, where osmosis-harbor brings it: {exc}")
        pytest.skip("Harbor's Trajectory model (harbor, with osmosis-harbor): the plugins_all nox session runs this")
    return Trajectory


# -- traces that are not clean -------------------------------------------------------------------

SYSTEM, USER = QUESTION


def _tool_call(call_id: str | None, a: int = 12, b: int = 7) -> dict[str, Any]:
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": "multiply", "arguments": json.dumps({"a": a, "b": b})},
    }
    if call_id is not None:
        call["id"] = call_id
    return call


def _asks(call_id: str | None) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [_tool_call(call_id)]}


def _result(call_id: str, content: str = "84") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


ANSWER = {"role": "assistant", "content": "#### 84"}


def _call(
    index: int, messages: list[Any], response: dict[str, Any] | None, status: str = "ok", **fields: Any
) -> TraceCall:
    return TraceCall(
        call_id=f"c{index}",
        index=index,
        status=status,  # type: ignore[arg-type]
        request={"messages": messages, "tools": [{"type": "function", "function": {"name": "multiply"}}]},
        response=response,
        started_at=1_780_000_000.0 + index,
        model="osmosis-stub",
        **fields,
    )


def _ids(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "prompt_token_ids": list(range(prompt)),
        "completion_token_ids": list(range(100, 100 + completion)),
        "logprobs": [-0.5] * completion,
    }


def _trace(calls: list[TraceCall], capture: str = "tokens") -> RolloutTrace:
    trace = RolloutTrace("r-1", capture=capture, calls=calls)  # type: ignore[arg-type]
    for call in calls:
        if call.status != "ok":
            trace.mark_incomplete(f"call {call.index} {call.status}: {call.error}")
    return trace


def lost_answer_then_tool_result() -> RolloutTrace:
    """A streamed call cut after its tool call's first event (the gateway has no answer), which the
    rollout carried on from: its next request answers that tool call (Harbor refused the old export)."""
    first = _call(0, [SYSTEM, USER], None, "cut", error="the upstream's stream ended without [DONE]", stream=True)
    second = _call(1, [SYSTEM, USER, _asks("call_x"), _result("call_x")], ANSWER, **_ids(30, 4))
    return _trace([first, second])


def failed_calls() -> RolloutTrace:
    """An upstream error (no answer, no ids), a capture that failed with the prompt ids only, then ok."""
    error = _call(0, [SYSTEM, USER], None, "upstream_error", error="the upstream answered 503: busy", http_status=503)
    partial = _call(
        1, [SYSTEM, USER], _asks("call_a"), "capture_failed", error="no completion ids", prompt_token_ids=[1, 2, 3]
    )
    done = _call(2, [SYSTEM, USER, _asks("call_a"), _result("call_a")], ANSWER, **_ids(40, 3))
    return _trace([error, partial, done])


def unknown_tool_results() -> RolloutTrace:
    """Tool results whose ids no answer holds: one in the prompt, one answering a call the rollout renamed."""
    prompt = [SYSTEM, _result("never_made", "stale"), USER]
    first = _call(0, prompt, _asks("call_a"), **_ids(20, 5))
    second = _call(1, [*prompt, _asks("call_a"), _result("call_b")], ANSWER, **_ids(30, 3))
    return _trace([first, second])


def retry_after_an_error() -> RolloutTrace:
    """A tool call, an upstream error on the next call, the same request again (the SDK's retry)."""
    sent = [SYSTEM, USER, _asks("call_a"), _result("call_a")]
    calls = [
        _call(0, [SYSTEM, USER], _asks("call_a"), **_ids(20, 5)),
        _call(1, sent, None, "upstream_error", error="the upstream answered 500", http_status=500),
        _call(2, sent, ANSWER, **_ids(40, 3)),
    ]
    return _trace(calls)


def two_conversations() -> RolloutTrace:
    """Two samples of one prompt, then the first conversation goes on (interleaved branches)."""
    calls = [
        _call(0, [SYSTEM, USER], _asks("call_a"), **_ids(20, 5)),
        _call(1, [SYSTEM, USER], {"role": "assistant", "content": "#### 85"}, **_ids(20, 2)),
        _call(2, [SYSTEM, USER, _asks("call_a"), _result("call_a")], ANSWER, **_ids(40, 3)),
    ]
    return _trace(calls)


def earlier_turns_in_the_prompt() -> RolloutTrace:
    """A prompt that holds an earlier exchange (an assistant tool call and its result)."""
    prompt = [SYSTEM, USER, _asks("call_old"), _result("call_old"), {"role": "user", "content": "and 3 times 41?"}]
    return _trace([_call(0, prompt, {"role": "assistant", "content": "#### 123"}, **_ids(50, 4))])


def text_only() -> RolloutTrace:
    """A plain-OpenAI upstream: text, usage counts, no ids; the second call cut with no answer."""
    usage = {"prompt_tokens": 21, "completion_tokens": 6}
    calls = [
        _call(0, [SYSTEM, USER], _asks("call_a"), usage=usage),
        _call(1, [SYSTEM, USER, _asks("call_a"), _result("call_a")], None, "cut", error="cut", stream=True),
    ]
    return _trace(calls, capture="text")


def malformed() -> RolloutTrace:
    """What a broken client or upstream sends: messages that are no list or hold no objects, tool
    calls without ids or with unreadable arguments, a tool call that is no object."""
    odd = {
        "role": "assistant",
        "content": [{"type": "text", "text": "thinking "}, "aloud"],
        "reasoning_content": "hm",
        "tool_calls": [_tool_call(None), {"id": "call_b", "function": {"name": "multiply", "arguments": "{'a': "}}, 7],
    }
    calls = [
        _call(0, [], None, "bad_request", error="no messages", http_status=400),
        TraceCall(call_id="c1", index=1, status="bad_request", request={"messages": "hi", "tools": "all"}),
        _call(2, [SYSTEM, 3, None, USER], odd, usage={"prompt_tokens": True, "completion_tokens": "7"}),
        _call(3, [{"role": "tool", "content": "orphan"}, {"role": "ipython", "content": "x"}], None, "client_gone"),
    ]
    return _trace(calls)


CASES: dict[str, Callable[[], RolloutTrace]] = {
    f.__name__: f
    for f in (
        lost_answer_then_tool_result,
        failed_calls,
        unknown_tool_results,
        retry_after_an_error,
        two_conversations,
        earlier_turns_in_the_prompt,
        text_only,
        malformed,
    )
}


BROKEN: dict[str, Callable[[dict[str, Any]], Any]] = {
    "source_call_id_not_in_its_steps_tool_calls": lambda d: d["steps"][2].pop("tool_calls"),
    "step_ids_not_sequential": lambda d: d["steps"][1].update(step_id=5),
    "metrics_on_a_user_step": lambda d: d["steps"][1].update(metrics={"prompt_tokens": 1}),
    "a_field_atif_does_not_have": lambda d: d["steps"][0].update(role="system"),
    "arguments_not_an_object": lambda d: d["steps"][2]["tool_calls"][0].update(arguments="{}"),
    "no_steps": lambda d: d.update(steps=[]),
    "a_timestamp_that_is_not_iso_8601": lambda d: d["steps"][0].update(timestamp="yesterday"),
    "metrics_on_a_step_of_no_llm_call": lambda d: d["steps"][3].update(llm_call_count=0),
    "token_ids_that_are_not_ints": lambda d: d["steps"][3]["metrics"].update(prompt_token_ids=["a"]),
}
"""Faults Harbor's model refuses, one per document (both checks must refuse them)."""


def broken_document(name: str) -> dict[str, Any]:
    """The export of :func:`lost_answer_then_tool_result` with the fault ``BROKEN[name]``."""
    document = copy.deepcopy(trace_to_atif(lost_answer_then_tool_result()))
    assert document is not None
    BROKEN[name](document)
    return document


async def cut_stream_then_carry_on() -> RolloutTrace:
    """Over real HTTP: the stand-in cuts the first streamed answer after its tool call's first event
    (no ``[DONE]``); the rollout reads what came as its answer, as an OpenAI client does, runs the
    tool and asks again. The gateway's trace of it."""
    async with stack() as (server, gateway):
        policy = gateway.open_rollout("cut-1")
        headers = {"Authorization": f"Bearer {policy.api_key}"}
        url = policy.chat_completions_url
        body = {"model": "osmosis-stub", "messages": [SYSTEM, USER], "tools": [MULTIPLY_TOOL]}
        server.inject(Fault("truncate"))
        reply: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json={**body, "stream": True}, headers=headers) as response:
                assert response.status == 200
                async for line in response.content:
                    if not line.startswith(b"data: {"):
                        continue
                    for delta in [c["delta"] for c in json.loads(line[6:])["choices"]]:
                        for tc in delta.get("tool_calls") or ():
                            if tc.get("id"):
                                reply["tool_calls"].append(
                                    {"id": tc["id"], "type": "function", "function": tc["function"]}
                                )
            assert reply["tool_calls"], "the cut stream brought the tool call's first event"
            tool_id = reply["tool_calls"][0]["id"]
            messages = [SYSTEM, USER, reply, _result(tool_id)]
            async with session.post(url, json={**body, "messages": messages}, headers=headers) as response:
                assert response.status == 200
        return gateway.pop_trace("cut-1")


# -- generated traces ----------------------------------------------------------------------------
# (every strategy is made once, here: hypothesis validates each new one, which cost most of the time)

_text = st.sampled_from(
    ["", " ", "84", "#### 84", "<think>hm</think> 84", "84 ", "é\x00中"]
)  # what the export tells apart
_made_id = st.sampled_from(["call_a", "call_b", "call_c", "", "c0/0", "7"])
_arguments = st.sampled_from(['{"a": 2, "b": 3}', '{"a": ', "", "[1, 2]", "null", {"a": 1}, None, 7])
_odd_tool_call = st.sampled_from([7, "call", {"function": "x"}, {"id": "call_a"}])
_content = st.none() | _text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=2)
_small = st.integers(0, 9)
_how_first = st.sampled_from(["fresh", "junk"])
_how = st.sampled_from(["continue", "continue", "retry", "branch", "fresh", "junk"])
_result_id = st.sampled_from(["same", "same", "other", "none"])
_result_role = st.sampled_from(["tool", "tool", "function"])
_added_role = st.sampled_from(["user", "system", "developer"])
_junk = st.sampled_from(
    [
        {},
        {"messages": "hi"},
        {"messages": [1, None]},
        {"messages": [{"role": "tool", "tool_call_id": "zz", "content": "r"}]},
    ]
)
_status = st.sampled_from(["ok"] * len(STATUSES) + STATUSES)  # half of the calls ok
_lost = st.sampled_from([None, None, "answer", {}, {"role": "assistant"}])
_token_fields = st.lists(st.sampled_from(["prompt_token_ids", "completion_token_ids", "logprobs"]), unique=True)
_http = st.sampled_from([None, 200, 400, 500])
_started = st.sampled_from([0.0, 1_780_000_000.5])
_latency = st.floats(0, 30)
_model = st.sampled_from([None, "osmosis-stub"])
_version = st.sampled_from([None, "step-3"])
_finish = st.sampled_from([None, "stop", "tool_calls", "length"])
_usage = st.none() | st.fixed_dictionaries(
    {}, optional={"prompt_tokens": st.integers(0, 99) | st.booleans() | _text, "completion_tokens": st.integers(0, 99)}
)


def _assistant(draw: st.DrawFn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": draw(_content)}
    calls: list[Any] = []
    for _ in range(draw(_small) % 4):
        if draw(_small) == 0:
            calls.append(draw(_odd_tool_call))
            continue
        call: dict[str, Any] = {"type": "function", "function": {"name": "multiply", "arguments": draw(_arguments)}}
        if draw(_small):
            call["id"] = draw(_made_id)
        calls.append(call)
    if calls:
        message["tool_calls"] = calls
    if draw(_small) < 2:
        message["reasoning_content"] = draw(_text)
    return message


def _results_for(draw: st.DrawFn, answer: Any) -> list[dict[str, Any]]:
    """Tool results a rollout sends after ``answer``: for its tool calls' ids, or others, or none."""
    calls = answer.get("tool_calls") if isinstance(answer, dict) and answer.get("role") == "assistant" else None
    results = []
    for call in calls if isinstance(calls, list) else ():
        result: dict[str, Any] = {"role": draw(_result_role), "content": draw(_text)}
        made = draw(_result_id)
        if made == "same" and isinstance(call, dict) and call.get("id"):
            result["tool_call_id"] = call["id"]
        elif made == "other":
            result["tool_call_id"] = draw(_made_id)
        results.append(result)
    return results


@st.composite
def traces(draw: st.DrawFn) -> RolloutTrace:
    """A trace of up to 6 calls: any status, answers recorded, partial or lost (and sometimes seen by
    the rollout anyway), requests that continue, retry or branch from earlier calls, or are junk."""
    capture = "tokens" if draw(_small) > 2 else "text"
    seen: list[list[Any]] = []  # per call: what the rollout sent and then had (its answer, if it got one)
    calls: list[TraceCall] = []
    for index in range(draw(_small) % 7):
        how = draw(_how if seen else _how_first)
        request: dict[str, Any]
        if how == "continue":
            base = list(seen[draw(st.integers(0, len(seen) - 1))])
            messages = base + _results_for(draw, base[-1] if base else None)
            if draw(_small) < 5:
                messages.append({"role": draw(_added_role), "content": draw(_text)})
            request = {"messages": messages}
        elif how == "retry":
            request = dict(calls[draw(st.integers(0, len(calls) - 1))].request)
        elif how == "branch":
            base = seen[draw(st.integers(0, len(seen) - 1))]
            request = {"messages": [*base[: draw(st.integers(0, len(base)))], {"role": "user", "content": draw(_text)}]}
        elif how == "fresh":
            messages = [{"role": "system", "content": "calc"}, {"role": "user", "content": draw(_text)}]
            if draw(_small) < 3:  # earlier turns in the prompt
                earlier = _assistant(draw)
                messages += [earlier, *_results_for(draw, earlier)]
            request = {"messages": messages}
        else:
            request = dict(draw(_junk))
        if draw(_small) < 5:
            request["tools"] = [{"type": "function", "function": {"name": "multiply"}}, 5]
        status = draw(_status)
        answer = _assistant(draw)
        lost = draw(_lost)
        response = answer if status == "ok" or lost == "answer" else lost
        got = answer if status == "ok" or draw(_small) < 5 else None  # what the rollout received
        messages = request.get("messages") if isinstance(request.get("messages"), list) else []
        seen.append([*messages, got] if got is not None else list(messages))
        fields: dict[str, Any] = {}
        if capture == "tokens":
            n = 1 + draw(_small) % 5
            full = {"prompt_token_ids": list(range(7)), "completion_token_ids": list(range(n)), "logprobs": [-0.5] * n}
            kept = list(full) if status == "ok" and draw(_small) else draw(_token_fields)
            fields = {k: full[k] for k in kept}
        calls.append(
            TraceCall(
                call_id=f"c{index}",
                index=index,
                status=status,  # type: ignore[arg-type]
                error=None if status == "ok" else draw(_text),
                http_status=draw(_http),
                stream=draw(_small) < 5,
                started_at=draw(_started),
                latency_sec=draw(_latency),
                model=draw(_model),
                policy_version=draw(_version),
                request=request,
                response=response,
                finish_reason=draw(_finish),
                usage=draw(_usage),
                **fields,
            )
        )
    return _trace(calls, capture)
