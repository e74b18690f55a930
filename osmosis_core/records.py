"""The records that cross the seams: requests, samples, results and their error categories.

They are attrs classes. ``osmosis_core.wire.result_line`` writes a finished result as a
``results.jsonl`` line; the rollout server's wire format will share one converter with it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

import attrs

from osmosis_core.sampling import check_sampling

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "RETRYABLE_CATEGORIES",
    "ErrorCategory",
    "ErrorInfo",
    "ExecutionRequest",
    "ExecutionResult",
    "ExecutionStage",
    "ExecutionStatus",
    "Message",
    "PolicyEndpoint",
    "RolloutSample",
    "message_text",
]

DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
"""The largest response body read from a policy endpoint by default (``[policy] max_response_mb``):
past it the call fails with ``policy_error`` instead of the process holding the whole body."""

Message = dict[str, Any]
"""One chat message (``{"role": ..., "content": ...}``) or a framework-native history item."""


class ErrorCategory(enum.StrEnum):
    """Why a rollout failed. Every failure carries one, with a message."""

    TIMEOUT = "timeout"
    """The workflow or the grader ran past its timeout (``TimeoutError``)."""
    VALIDATION_ERROR = "validation_error"
    """Bad input or output: ``ValueError``, ``TypeError``, ``AssertionError``, a row with no label."""
    AGENT_ERROR = "agent_error"
    """Any other exception raised by the workflow or the grader."""
    POLICY_ERROR = "policy_error"
    """The model endpoint failed: unreachable, a 4xx/5xx answer, a broken stream."""
    INFRA_ERROR = "infra_error"
    """The backend's own machinery failed (sandbox, actor, process)."""
    CANCELLED = "cancelled"
    """The rollout was cancelled before it finished."""


RETRYABLE_CATEGORIES: frozenset[ErrorCategory] = frozenset(
    {ErrorCategory.POLICY_ERROR, ErrorCategory.INFRA_ERROR, ErrorCategory.TIMEOUT, ErrorCategory.CANCELLED}
)
"""Failures a second attempt may not repeat (what ``osmosis run --retry-failed`` runs again by default)."""


class ExecutionStatus(enum.StrEnum):
    """How one stage of a rollout ended."""

    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"


class ExecutionStage(enum.StrEnum):
    """Which stage a result reports: the agent workflow or the grader."""

    WORKFLOW = "workflow"
    GRADER = "grader"


@attrs.frozen
class ErrorInfo:
    """A failure's category and a one-line message (never holding a secret)."""

    category: ErrorCategory
    message: str

    def __str__(self) -> str:
        return f"{self.category}: {self.message}"


def _to_sampling(value: Any) -> dict[str, Any] | None:
    """None, or the settings checked (:func:`~osmosis_core.sampling.check_sampling`); none set is None."""
    if value is None:
        return None
    return check_sampling(value) or None


@attrs.frozen
class PolicyEndpoint:
    """Where a rollout reaches its policy model: an OpenAI-compatible chat-completions API.

    ``base_url`` is the API root (``http://127.0.0.1:8000/v1``); clients post to
    ``{base_url}/chat/completions``. The API key and the headers are kept out of ``repr`` and out of
    every file (:meth:`secrets`).

    ``sampling`` is the trainer's sampling settings for the rollout (``osmosis serve``'s
    ``sampling_params``): every model call to this endpoint gets them over what the agent asked for
    (:mod:`osmosis_core.sampling`). They are no secret: they travel with the endpoint to a worker, an
    actor or a Harbor trial.

    >>> PolicyEndpoint("http://127.0.0.1:8000/v1", "m", sampling={"temperature": 1, "top_k": None})
    PolicyEndpoint(base_url='http://127.0.0.1:8000/v1', model='m', sampling={'temperature': 1.0})
    """

    base_url: str
    model: str
    api_key: str | None = attrs.field(default=None, repr=False)
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    """Extra headers for every call; their values are treated as secrets like the key."""
    max_response_bytes: int = attrs.field(default=DEFAULT_MAX_RESPONSE_BYTES, repr=False)
    """The largest response body read from the endpoint; a larger one is a ``policy_error``."""
    sampling: dict[str, Any] | None = attrs.field(default=None, kw_only=True, converter=_to_sampling)
    """The trainer's sampling settings, set over the agent's on every call (None: the agent's own go out)."""

    def secrets(self) -> tuple[str, ...]:
        """The values no message, log line or file may show: the key and the extra headers' values."""
        return tuple(v for v in (self.api_key, *self.headers.values()) if v)

    @property
    def chat_completions_url(self) -> str:
        """The full URL of the chat-completions route."""
        return self.base_url.rstrip("/") + "/chat/completions"


def _to_reward(value: Any) -> float | None:
    """None, or the value as a finite float (a converter that also validates: one call per set)."""
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

    ``messages`` is the framework-native history (plain chat dicts, Strands content blocks,
    OpenAI Responses items), JSON-serialisable. ``chat_messages`` is an optional
    chat-completions-shaped copy that graders can read the same way for every framework.
    ``system_prompt`` is kept apart where the framework keeps it apart.

    >>> s = RolloutSample(messages=[{"role": "user", "content": "2 * 3"}])
    >>> s.reward = 1
    >>> s.reward
    1.0
    """

    messages: list[Message] = attrs.field(factory=list)
    system_prompt: str | None = None
    chat_messages: list[Message] | None = None
    reward: float | None = attrs.field(default=None, converter=_to_reward, on_setattr=attrs.setters.convert)
    metrics: dict[str, Any] = attrs.field(factory=dict)

    def readable_messages(self) -> list[Message]:
        """The chat-shaped history when there is one, else the native one."""
        return self.chat_messages if self.chat_messages is not None else self.messages

    def last_text(self) -> str:
        """The text content of the last message, flattening content-part lists (a grader helper)."""
        msgs = self.readable_messages()
        return message_text(msgs[-1]) if msgs else ""


def message_text(message: Mapping[str, Any]) -> str:
    """The text of one message: a string content, or the joined text parts of a content list."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = (part.get("text") if isinstance(part, Mapping) else part for part in content)
        return "".join(text for text in texts if isinstance(text, str))
    return ""


@attrs.frozen
class ExecutionRequest:
    """One rollout to execute: the prompt, the row's label and metadata, and the policy to call."""

    rollout_id: str
    prompt: list[Message]
    policy: PolicyEndpoint
    label: Any = None
    metadata: dict[str, Any] = attrs.field(factory=dict)
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    grade: bool = True
    """Run the grader stage (when a grader is configured and the row has a label); ``False`` skips it."""


@attrs.define
class ExecutionResult:
    """How one stage (workflow or grader) of one rollout ended.

    A result whose status is not ``success`` always has an ``error``. ``timings`` holds seconds
    per phase (``workflow``, ``grader``, ``queued``).
    """

    rollout_id: str
    stage: ExecutionStage
    status: ExecutionStatus
    sample: RolloutSample | None = None
    error: ErrorInfo | None = None
    timings: dict[str, float] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.status is not ExecutionStatus.SUCCESS and self.error is None:
            raise ValueError("a failed or cancelled result needs an error (category and message)")

    @property
    def ok(self) -> bool:
        """True when this stage succeeded."""
        return self.status is ExecutionStatus.SUCCESS

    @property
    def reward(self) -> float | None:
        """The sample's reward, if any."""
        return self.sample.reward if self.sample is not None else None
