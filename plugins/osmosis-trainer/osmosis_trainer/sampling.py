"""The sampling settings a trainer sends with a rollout (``RolloutRequest.sampling_params``).

A policy-gradient trainer needs the rollouts sampled the way it computes its loss: its own
temperature, top-p and length cap, not the ones the agent code happens to send (TRL #4159, #6789).
``osmosis serve`` applies the settings a request carries to every model call of that rollout,
overriding what the agent sent. Each field is optional; only the ones set go on the wire.

>>> SamplingParams(temperature=1.0, top_p=0.95, max_tokens=512).to_json()
{'temperature': 1.0, 'top_p': 0.95, 'max_tokens': 512}
>>> SamplingParams.from_json({"temperature": 0.7, "stop": ["</answer>"]})
SamplingParams(temperature=0.7, stop=('</answer>',))
>>> SamplingParams.from_json({"temprature": 0.7})
Traceback (most recent call last):
...
ValueError: sampling_params.temprature: not a sampling setting (known: temperature, top_p, ...)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

__all__ = ["SAMPLING_FIELDS", "SamplingParams", "sampling_from_trainer"]

SAMPLING_FIELDS: Final = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
"""The wire names, in the order they are written; the same as vLLM's and SGLang's request fields."""


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"sampling_params.{name} must be a number, got {type(value).__name__} ({value!r})")
    if not math.isfinite(value):
        raise ValueError(f"sampling_params.{name} must be finite, got {value!r}")
    return float(value)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"sampling_params.{name} must be an integer, got {type(value).__name__} ({value!r})")
    return value


def _stop(value: Any) -> str | tuple[str, ...] | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise TypeError(f"sampling_params.stop must be a string or a list of strings, got {value!r}")


@attrs.frozen(kw_only=True)
class SamplingParams:
    """Sampling settings for every model call of one rollout; None leaves a setting to the agent.

    :param temperature: >= 0.
    :param top_p: in (0, 1].
    :param top_k: -1 (or 0) for off, else the number of tokens kept.
    :param min_p: in [0, 1].
    :param max_tokens: the most tokens one call generates (>= 1).
    :param stop: a string or strings that end a generation.
    :param seed: the sampler's seed.
    :param presence_penalty: in [-2, 2].
    :param frequency_penalty: in [-2, 2].
    :param repetition_penalty: > 0 (1 is off).
    :raises TypeError, ValueError: a value of the wrong type or out of range (the message names it).
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    stop: str | tuple[str, ...] | None = attrs.field(default=None, converter=_stop)
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None

    def __attrs_post_init__(self) -> None:
        checks: dict[str, tuple[str, Any]] = {
            "temperature": ("must be >= 0", lambda v: v >= 0),
            "top_p": ("must be in (0, 1]", lambda v: 0 < v <= 1),
            "min_p": ("must be in [0, 1]", lambda v: 0 <= v <= 1),
            "presence_penalty": ("must be in [-2, 2]", lambda v: -2 <= v <= 2),
            "frequency_penalty": ("must be in [-2, 2]", lambda v: -2 <= v <= 2),
            "repetition_penalty": ("must be > 0", lambda v: v > 0),
        }
        for name, (rule, ok) in checks.items():
            value = getattr(self, name)
            if value is not None and not ok(_number(name, value)):
                raise ValueError(f"sampling_params.{name} {rule}, got {value!r}")
        if self.top_k is not None and _integer("top_k", self.top_k) < -1:
            raise ValueError(f"sampling_params.top_k must be -1, 0 (off) or a count of tokens, got {self.top_k!r}")
        if self.max_tokens is not None and _integer("max_tokens", self.max_tokens) < 1:
            raise ValueError(f"sampling_params.max_tokens must be >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not -(2**63) <= _integer("seed", self.seed) < 2**63:
            raise ValueError(f"sampling_params.seed must fit in 64 bits (signed), got {self.seed!r}")

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}" for name, value in self._set())
        return f"SamplingParams({shown})"

    def _set(self) -> list[tuple[str, Any]]:
        return [(name, value) for name in SAMPLING_FIELDS if (value := getattr(self, name)) is not None]

    def to_json(self) -> dict[str, Any]:
        """The settings that are set, as the request's ``sampling_params`` object (``stop`` as a list)."""
        return {name: list(value) if isinstance(value, tuple) else value for name, value in self._set()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SamplingParams:
        """Read a ``sampling_params`` object. :raises ValueError, TypeError: an unknown key, a bad value."""
        if not isinstance(data, Mapping):
            raise TypeError(f"sampling_params must be an object, got {type(data).__name__}")
        for key in data:
            if key not in SAMPLING_FIELDS:
                known = ", ".join(SAMPLING_FIELDS)
                raise ValueError(f"sampling_params.{key}: not a sampling setting (known: {known})")
        return cls(**{key: value for key, value in data.items() if value is not None})


TOP_K_ALL: Final = 1 << 30
"""SGLang's "whole vocabulary" top-k (what its -1 becomes): read as off, -1."""


def _top_k_off(value: Any) -> Any:
    """``top_k`` with SGLang's whole vocabulary (:data:`TOP_K_ALL`) read as off (-1)."""
    return -1 if isinstance(value, int) and not isinstance(value, bool) and value >= TOP_K_ALL else value


def _never(key: str, value: Any) -> bool:
    return False


def sampling_from_trainer(
    params: Mapping[str, Any] | None,
    *,
    renames: Mapping[str, str] | None = None,
    silent: frozenset[str] = frozenset(),
    neutral: Callable[[str, Any], bool] = _never,
) -> tuple[SamplingParams | None, tuple[str, ...]]:
    """A trainer's sampling dict, in its own names, as a rollout's :class:`SamplingParams`, and the
    keys left out (for the caller to warn about): what every trainer adapter reads its trainer's
    settings with (SkyRL's, verl's, slime's SGLang dict).

    :param renames: the trainer's name of a field -> ours (``{"max_new_tokens": "max_tokens"}``).
    :param silent: keys left out without a word (not sampling settings of a rollout).
    :param neutral: ``(key, value) -> True`` for a value of a field osmosis serve does not apply that
        changes nothing (left out without a word).

    ``None`` values and an empty ``stop`` are left out; ``stop`` becomes a tuple; a ``top_k`` of
    SGLang's whole vocabulary (``1 << 30``) is -1 (off).

    >>> sampling_from_trainer({"temperature": 0.5, "max_new_tokens": 9, "n": 2},
    ...                       renames={"max_new_tokens": "max_tokens"})
    (SamplingParams(temperature=0.5, max_tokens=9), ('n',))

    :raises ValueError, TypeError: a value out of range or of the wrong type (the message names it).
    """
    if params is None:
        return None, ()
    if not isinstance(params, Mapping):
        raise TypeError(f"sampling_params must be a mapping, got {type(params).__name__}")
    renames = renames or {}
    taken: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in params.items():
        if value is None or key in silent:
            continue
        name = renames.get(key, key)
        if name in SAMPLING_FIELDS:
            if name == "stop" and not isinstance(value, str):
                value = list(value)
                if not value:
                    continue
            taken[name] = _top_k_off(value) if name == "top_k" else value
        elif not neutral(key, value):
            dropped.append(key)
    return (SamplingParams(**taken) if taken else None), tuple(sorted(dropped))
