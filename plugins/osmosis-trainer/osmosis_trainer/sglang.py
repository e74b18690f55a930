"""SGLang's native ``/generate`` on the wire, as the trainer side reads and writes it.

``osmosis serve --traces`` with ``[traces] adapter = "sglang-generate"`` calls a policy in token ids:
``POST <policy URL>/generate`` with SGLang's body (``input_ids``, ``sampling_params`` in SGLang's
names, ``return_logprob``, ``rid``, ``stream: false``) and the header ``X-Osmosis-Rollout-Id``, and
reads SGLang's answer (``text``, ``output_ids``, ``meta_info.output_token_logprobs`` as
``[logprob, token_id, text]`` triples, ``meta_info.finish_reason.type``). Two adapters meet it:

* slime's own SGLang router speaks it already (:mod:`osmosis_trainer.slime`): the rollouts' sampling
  settings come from slime's SGLang dict (:func:`sampling_from_sglang`);
* verl's engines are Python objects inside the trainer: :class:`osmosis_trainer.bridge.TokenBridge`
  serves this route in front of them, translating SGLang's names into the engine's
  (:func:`engine_sampling`).

The shapes follow SGLang's ``GenerateReqInput`` (``python/sglang/srt/managers/io_struct.py``), its
``SamplingParams`` (``python/sglang/srt/sampling/sampling_params.py``) and the ``meta_info`` its
tokenizer manager returns (``id``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``,
``output_token_logprobs``).

>>> sampling_from_sglang({"temperature": 1.0, "top_k": -1, "max_new_tokens": 64, "sampling_seed": 7,
...                       "skip_special_tokens": False, "no_stop_trim": True, "stop_token_ids": [2]})
(SamplingParams(temperature=1.0, top_k=-1, max_tokens=64, seed=7), ('stop_token_ids',))
>>> engine_sampling({"temperature": 0.7, "max_new_tokens": 16, "min_new_tokens": 2, "seed": 3}, names="vllm")
{'temperature': 0.7, 'max_tokens': 16, 'min_tokens': 2, 'seed': 3}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from osmosis_trainer.sampling import TOP_K_ALL, SamplingParams, _top_k_off, sampling_from_trainer

__all__ = [
    "FINISH_REASONS",
    "TEXT_ONLY",
    "TOP_K_ALL",
    "EngineNames",
    "SamplingError",
    "engine_sampling",
    "generate_answer",
    "sampling_from_sglang",
]

FINISH_REASONS: Final = frozenset({"stop", "length", "abort"})
"""``meta_info.finish_reason.type`` values: the model stopped, hit ``max_new_tokens``, or was aborted."""

TEXT_ONLY: Final = frozenset(
    {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval"}
)
"""SGLang settings that shape the detokenized text only: a token-level trace does not need them."""

EngineNames = Literal["vllm", "sglang"]
"""The naming of an engine's sampling dict: vLLM's ``SamplingParams`` or SGLang's."""

# SGLang's name -> (osmosis's SamplingParams name, vLLM's name, SGLang's name)
_RENAMED: Final[Mapping[str, tuple[str | None, str, str]]] = {
    "temperature": ("temperature", "temperature", "temperature"),
    "top_p": ("top_p", "top_p", "top_p"),
    "top_k": ("top_k", "top_k", "top_k"),
    "min_p": ("min_p", "min_p", "min_p"),
    "max_new_tokens": ("max_tokens", "max_tokens", "max_new_tokens"),
    "max_tokens": ("max_tokens", "max_tokens", "max_new_tokens"),  # (vLLM's name, sent by some clients)
    "stop": ("stop", "stop", "stop"),
    "sampling_seed": ("seed", "seed", "sampling_seed"),
    "seed": ("seed", "seed", "sampling_seed"),  # (vLLM's name)
    "presence_penalty": ("presence_penalty", "presence_penalty", "presence_penalty"),
    "frequency_penalty": ("frequency_penalty", "frequency_penalty", "frequency_penalty"),
    "repetition_penalty": ("repetition_penalty", "repetition_penalty", "repetition_penalty"),
    "stop_token_ids": (None, "stop_token_ids", "stop_token_ids"),
    "min_new_tokens": (None, "min_tokens", "min_new_tokens"),
    "ignore_eos": (None, "ignore_eos", "ignore_eos"),
}


