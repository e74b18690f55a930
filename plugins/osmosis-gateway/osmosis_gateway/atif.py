"""Harbor's Agent Trajectory Interchange Format (ATIF v1.7) from a rollout trace.

One ``agent`` step per model call (its answer, its tool calls, and the tool results that the next
call sent back as the step's ``observation``), ``system`` / ``user`` steps for the other messages;
each agent step's ``metrics`` carry the call's ``prompt_token_ids``, ``completion_token_ids`` and
``logprobs`` when they were captured. Harbor's viewer, Docent and rLLM's bridge read it.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any, Final

from osmosis_core import message_text
from osmosis_gateway.trace import RolloutTrace, TraceCall

__all__ = ["ATIF_VERSION", "trace_to_atif"]

ATIF_VERSION: Final = "ATIF-v1.7"


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw) if isinstance(raw, str) and raw.strip() else {}
    except ValueError:
        return {"_raw": raw}  # malformed arguments are kept as sent
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


def _timestamp(unix: float) -> str | None:
    if not unix:
        return None
    return _dt.datetime.fromtimestamp(unix, tz=_dt.UTC).isoformat()


def _message_step(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    source = "system" if role in ("system", "developer") else "user"
    step: dict[str, Any] = {"source": source, "message": message_text(message)}
    if role not in ("system", "developer", "user"):
        step["extra"] = {"role": role}
    return step


def _agent_step(call: TraceCall) -> dict[str, Any]:
    response = call.response or {}
    step: dict[str, Any] = {
        "source": "agent",
        "message": message_text(response),
        "timestamp": _timestamp(call.started_at),
        "model_name": call.model,
        "llm_call_count": 1,
    }
    if response.get("reasoning_content"):
        step["reasoning_content"] = response["reasoning_content"]
    calls = response.get("tool_calls") or []
    if calls:
        step["tool_calls"] = [
            {
                "tool_call_id": str(tc.get("id") or f"{call.call_id}/{i}"),
                "function_name": str((tc.get("function") or {}).get("name") or ""),
                "arguments": _arguments((tc.get("function") or {}).get("arguments")),
            }
            for i, tc in enumerate(calls)
        ]
    metrics: dict[str, Any] = {}
    usage = call.usage or {}
    for key in ("prompt_tokens", "completion_tokens"):
        if isinstance(usage.get(key), int):
            metrics[key] = usage[key]
    if call.prompt_token_ids is not None:
        metrics["prompt_token_ids"] = call.prompt_token_ids.tolist()
        metrics["prompt_tokens"] = len(call.prompt_token_ids)
    if call.completion_token_ids is not None:
        metrics["completion_token_ids"] = call.completion_token_ids.tolist()
        metrics["completion_tokens"] = len(call.completion_token_ids)
    if call.logprobs is not None:
        metrics["logprobs"] = call.logprobs.tolist()
    if metrics:
        step["metrics"] = metrics
    extra = {
        "call_id": call.call_id,
        "status": call.status,
        "finish_reason": call.finish_reason,
        "policy_version": call.policy_version,
        "latency_sec": round(call.latency_sec, 6),
    }
    if call.error:
        extra["error"] = call.error
    step["extra"] = extra
    return {k: v for k, v in step.items() if v is not None}


def trace_to_atif(
    trace: RolloutTrace, *, agent_name: str = "osmosis", extra: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The ATIF v1.7 trajectory of one rollout (a JSON-ready dict), or None when it made no call.

    :param extra: root-level ``extra`` (the run's row and sample index, the reward, ...).
    """
    from osmosis_gateway import __version__

    if not trace.calls:
        return None
    steps: list[dict[str, Any]] = []
    first = trace.calls[0]
    previous: list[Any] = first.request.get("messages") or []
    steps.extend(_message_step(m) for m in previous if isinstance(m, dict))
    for position, call in enumerate(trace.calls):
        step = _agent_step(call)
        steps.append(step)
        following = trace.calls[position + 1] if position + 1 < len(trace.calls) else None
        if following is None:
            break
        sent: list[Any] = following.request.get("messages") or []
        known = len(call.request.get("messages") or []) + 1  # what the call saw, and its answer
        results, others = [], []
        for message in sent[known:] if len(sent) > known else []:
            if not isinstance(message, dict):
                continue
            if message.get("role") == "tool":
                result = {"content": message_text(message)}
                if message.get("tool_call_id"):
                    result["source_call_id"] = str(message["tool_call_id"])
                results.append(result)
            else:
                others.append(_message_step(message))
        if results:
            step["observation"] = {"results": results}
        steps.extend(others)
    for number, step in enumerate(steps, 1):
        step["step_id"] = number
    tools = first.request.get("tools")
    agent: dict[str, Any] = {"name": agent_name, "version": __version__}
    if first.model:
        agent["model_name"] = first.model
    if isinstance(tools, list) and tools:
        agent["tool_definitions"] = tools
    prompt = sum(len(c.prompt_token_ids or ()) for c in trace.calls)
    completion = sum(len(c.completion_token_ids or ()) for c in trace.calls)
    root: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": trace.rollout_id,
        "trajectory_id": trace.rollout_id,
        "agent": agent,
        "steps": steps,
        "final_metrics": {"total_steps": len(steps)},
        "extra": {
            "complete": trace.complete,
            "incomplete_reason": trace.incomplete_reason,
            "capture": trace.capture,
            **(extra or {}),
        },
    }
    if trace.capture == "tokens":
        root["final_metrics"].update(total_prompt_tokens=prompt, total_completion_tokens=completion)
    return root
