"""The ambient rollout context: which rollout is running, which policy it calls, where its sample is.

A backend installs a :class:`RolloutContext` around each execution; agent integrations read it
to resolve the ``OsmosisRolloutModel`` placeholder and register the rollout's sample source.
It lives in a :class:`contextvars.ContextVar`, so it follows the rollout into tasks and threads
started from it, and nesting restores the outer context on exit.

>>> from osmosis_core import PolicyEndpoint
>>> policy = PolicyEndpoint("http://127.0.0.1:8000/v1", "my-model")
>>> with RolloutContext("r-1", policy) as ctx:
...     get_rollout_context() is ctx
True
>>> current_rollout_context() is None
True
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from osmosis_core.records import PolicyEndpoint, RolloutSample

__all__ = [
    "ROLLOUT_ID_HEADER",
    "RolloutContext",
    "SampleSource",
    "current_rollout_context",
    "get_rollout_context",
]

ROLLOUT_ID_HEADER = "X-Osmosis-Rollout-Id"
"""The header every model call carries so the endpoint can attribute it to its rollout."""


@runtime_checkable
class SampleSource(Protocol):
    """Something that can produce the rollout's sample when the workflow ends.

    An agent integration registers one per rollout::

        class HistorySource:
            def __init__(self, agent): self.agent = agent
            async def get_sample(self) -> RolloutSample:
                return RolloutSample(messages=list(self.agent.messages))

        get_rollout_context().set_sample_source(HistorySource(agent))
    """

    async def get_sample(self) -> RolloutSample: ...


_current: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar(
    "osmosis_rollout_context", default=None
)


class _CallableSource:
    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[], Awaitable[RolloutSample]]) -> None:
        self._fn = fn

    async def get_sample(self) -> RolloutSample:
        return await self._fn()


class RolloutContext:
    """The context of one running rollout (a context manager; re-entrant per instance is not allowed).

    :param rollout_id: the rollout's id, sent to the policy as ``X-Osmosis-Rollout-Id``.
    :param policy: the endpoint the rollout's model calls go to.
    """

    __slots__ = ("_sample_source", "_token", "extras", "metadata", "policy", "rollout_id")

    def __init__(self, rollout_id: str, policy: PolicyEndpoint, metadata: dict[str, Any] | None = None) -> None:
        self.rollout_id = rollout_id
        self.policy = policy
        self.metadata: dict[str, Any] = metadata if metadata is not None else {}
        self.extras: dict[str, Any] = {}
        """Per-rollout objects an integration keeps (a client view, a history): gone with the rollout."""
        self._sample_source: SampleSource | None = None
        self._token: contextvars.Token[RolloutContext | None] | None = None

    def __repr__(self) -> str:
        return f"RolloutContext(rollout_id={self.rollout_id!r}, policy={self.policy!r})"

    def __enter__(self) -> RolloutContext:
        if self._token is not None:
            raise RuntimeError(f"RolloutContext {self.rollout_id!r} is already active")
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        token, self._token = self._token, None
        if token is not None:
            _current.reset(token)

    def headers(self) -> dict[str, str]:
        """Headers for a model call: the policy's extra headers, the rollout id and the bearer key."""
        headers = dict(self.policy.headers)
        headers[ROLLOUT_ID_HEADER] = self.rollout_id
        if self.policy.api_key:
            headers["Authorization"] = f"Bearer {self.policy.api_key}"
        return headers

    @property
    def sample_source(self) -> SampleSource | None:
        """The registered sample source, if any."""
        return self._sample_source

    def set_sample_source(self, source: SampleSource | Callable[[], Awaitable[RolloutSample]]) -> None:
        """Register where this rollout's sample comes from. One rollout has at most one source.

        :raises ValueError: when a source is already registered.
        """
        if self._sample_source is not None:
            raise ValueError(
                f"rollout {self.rollout_id!r} already has a sample source ({self._sample_source!r}); "
                "one rollout yields one sample"
            )
        if not hasattr(source, "get_sample"):
            source = _CallableSource(source)
        self._sample_source = source

    async def get_sample(self) -> RolloutSample | None:
        """The sample of the registered source, or None when nothing was registered."""
        if self._sample_source is None:
            return None
        return await self._sample_source.get_sample()


def current_rollout_context() -> RolloutContext | None:
    """The active rollout context, or None outside a rollout."""
    return _current.get()


def get_rollout_context() -> RolloutContext:
    """The active rollout context.

    :raises RuntimeError: outside a rollout (no backend installed one).
    """
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(
            "no active rollout: this must run inside an AgentWorkflow executed by an osmosis backend "
            "(osmosis run, osmosis_core.testing.run_rollout, or ExecutionBackend.execute)"
        )
    return ctx
