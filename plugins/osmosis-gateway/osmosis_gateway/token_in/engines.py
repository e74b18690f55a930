"""The token-in routes of inference engines: what the gateway sends (prompt ids, sampling settings
under the engine's names) and what it reads back (generated ids, their logprobs, why it stopped).

* ``sglang-generate``: SGLang's native ``POST {base}/generate`` (``GenerateReqInput``):
  ``{"input_ids", "sampling_params": {"max_new_tokens", "temperature", "top_p", "top_k", "min_p",
  "stop", "sampling_seed", penalties}, "return_logprob": true, "rid", "stream": false}``; the answer's
  ``output_ids``, ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` triples) and
  ``meta_info.finish_reason`` (``{"type": "stop" | "length" | "abort", ...}``).
* ``vllm-completions``: vLLM's ``POST {base}/v1/completions`` with the ids as ``prompt``,
  ``logprobs: 0``, ``return_token_ids`` (vLLM >= 0.10.2); the choice's ``token_ids``,
  ``prompt_token_ids`` (checked against what was sent) and ``logprobs.token_logprobs``.
* ``trl-generate``: what TRL 1.16's ``trl vllm-serve`` (a ``vllm serve`` with its weight-sync
  settings) serves for token ids, vLLM's ``POST {base}/inference/v1/generate``
  (``VLLMClient._generate_from_features``): ``{"request_id", "model", "token_ids",
  "sampling_params": {..., "logprobs": 0}}``; the choice's ``token_ids`` and ``logprobs.content``.

``{base}`` is the policy URL with a trailing ``/v1`` taken off.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal

import attrs

from osmosis_trainer.sglang import engine_sampling

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ENGINES",
    "EngineAnswer",
    "EngineName",
    "engine_request",
    "engine_root",
    "read_engine_answer",
    "room_for",
    "sampling_of",
]

EngineName = Literal["sglang-generate", "vllm-completions", "trl-generate"]
ENGINES: Final[dict[str, str]] = {
    "sglang-generate": "/generate",
    "vllm-completions": "/v1/completions",
    "trl-generate": "/inference/v1/generate",
}
"""Each token-in engine and its route under the engine's base URL."""

DEFAULT_MAX_TOKENS: Final = 4096
"""The cap a call is sent with when neither the trainer nor the rollout set one (SGLang's own
default is 128 tokens and vLLM's completions' 16: a silent cut mid-answer)."""

_SAMPLING: Final = ("temperature", "top_p", "top_k", "min_p", "stop", "seed", "presence_penalty",
                    "frequency_penalty", "repetition_penalty")  # fmt: skip


