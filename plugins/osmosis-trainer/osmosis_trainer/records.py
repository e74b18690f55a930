"""The records a rollout result carries to the trainer: its sample, its error and the error's category.

They mirror osmosis-core's records of the same names (the same fields, values and meaning), so a
trainer reads a result without the rollout runtime installed. They are separate classes: compare a
category by value (``error.category == "timeout"`` or ``== ErrorCategory.TIMEOUT``, both work
against either package's enum), not with ``is`` against osmosis-core's.

>>> info = ErrorInfo(ErrorCategory.TIMEOUT, "the workflow ran past 300s")
>>> str(info), info.category == "timeout"
('timeout: the workflow ran past 300s', True)
>>> RolloutSample(messages=[{"role": "user", "content": "2 * 3"}], reward=1).reward
1.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from osmosis_trainer._compat import StrEnum

__all__ = ["ErrorCategory", "ErrorInfo", "Message", "RolloutSample", "TrainerError", "jsonable"]

Message = dict[str, Any]
"""One chat message (``{"role": ..., "content": ...}``) or a framework-native history item."""


class TrainerError(Exception):
    """Base class of the errors osmosis-trainer raises on purpose (the rollout client's among them)."""


class ErrorCategory(StrEnum):
    """Why a rollout failed. Every failure carries one, with a message."""

    TIMEOUT = "timeout"
    """The workflow or the grader ran past its timeout."""
    VALIDATION_ERROR = "validation_error"
    """Bad input or output: a bad request, a wrong return type, a row with no label."""
    AGENT_ERROR = "agent_error"
    """Any other exception raised by the workflow or the grader."""
    POLICY_ERROR = "policy_error"
    """The model endpoint failed: unreachable, a 4xx/5xx answer, a broken stream."""
    INFRA_ERROR = "infra_error"
    """The machinery failed: the rollout server's backend (sandbox, actor, process), or the server
    could not give the result back (lost, unknown to it)."""
    CANCELLED = "cancelled"
    """The rollout was cancelled before it finished."""


@attrs.frozen
class ErrorInfo:
    """A failure's category and a one-line message (never holding a secret)."""

    category: ErrorCategory
    message: str

    def __str__(self) -> str:
        return f"{self.category}: {self.message}"


def _to_reward(value: Any) -> float | None:
    """None, or the value as a finite float."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"reward must be a number, got {type(value).__name__} ({value!r})")
    reward = float(value)
    if not math.isfinite(reward):
        raise ValueError(f"reward must be a finite float, got {reward!r}")
    return reward


@attrs.define
class RolloutSample:
    """The training sample one rollout yields: the agent's own message history, and its reward.

    ``messages`` is the framework-native history, JSON-serialisable; ``chat_messages`` an optional
    chat-completions-shaped copy; ``system_prompt`` is kept apart where the framework keeps it apart.
    """

    messages: list[Message] = attrs.field(factory=list)
    system_prompt: str | None = None
    chat_messages: list[Message] | None = None
    reward: float | None = attrs.field(default=None, converter=_to_reward, on_setattr=attrs.setters.convert)
    metrics: dict[str, Any] = attrs.field(factory=dict)

    def readable_messages(self) -> list[Message]:
        """The chat-shaped history when there is one, else the native one."""
        return self.chat_messages if self.chat_messages is not None else self.messages


def jsonable(value: Any) -> Any:
    """``value`` with numpy's scalars and arrays as Python's, mappings as dicts and sequences as lists:
    what a trainer's row holds (verl's rows come from numpy object arrays: an ``index`` is an
    ``int64``, a ``raw_prompt`` may be an array of dicts; a dataset's metadata may hold numpy
    values) made fit for a rollout request's JSON.

    >>> import array
    >>> jsonable({"a": (1, array.array("i", [2]))})
    {'a': [1, [2]]}
    """
    if isinstance(value, (str, bytes, bool, int, float)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    tolist = getattr(value, "tolist", None)
    if callable(tolist):  # a numpy scalar or array (an array.array too)
        return jsonable(tolist())
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
