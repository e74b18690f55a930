"""``OsmosisRolloutModel``: the Strands model placeholder resolved from the running rollout.

Rollout code never names a model. It puts ``OsmosisRolloutModel()`` where a Strands model goes,
and every model call is sent to the policy endpoint of the rollout that is running at that moment
(base URL, model name, key and the ``X-Osmosis-Rollout-Id`` header, all from the active
:class:`osmosis_core.RolloutContext`). Outside a rollout a call raises ``RuntimeError``; there is
no fallback to a public API.

Per call, the placeholder delegates to Strands' own ``OpenAIModel`` built with
``client=rollout_openai_client()``: the rollout's view of the one pooled ``AsyncOpenAI`` of the
event loop (``max_retries=0``). The delegate is made once per rollout (and event loop) and kept in
``RolloutContext.extras``. Strands' ``client_args=`` path is never used: it builds and closes an
``AsyncOpenAI`` on every model call (about 57 ms of CPU each).

What the delegate adds to ``OpenAIModel``:

* an endpoint failure becomes :class:`osmosis_core.PolicyError` (status and endpoint in the
  message, never the key), category ``policy_error``;
* a response (streamed or not) that ends without a ``finish_reason`` is a broken stream and a
  ``PolicyError`` too (plain Strands records it as an empty ``end_turn`` answer);
* a tool call without an id or a name raises :class:`~osmosis_strands.errors.MalformedToolCall`
  (plain Strands skips it and calls the model again, forever without a turn limit);
* ``"tools": []`` is not sent when the agent has no tools (OpenAI rejects an empty array).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any, TypeVar

from pydantic import BaseModel
from strands.models.model import Model
from strands.models.openai import OpenAIModel
from strands.types.content import Messages
from strands.types.exceptions import ContextWindowOverflowException, ModelThrottledException
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolSpec

from osmosis_core import PolicyError, RolloutContext, current_rollout_context
from osmosis_openai import policy_error, rollout_openai_client
from osmosis_strands.errors import MalformedToolCall

__all__ = ["OsmosisRolloutModel"]

T = TypeVar("T", bound=BaseModel)

PLACEHOLDER_ID = "OsmosisRolloutModel"
"""The ``model_id`` the placeholder reports outside a rollout (inside, the rollout's model name)."""

_CONFIG_KEYS = frozenset({"params", "stream", "context_window_limit", "cache_config"})
_EXTRAS_PREFIX = "osmosis_strands.model."
# Strands logs warnings (an unknown tool, unparsable tool arguments, throttling); without this they
# would reach stderr through logging's last-resort handler in the middle of `osmosis run`'s progress
# display. Records still propagate to any handler the application configures.
logging.getLogger("strands").addHandler(logging.NullHandler())

# Strands turns a missing finish_reason into this stop reason; no OpenAI-compatible server sends it.
_NO_FINISH_REASON = "end_turn"


class OsmosisRolloutModel(Model):
    """A Strands model that calls the running rollout's policy (a placeholder, resolved per call).

    :param stream: stream the chat completion, or not (the default here, unlike Strands': a rollout
        has nobody watching tokens arrive, and one response costs far less CPU to parse than a
        stream of chunks, about 1.5 ms per rollout; see bench/agents_throughput.py).
    :param params: request parameters merged into every chat-completions request.
    :param sampling: more request parameters by name, e.g. ``temperature=0.7, top_p=0.95,
        max_tokens=1024, seed=1, extra_body={...}``; they win over ``params``.

    The model name is never given here: it is the rollout's (``ctx.policy.model``).

    >>> model = OsmosisRolloutModel(temperature=0.2, max_tokens=256)
    >>> model.get_config()["params"]
    {'temperature': 0.2, 'max_tokens': 256}
    """

    def __init__(self, *, stream: bool = False, params: Mapping[str, Any] | None = None, **sampling: Any) -> None:
        for key in ("model_id", "model", "client", "client_args"):
            if key in sampling:
                raise TypeError(
                    f"OsmosisRolloutModel takes no {key!r}: the model name, endpoint and client come from "
                    "the running rollout (its policy endpoint)"
                )
        self.config: dict[str, Any] = {"params": {**(params or {}), **sampling}, "stream": bool(stream)}
        self._version = 0

    def __repr__(self) -> str:
        return f"OsmosisRolloutModel(stream={self.config['stream']!r}, params={self.config['params']!r})"

    def update_config(self, **model_config: Any) -> None:
        """Change ``params``, ``stream``, ``context_window_limit`` or ``cache_config``."""
        unknown = sorted(set(model_config) - _CONFIG_KEYS)
        if unknown:
            raise TypeError(
                f"OsmosisRolloutModel.update_config got {unknown}; it accepts {sorted(_CONFIG_KEYS)} "
                "(the model name comes from the running rollout)"
            )
        self.config.update(model_config)
        self._version += 1

    def get_config(self) -> dict[str, Any]:
        """The config, with ``model_id`` the running rollout's model name (the placeholder's outside one)."""
        ctx = current_rollout_context()
        return {**self.config, "model_id": ctx.policy.model if ctx is not None else PLACEHOLDER_ID}

    def _delegate(self) -> _RolloutOpenAIModel:
        """The rollout's ``OpenAIModel`` for this placeholder, made on first use and kept per rollout."""
        ctx = current_rollout_context()
        if ctx is None:
            raise RuntimeError(
                "OsmosisRolloutModel was called outside a rollout: it is a placeholder for the policy of the "
                "running rollout and has no model of its own. Call the agent inside an AgentWorkflow run by an "
                "osmosis backend (`osmosis run`, osmosis_core.testing.run_rollout, ExecutionBackend.execute); "
                "outside one, give the agent a real Strands model instead"
            )
        loop = asyncio.get_running_loop()
        key = _EXTRAS_PREFIX + str(id(self))
        entry = ctx.extras.get(key)
        # the entry holds the placeholder itself, so its id cannot be reused while the rollout lives
        if entry is not None and entry[0] is self and entry[1] == self._version and entry[2] is loop:
            return entry[3]  # type: ignore[no-any-return]
        config = {k: v for k, v in self.config.items() if v is not None}
        config["params"] = dict(config.get("params") or {})
        client = rollout_openai_client()  # the rollout's view for this loop
        delegate = _RolloutOpenAIModel(ctx, client=client, model_id=ctx.policy.model, **config)
        ctx.extras[key] = (self, self._version, loop, delegate)
        return delegate

    async def stream(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None = None,
        system_prompt: str | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[StreamEvent, None]:
        """Stream one model call to the running rollout's policy (Strands ``Model.stream``)."""
        async for event in _policy_errors(self._delegate().stream(messages, tool_specs, system_prompt, **kwargs)):
            yield event

    async def structured_output(
        self, output_model: type[T], prompt: Messages, system_prompt: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[dict[str, T | Any], None]:
        """Strands ``Model.structured_output``, against the running rollout's policy."""
        delegate = self._delegate()
        async for event in _policy_errors(delegate.structured_output(output_model, prompt, system_prompt, **kwargs)):
            yield event


async def _policy_errors[E](events: AsyncGenerator[E, None]) -> AsyncGenerator[E, None]:
    """The delegate's events, with its failures mapped by :func:`_mapped` (endpoint failures -> PolicyError)."""
    try:
        async with aclosing(events):  # closed with this generator, even when the caller stops early
            async for event in events:
                yield event
    except (PolicyError, MalformedToolCall):
        raise
    except Exception as exc:
        mapped = _mapped(exc)
        if mapped is exc:
            raise
        raise mapped from mapped.__cause__


def _keeps_type(exc: BaseException) -> bool:
    """Strands exceptions that its own machinery reacts to (retry on throttling, context reduction)."""
    return isinstance(exc, (ModelThrottledException, ContextWindowOverflowException))


def _mapped(exc: Exception) -> Exception:
    """The exception to raise for a failed model call.

    An HTTP or ``openai`` failure anywhere in the cause chain becomes a :class:`PolicyError`
    chained from it. Throttling and context-overflow exceptions keep their Strands type (a retry
    strategy or a conversation manager the author set may handle them) and get the
    ``PolicyError`` put into their cause chain, where ``osmosis_core.errors.error_info`` finds it.
    Anything else is returned unchanged.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        mapped = policy_error(cur)
        if mapped is not None:
            mapped.__cause__ = cur
            if _keeps_type(exc):
                exc.__cause__ = mapped
                return exc
            return mapped
        cur = cur.__cause__ or cur.__context__
    return exc


class _RolloutOpenAIModel(OpenAIModel):
    """Strands' ``OpenAIModel`` on the rollout's client, with the checks a rollout needs."""

    def __init__(self, ctx: RolloutContext, **config: Any) -> None:
        super().__init__(**config)
        self._endpoint = ctx.policy.chat_completions_url

    def format_request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        request = super().format_request(*args, **kwargs)
        if not request.get("tools"):  # Strands sends "tools": [] with no tools; OpenAI rejects it
            request.pop("tools", None)
            request.pop("tool_choice", None)
        return request

    def format_chunk(self, event: dict[str, Any], **kwargs: Any) -> StreamEvent:
        kind = event["chunk_type"]
        if kind == "content_start" and event.get("data_type") == "tool":
            call = event["data"]
            function = getattr(call, "function", None)
            if not getattr(call, "id", None) or not getattr(function, "name", None):
                raise MalformedToolCall(
                    f"the policy at {self._endpoint} sent a tool call without an "
                    f"{'id' if not getattr(call, 'id', None) else 'function name'} "
                    f"(name={getattr(function, 'name', None)!r}, id={getattr(call, 'id', None)!r}); "
                    "it cannot be answered, so the rollout stops here instead of asking the model again"
                )
        elif kind == "message_stop" and event.get("data") == _NO_FINISH_REASON:
            raise PolicyError(
                f"policy endpoint {self._endpoint} broke the response: it ended without a finish_reason "
                "(a stream cut short or a server error mid-answer)",
                endpoint=self._endpoint,
            )
        return super().format_chunk(event, **kwargs)
