"""A trainer's sampling settings for a rollout's model calls: which there are, their checks, how they apply.

A policy-gradient update is right only for the distribution the samples were drawn from, so the
trainer decides how its policy samples, not the agent: an agent that asks for ``temperature=0.2``
while the trainer computes its loss at 1.0 trains on the wrong distribution (TRL #4159 temperature,
#6789 top-p, vLLM #42259). :attr:`osmosis_core.PolicyEndpoint.sampling` holds the trainer's
settings for one rollout, and whoever sends the rollout's model calls sets them over what the
agent sent: :func:`osmosis_core.chat_completion`, the osmosis-openai client of the Strands and
OpenAI Agents integrations, and, with traces on, the policy gateway (which keeps the agent's
values in the trace as sent and records the applied ones on each call).

The settings are the sampling parameters vLLM and the OpenAI API share, plus vLLM's ``top_k``,
``min_p`` and ``repetition_penalty`` (an OpenAI upstream refuses those three). ``max_tokens`` caps
a call's generation whichever name the agent gave its own cap: see :func:`sampling_overrides`.

>>> check_sampling({"temperature": 1, "top_p": 0.9, "seed": None})
{'temperature': 1.0, 'top_p': 0.9}
>>> body = {"messages": [], "temperature": 0.2, "max_completion_tokens": 512}
>>> apply_sampling(body, {"temperature": 1.0, "max_tokens": 64})
{'temperature': 1.0, 'max_completion_tokens': 64}
>>> body
{'messages': [], 'temperature': 1.0, 'max_completion_tokens': 64}
>>> check_sampling({"temprature": 1.0})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: sampling.temprature: not a sampling parameter; did you mean 'temperature'? (known: temperature, ...)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, MutableMapping
from typing import Any, Final

import attrs

__all__ = [
    "DISTRIBUTION_PARAMS",
    "SAMPLING_PARAMS",
    "agent_distribution",
    "apply_sampling",
    "check_sampling",
    "sampling_overrides",
    "sampling_problems",
    "sampling_schema",
]


@attrs.frozen
class SamplingParam:
    """One sampling parameter: its check (the value, normalised, or ValueError saying what is
    wrong) and the JSON schema of its values (for an API's documentation)."""

    name: str
    check: Callable[[Any], Any] = attrs.field(repr=False)
    schema: Mapping[str, Any] = attrs.field(repr=False)
    doc: str = attrs.field(repr=False)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return repr(value)
    kinds: dict[type, str] = {str: "a string", list: "an array", dict: "an object"}
    return kinds.get(type(value), type(value).__name__)


_Made = tuple[Callable[[Any], Any], dict[str, Any]]


def _number(low: float, high: float | None = None, *, above: bool = False) -> _Made:
    """A finite number ``>= low`` (``> low`` when ``above``) and ``<= high``."""
    where = f"{'>' if above else '>='} {low:g}" + ("" if high is None else f" and <= {high:g}")

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number {where}, got {_kind(value)}")
        number = float(value)
        too_low = number <= low if above else number < low
        if not math.isfinite(number) or too_low or (high is not None and number > high):
            raise ValueError(f"expected a number {where}, got {value!r}")
        return number

    schema: dict[str, Any] = {"type": "number", ("exclusiveMinimum" if above else "minimum"): low}
    if high is not None:
        schema["maximum"] = high
    return check, schema


def _integer(low: int, high: int | None = None) -> _Made:
    """A whole number (a JSON integer: ``1.0`` is refused) ``>= low`` and ``<= high``."""
    where = f">= {low}" + ("" if high is None else f" and <= {high}")

    def check(value: Any) -> int:
        if type(value) is not int or value < low or (high is not None and value > high):
            raise ValueError(f"expected a whole number {where}, got {_kind(value)}")
        return value

    schema: dict[str, Any] = {"type": "integer", "minimum": low}
    if high is not None:
        schema["maximum"] = high
    return check, schema


def _stop(value: Any) -> str | list[str]:
    if type(value) is str:
        return value
    if type(value) is list and all(type(item) is str for item in value):
        return list(value)
    raise ValueError(f"expected a string or an array of strings, got {_kind(value)}")


_INT64: Final = 2**63


def _param(name: str, made: _Made, doc: str) -> SamplingParam:
    check, schema = made
    return SamplingParam(name, check, schema, doc)


SAMPLING_PARAMS: Final[Mapping[str, SamplingParam]] = {
    param.name: param
    for param in (
        _param("temperature", _number(0), "Sampling temperature (0: greedy)."),
        _param("top_p", _number(0, 1, above=True), "Nucleus sampling: the smallest set of tokens of this mass."),
        _param("top_k", _integer(-1), "vLLM, SGLang: the k most likely tokens only (-1 or 0: all)."),
        _param("min_p", _number(0, 1), "vLLM, SGLang: tokens of at least this fraction of the top one's probability."),
        _param(
            "max_tokens",
            _integer(1),
            "The most tokens one call generates; replaces the agent's max_tokens and max_completion_tokens alike.",
        ),
        SamplingParam(
            "stop",
            _stop,
            {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "Where generation stops (a string or several).",
        ),
        _param("seed", _integer(-_INT64, _INT64 - 1), "The sampler's seed (the same for every call it is given to)."),
        _param("presence_penalty", _number(-2, 2), "Penalty on tokens already present."),
        _param("frequency_penalty", _number(-2, 2), "Penalty by how often a token already occurs."),
        _param("repetition_penalty", _number(0, above=True), "vLLM, SGLang: penalty on repeats, a factor (1: none)."),
    )
}
"""Every sampling parameter a trainer may set, by name (the wire's and vLLM's names)."""

DISTRIBUTION_PARAMS: Final = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
"""The settings that shape the distribution a token is drawn from: once a trainer sets sampling, these
come from it alone (an agent's value for one the trainer left unset is dropped, and the engine's
default applies, which is what the trainer's loss assumes); ``stop``, ``seed`` and ``max_tokens``
end or seed a generation without changing its distribution, and the agent's still apply unless the
trainer set them."""

_HINTS: Final = {
    "max_completion_tokens": "send max_tokens: it replaces the agent's max_tokens and max_completion_tokens alike",
    "n": "one rollout samples one answer per call (n=1); ask for more rollouts instead",
}


def sampling_problems(params: Any) -> list[tuple[str | None, str]]:
    """What is wrong with a set of sampling settings: ``(name, problem)`` per parameter (``name``
    None when ``params`` is not an object at all); empty when they are fine. ``None`` values are fine
    (they leave the agent's value as it is)."""
    if not isinstance(params, Mapping):
        return [(None, f"expected an object of sampling parameters, got {_kind(params)}")]
    problems: list[tuple[str | None, str]] = []
    for name, value in params.items():
        param = SAMPLING_PARAMS.get(name) if isinstance(name, str) else None
        if param is None:
            problems.append((str(name), _unknown(str(name))))
        elif value is not None:
            try:
                param.check(value)
            except ValueError as exc:
                problems.append((name, str(exc)))
    return problems


def _unknown(name: str) -> str:
    known = ", ".join(SAMPLING_PARAMS)
    hint = _HINTS.get(name)
    if hint is None:
        import difflib  # (a refused key only)

        close = difflib.get_close_matches(name, SAMPLING_PARAMS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else ""
    return f"not a sampling parameter{'; ' + hint if hint else ''} (known: {known})"


def check_sampling(params: Mapping[str, Any]) -> dict[str, Any]:
    """The settings as a new dict, checked and normalised (numbers as floats), ``None`` values left out.

    :raises ValueError: an unknown parameter or a bad value, each named (``sampling.top_p: ...``).
    """
    problems = sampling_problems(params)
    if problems:
        raise ValueError("; ".join(f"sampling{'' if name is None else '.' + name}: {why}" for name, why in problems))
    return {name: SAMPLING_PARAMS[name].check(value) for name, value in params.items() if value is not None}


def sampling_overrides(sampling: Mapping[str, Any], sent: Collection[str]) -> dict[str, Any]:
    """The fields to set on a chat-completions request whose fields are ``sent``: the trainer's
    ``sampling``, with ``max_tokens`` sent under the name(s) the agent used for its own cap. vLLM reads
    ``max_completion_tokens`` before ``max_tokens`` and the OpenAI API refuses ``max_tokens`` for its
    reasoning models, so a cap the agent sent as ``max_completion_tokens`` is replaced there (and in
    ``max_tokens`` too when it sent both); otherwise the trainer's goes as ``max_tokens``.

    >>> sampling_overrides({"max_tokens": 8}, {"messages", "max_tokens", "max_completion_tokens"})
    {'max_tokens': 8, 'max_completion_tokens': 8}
    """
    overrides = dict(sampling)
    if "max_completion_tokens" in sent and "max_tokens" in overrides:
        limit = overrides["max_tokens"] if "max_tokens" in sent else overrides.pop("max_tokens")
        overrides["max_completion_tokens"] = limit
    return overrides


def agent_distribution(body: Mapping[str, Any], sampling: Mapping[str, Any]) -> list[str]:
    """The :data:`DISTRIBUTION_PARAMS` a request ``body`` sets and the trainer's ``sampling`` does
    not: what :func:`apply_sampling` takes out of it.

    >>> agent_distribution({"temperature": 0.2, "top_p": 0.5, "seed": 3}, {"temperature": 1.0})
    ['top_p']
    """
    return [name for name in DISTRIBUTION_PARAMS if body.get(name) is not None and sampling.get(name) is None]


def apply_sampling(body: MutableMapping[str, Any], sampling: Mapping[str, Any]) -> dict[str, Any]:
    """Set the trainer's ``sampling`` on a chat-completions request ``body`` (in place), over what it
    holds (:func:`sampling_overrides`), and take out the agent's :data:`DISTRIBUTION_PARAMS` the
    trainer did not set (:func:`agent_distribution`); return the fields set, as they were set.

    >>> body = {"messages": [], "top_p": 0.5, "min_p": 0.1, "stop": ["x"]}
    >>> apply_sampling(body, {"temperature": 1.0})
    {'temperature': 1.0}
    >>> body
    {'messages': [], 'stop': ['x'], 'temperature': 1.0}
    """
    for name in agent_distribution(body, sampling):
        del body[name]
    overrides = sampling_overrides(sampling, body)
    body.update(overrides)
    return overrides


def sampling_schema() -> dict[str, Any]:
    """The JSON schema of a set of sampling settings: an object of the known parameters, each
    nullable (null: not set), no other key."""
    properties = {}
    for name, param in SAMPLING_PARAMS.items():
        schema = dict(param.schema)
        if "type" in schema:
            schema["type"] = [schema["type"], "null"]
        else:
            schema = {"anyOf": [*schema["anyOf"], {"type": "null"}]}
        properties[name] = {**schema, "description": param.doc}
    return {"type": "object", "properties": properties, "additionalProperties": False}