def engine_root(base_url: str) -> str:
    """The engine's root URL: the policy URL without a trailing slash or ``/v1``."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1") if root.endswith("/v1") else root


def sampling_of(request: dict[str, Any]) -> dict[str, Any]:
    """The sampling settings of a chat-completions request (the trainer's already set over the
    rollout's), under the wire's names; ``max_tokens`` from ``max_completion_tokens`` first (a null
    is unset).

    :raises ValueError: a cap that is not a count of tokens."""
    settings = {name: request[name] for name in _SAMPLING if request.get(name) is not None}
    cap = request.get("max_completion_tokens")
    name = "max_completion_tokens" if cap is not None else "max_tokens"
    cap = cap if cap is not None else request.get("max_tokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ValueError(f"{name} must be a count of tokens (1 or more), got {cap!r}")
    settings["max_tokens"] = cap if cap is not None else DEFAULT_MAX_TOKENS
    return settings


def room_for(engine: EngineName, context_length: int, prompt_tokens: int) -> int:
    """The most tokens a call of ``prompt_tokens`` may generate on a server of ``context_length``:
    what is left of the context (SGLang refuses a prompt and cap that fill it exactly, so one fewer
    there); 0 or less when the prompt alone fills it."""
    room = context_length - prompt_tokens
    return room - 1 if engine == "sglang-generate" else room


def engine_request(
    engine: EngineName, prompt_ids: list[int], sampling: dict[str, Any], request_id: str, model: str
) -> dict[str, Any]:
    """The body sent to ``engine`` for one call: ``prompt_ids`` and ``sampling`` (the wire's names)."""
    if engine == "sglang-generate":
        params = engine_sampling(sampling, names="sglang")  # (osmosis-trainer's one map of SGLang's names)
        return {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True, "rid": request_id,
                "stream": False}  # fmt: skip
    if engine == "vllm-completions":
        return {"model": model, "prompt": prompt_ids, **sampling, "logprobs": 0, "return_token_ids": True,
                "stream": False}  # fmt: skip
    return {"request_id": request_id, "model": model, "token_ids": prompt_ids,
            "sampling_params": {**sampling, "logprobs": 0}}  # fmt: skip


@attrs.frozen
class EngineAnswer:
    """What the engine generated."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """``stop`` or ``length`` (an aborted generation is refused: :func:`read_engine_answer`)."""
    prompt_ids: list[int] | None = None
    """The prompt ids the engine echoed (vLLM's completions do), to check against what was sent."""
    matched: int | None = None
    """The stop id the engine says ended the generation (SGLang's ``finish_reason.matched``), if it says."""


def _ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise ValueError(f"{what} is not a list of token ids")
    return value


def _floats(values: list[Any], what: str) -> list[float]:
    out = []
    for value in values:
        if value is None:  # (a NaN written as null)
            out.append(math.nan)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out.append(float(value))
        else:
            raise ValueError(f"{what} holds {value!r}, not a logprob")
    return out


def _finish(reason: Any) -> str:
    if reason in ("stop", "length"):
        return str(reason)
    if reason in ("abort", "cancelled"):
        raise ValueError("the engine aborted the generation")
    raise ValueError(f"the engine's finish reason is {reason!r}, not stop or length")


def read_engine_answer(engine: EngineName, doc: Any) -> EngineAnswer:
    """The generated ids, logprobs and finish reason of ``engine``'s answer ``doc`` (parsed JSON).

    :raises ValueError: not that engine's answer, or ids and logprobs of different lengths.
    """
    if not isinstance(doc, dict):
        raise ValueError("the answer is not a JSON object")
    if engine == "sglang-generate":
        meta = doc.get("meta_info")
        if not isinstance(meta, dict):
            raise ValueError("the answer has no meta_info")
        ids = _ids(doc.get("output_ids"), "output_ids")
        triples = meta.get("output_token_logprobs")
        if not isinstance(triples, list) or not all(isinstance(t, list) and len(t) >= 2 for t in triples):
            raise ValueError("meta_info.output_token_logprobs is not a list of [logprob, token_id, text]")
        if [t[1] for t in triples] != ids:
            raise ValueError("meta_info.output_token_logprobs names other ids than output_ids")
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else reason
        matched = reason.get("matched") if isinstance(reason, dict) else None
        stop = matched if isinstance(matched, int) and not isinstance(matched, bool) else None
        floats = _floats([t[0] for t in triples], "output_token_logprobs")
        return EngineAnswer(ids, floats, _finish(kind), matched=stop)
    choices = doc.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ValueError("the answer does not hold one choice")
    choice = choices[0]
    ids = _ids(choice.get("token_ids"), "choices[0].token_ids")
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        raise ValueError("choices[0].logprobs is missing")
    if engine == "vllm-completions":
        values = logprobs.get("token_logprobs")
        prompt = choice.get("prompt_token_ids")
        prompt_ids = None if prompt is None else _ids(prompt, "choices[0].prompt_token_ids")
    else:
        content = logprobs.get("content")
        values = [e.get("logprob") for e in content if isinstance(e, dict)] if isinstance(content, list) else None
        prompt_ids = None
    if not isinstance(values, list) or len(values) != len(ids):
        raise ValueError(f"{len(ids)} generated ids but logprobs for {len(values or [])}")
    return EngineAnswer(ids, _floats(values, "logprobs"), _finish(choice.get("finish_reason")), prompt_ids)