_TO_OURS: Final = {"max_new_tokens": "max_tokens", "sampling_seed": "seed"}
"""SGLang's names of :class:`~osmosis_trainer.SamplingParams`' fields that differ from ours."""
_NEUTRAL: Final = frozenset({"min_new_tokens", "stop_token_ids", "ignore_eos", "custom_params"})


def _neutral(key: str, value: Any) -> bool:
    """A setting osmosis serve does not apply, at the value that changes nothing (0, [], False, {})."""
    return key in _NEUTRAL and not value


class SamplingError(ValueError):
    """A sampling setting that cannot be applied (the message names it)."""


def sampling_from_sglang(params: Mapping[str, Any] | None) -> tuple[SamplingParams | None, tuple[str, ...]]:
    """An SGLang ``sampling_params`` dict (slime's: ``max_new_tokens``, ``sampling_seed``, ...) as a
    rollout's :class:`~osmosis_trainer.SamplingParams`, and the keys osmosis serve cannot apply
    (``stop_token_ids``, ``min_new_tokens`` above 0, ``custom_params``, a grammar ...), for the
    caller to warn about. Text-only settings (:data:`TEXT_ONLY`) and the neutral values of the rest
    are left out without a word.

    :raises ValueError, TypeError: a value out of range or of the wrong type (the message names it).
    """
    return sampling_from_trainer(params, renames=_TO_OURS, silent=TEXT_ONLY, neutral=_neutral)


def engine_sampling(params: Mapping[str, Any], *, names: EngineNames) -> dict[str, Any]:
    """An SGLang ``sampling_params`` dict as an engine's: vLLM's ``SamplingParams`` names (``max_tokens``,
    ``min_tokens``, ``seed``) or SGLang's own. Text-only settings are left out; ``top_k`` of SGLang's
    whole vocabulary becomes -1.

    :raises SamplingError: ``n`` other than 1, or a setting the engine call does not take (a grammar,
        ``logit_bias``, ``custom_params``, an unknown name): the message names it.
    """
    if names not in ("vllm", "sglang"):
        raise ValueError(f"names must be 'vllm' or 'sglang', got {names!r}")
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in TEXT_ONLY or value is None:
            continue
        if key == "n":
            if value != 1:
                raise SamplingError(f"sampling_params.n={value!r}: one completion per request")
            continue
        renamed = _RENAMED.get(key)
        if renamed is None:
            raise SamplingError(f"sampling_params.{key}: not a setting this engine takes")
        out[renamed[1] if names == "vllm" else renamed[2]] = _top_k_off(value) if key == "top_k" else value
    return out


def generate_answer(
    rid: str,
    prompt_tokens: int,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    finish_reason: str,
    *,
    text: str = "",
    weight_version: str | None = None,
) -> dict[str, Any]:
    """SGLang's non-streaming ``/generate`` answer for one prompt.

    >>> answer = generate_answer("r-0", 3, [7, 2], [-0.5, -0.1], "stop")
    >>> answer["output_ids"], answer["meta_info"]["output_token_logprobs"], answer["meta_info"]["finish_reason"]
    ([7, 2], [[-0.5, 7, None], [-0.1, 2, None]], {'type': 'stop'})
    """
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {sorted(FINISH_REASONS)}, got {finish_reason!r}")
    if len(logprobs) != len(token_ids):
        raise ValueError(f"{len(logprobs)} logprobs for {len(token_ids)} tokens")
    reason: dict[str, Any] = {"type": finish_reason}
    if finish_reason == "length":
        reason["length"] = len(token_ids)
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(token_ids),
        "cached_tokens": 0,
        "output_token_logprobs": [[float(lp), int(t), None] for lp, t in zip(logprobs, token_ids, strict=True)],
    }
    if weight_version is not None:
        meta["weight_version"] = weight_version
    return {"text": text, "output_ids": [int(t) for t in token_ids], "meta_info": meta}
