"""JSON forms of the records that cross the trial boundary (files in the trial's ``/logs``).

The host writes a request for the runner inside the trial and reads back an
:class:`~osmosis_core.records.ExecutionResult`. API keys never go into these files: the runner
reads the key from its environment (``OSMOSIS_POLICY_API_KEY``).

>>> from osmosis_core import ExecutionResult, ExecutionStage, ExecutionStatus, RolloutSample
>>> r = ExecutionResult("r1", ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS,
...                     sample=RolloutSample(messages=[{"role": "user", "content": "hi"}], reward=1))
>>> result_from_json(result_to_json(r)) == r
True
"""

from __future__ import annotations

import base64
import math
import pickle
from typing import Any

from osmosis_core.records import (
    ErrorCategory,
    ErrorInfo,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    PolicyEndpoint,
    RolloutSample,
)

__all__ = [
    "API_KEY_ENV",
    "dump_object",
    "load_object_blob",
    "policy_from_json",
    "policy_to_json",
    "result_from_json",
    "result_to_json",
    "sample_from_json",
    "sample_to_json",
]

API_KEY_ENV = "OSMOSIS_POLICY_API_KEY"
"""The variable that carries the policy's API key into the trial (never a file)."""


def sample_to_json(sample: RolloutSample) -> dict[str, Any]:
    """A sample as a JSON-ready dict."""
    return {
        "messages": sample.messages,
        "system_prompt": sample.system_prompt,
        "chat_messages": sample.chat_messages,
        "reward": sample.reward,
        "metrics": sample.metrics,
    }


def sample_from_json(data: Any) -> RolloutSample:
    """A sample from its JSON form. :raises ValueError: when it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("messages", []), list):
        raise ValueError(f"not a sample: {str(data)[:200]}")
    reward = data.get("reward")
    if reward is not None and not (isinstance(reward, (int, float)) and math.isfinite(reward)):
        reward = None
    metrics = data.get("metrics")
    chat = data.get("chat_messages")
    system = data.get("system_prompt")
    return RolloutSample(
        messages=list(data.get("messages") or []),
        system_prompt=system if isinstance(system, str) else None,
        chat_messages=list(chat) if isinstance(chat, list) else None,
        reward=reward,
        metrics=dict(metrics) if isinstance(metrics, dict) else {},
    )


def result_to_json(result: ExecutionResult) -> dict[str, Any]:
    """A stage result as a JSON-ready dict."""
    return {
        "rollout_id": result.rollout_id,
        "stage": result.stage.value,
        "status": result.status.value,
        "error": None
        if result.error is None
        else {"category": result.error.category.value, "message": result.error.message},
        "sample": None if result.sample is None else sample_to_json(result.sample),
        "timings": dict(result.timings),
    }


def result_from_json(data: Any) -> ExecutionResult:
    """A stage result from its JSON form. :raises ValueError: when it is not one."""
    if not isinstance(data, dict):
        raise ValueError(f"not a result: {str(data)[:200]}")
    try:
        error = data.get("error")
        info = None
        if error is not None:
            info = ErrorInfo(ErrorCategory(error["category"]), str(error["message"]))
        sample = data.get("sample")
        timings = data.get("timings") or {}
        return ExecutionResult(
            str(data["rollout_id"]),
            ExecutionStage(data["stage"]),
            ExecutionStatus(data["status"]),
            sample=None if sample is None else sample_from_json(sample),
            error=info,
            timings={str(k): float(v) for k, v in timings.items() if isinstance(v, (int, float))},
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a result ({exc!r}): {str(data)[:200]}") from None


def policy_to_json(policy: PolicyEndpoint) -> dict[str, Any]:
    """The endpoint without its API key."""
    return {"base_url": policy.base_url, "model": policy.model, "headers": dict(policy.headers)}


def policy_from_json(data: dict[str, Any], api_key: str | None) -> PolicyEndpoint:
    """The endpoint, with the key the caller read from its environment."""
    return PolicyEndpoint(str(data["base_url"]), str(data["model"]), api_key, dict(data.get("headers") or {}))


def dump_object(obj: Any) -> str:
    """A config object as base64 pickle (it may be any attrs class of the rollout's own code).

    Only the host writes these and only the trial reads them, with the same code on its path.
    """
    return base64.b64encode(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


def load_object_blob(blob: str) -> Any:
    """The object :func:`dump_object` wrote."""
    return pickle.loads(base64.b64decode(blob))  # the host wrote it for this trial (see dump_object)
