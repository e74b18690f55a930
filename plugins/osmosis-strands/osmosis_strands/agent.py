"""``OsmosisStrandsAgent``: a ``strands.Agent`` with rollout-safe defaults that records its own sample.

Used in an :class:`osmosis_core.AgentWorkflow`, the agent

* calls the rollout's policy through :class:`~osmosis_strands.model.OsmosisRolloutModel` (its
  default model);
* registers itself as the rollout's sample source on its first invocation, so the workflow can
  return ``None``; the sample is built when the core asks for it, from the agent's history as it
  is then, so a failed or timed-out rollout still yields the history up to the failure;
* runs with defaults fit for training rollouts, each of which the author can override by
  passing the Strands argument: ``callback_handler=None`` (Strands' default prints the whole
  stream to stdout), ``conversation_manager=NullConversationManager()`` (the default sliding
  window trims history), ``retry_strategy=None`` (the default retries throttling 6 times with
  4 to 240 s backoff; the trainer decides about retries), and a turn limit of ``max_turns=8``
  model calls per invocation, passed to Strands as ``limits={"turns": N}``;
* fails the rollout when the turn limit is reached (:class:`~osmosis_strands.errors.TurnLimitExceeded`,
  category ``agent_error``) instead of returning a truncated answer as if it were final;
* refuses the synchronous ``agent(...)`` inside a running event loop (it would block every other
  rollout on the loop): ``await agent.invoke_async(...)`` is the call to make.

Unknown tools and invalid tool arguments are answered to the model as tool errors (Strands'
own behaviour) and the rollout goes on; the turn limit is the backstop. Strands' tracing is
OpenTelemetry and exports nothing unless the application installs a tracer provider.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar, cast

from pydantic import BaseModel
from strands import Agent
from strands.agent.agent_result import AgentResult
from strands.agent.conversation_manager import NullConversationManager
from strands.hooks import AfterInvocationEvent
from strands.models.openai import OpenAIModel

from osmosis_core import RolloutSample, current_rollout_context
from osmosis_strands.errors import TurnLimitExceeded
from osmosis_strands.messages import strands_messages
from osmosis_strands.model import OsmosisRolloutModel

__all__ = ["DEFAULT_MAX_TURNS", "OsmosisStrandsAgent"]

T = TypeVar("T", bound=BaseModel)

DEFAULT_MAX_TURNS = 8
"""Model calls one invocation may make unless ``max_turns`` says otherwise."""


class OsmosisStrandsAgent(Agent):
    """A Strands ``Agent`` for osmosis rollouts (see the module docstring for what it changes).

    :param model: the Strands model; default (and on ``None``) a fresh :class:`OsmosisRolloutModel`.
        A string is refused: Strands would read it as an Amazon Bedrock model id.
    :param max_turns: model calls per invocation (``limits={"turns": N}``); ``None`` for no
        limit. A ``limits`` mapping given to ``invoke_async``/``stream_async`` without
        ``"turns"`` gets this one added; one with ``"turns"`` wins.
    :param fail_on_turn_limit: raise :class:`TurnLimitExceeded` when the turn limit stops an
        invocation (default); ``False`` returns Strands' result (``stop_reason="limit_turns"``).
    :param record_sample: register this agent's history as the rollout's sample. Default: when
        the model is an :class:`OsmosisRolloutModel`. Pass ``False`` for helper agents when one
        rollout runs several (a rollout has one sample).
    :param messages: the history to start from, in Strands' shape or in the chat-completions shape
        of ``ctx.prompt`` (converted: :func:`osmosis_strands.messages.strands_messages`; a system
        message becomes ``system_prompt`` unless one is given).

    Every other argument is ``strands.Agent``'s.
    """

    def __init__(
        self,
        model: Any = None,
        *args: Any,
        max_turns: int | None = DEFAULT_MAX_TURNS,
        fail_on_turn_limit: bool = True,
        record_sample: bool | None = None,
        **kwargs: Any,
    ) -> None:
        if model is None:
            model = OsmosisRolloutModel()
        elif isinstance(model, str):
            raise TypeError(
                f"OsmosisStrandsAgent(model={model!r}): a model name would be read by Strands as an Amazon "
                "Bedrock model id; rollouts call the policy through OsmosisRolloutModel() (the default)"
            )
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1):
            raise ValueError(f"max_turns must be a whole number >= 1 or None, got {max_turns!r}")
        if kwargs.get("messages"):
            # the rollout's prompt as it comes (chat-completions shape) is taken too, as osmosis-ai did
            history, system = strands_messages(kwargs["messages"])
            kwargs["messages"] = history
            if system is not None and kwargs.get("system_prompt") is None:
                kwargs["system_prompt"] = system
        kwargs.setdefault("callback_handler", None)
        if "conversation_manager" not in kwargs and "context_manager" not in kwargs:
            kwargs["conversation_manager"] = NullConversationManager()
        kwargs.setdefault("retry_strategy", None)
        super().__init__(model, *args, **kwargs)
        self.max_turns = max_turns
        self.fail_on_turn_limit = fail_on_turn_limit
        self.record_sample = record_sample
        self.last_stop_reason: str | None = None
        """How the latest invocation ended (a Strands stop reason), or None when it raised."""
        self.add_hook(self._after_invocation, AfterInvocationEvent)

    # -- invocation -------------------------------------------------------------------------------

    def __call__(self, prompt: Any = None, **kwargs: Any) -> AgentResult:
        """Strands' synchronous call; refused inside a running event loop (use ``invoke_async``)."""
        _refuse_in_loop("agent(...)", "await agent.invoke_async(...)")
        return super().__call__(prompt, **kwargs)

    def structured_output(self, output_model: type[T], prompt: Any = None) -> T:
        """Strands' synchronous structured output; refused inside a running event loop."""
        _refuse_in_loop(
            "agent.structured_output(...)",
            "await agent.invoke_async(..., structured_output_model=...)",
        )
        return super().structured_output(output_model, prompt)

    async def stream_async(self, prompt: Any = None, *, limits: Any = None, **kwargs: Any) -> AsyncIterator[Any]:
        """Strands' ``stream_async`` (which ``invoke_async`` and ``agent(...)`` also go through).

        Adds the turn limit, registers the sample source, and raises :class:`TurnLimitExceeded`
        after the final event when the turn limit stopped the invocation. A failed model call
        reaches the caller as the model raised it (Strands does not wrap those).
        """
        limits = self._with_turn_limit(limits)
        self._register_sample_source()
        result: AgentResult | None = None
        # aclosing: a caller that stops early closes Strands' stream at once (it releases the agent's lock)
        stream = cast(AsyncGenerator[Any, None], super().stream_async(prompt, limits=limits, **kwargs))
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                if isinstance(event, dict) and isinstance(event.get("result"), AgentResult):
                    result = event["result"]
                yield event
        if result is not None and result.stop_reason == "limit_turns" and self.fail_on_turn_limit:
            turns = len(invocation.cycles) if (invocation := self.event_loop_metrics.latest_agent_invocation) else None
            limit = limits.get("turns") if isinstance(limits, dict) else None
            raise TurnLimitExceeded(
                f"the agent reached its turn limit ({limit} model calls) without a final answer; "
                "the history so far is the rollout's sample (raise max_turns, or pass "
                "fail_on_turn_limit=False to keep such rollouts as successes)",
                limit=limit,
                turns=turns,
            )

    def _with_turn_limit(self, limits: Any) -> Any:
        if self.max_turns is None:
            return limits
        if limits is None:
            return {"turns": self.max_turns}
        if "turns" not in limits:
            return {**limits, "turns": self.max_turns}
        return limits

    def _after_invocation(self, event: AfterInvocationEvent) -> None:
        result = getattr(event, "result", None)
        self.last_stop_reason = str(result.stop_reason) if result is not None else None

    # -- the sample -------------------------------------------------------------------------------

    def _register_sample_source(self) -> None:
        record = self.record_sample if self.record_sample is not None else isinstance(self.model, OsmosisRolloutModel)
        if not record:
            return
        ctx = current_rollout_context()
        if ctx is None:
            return
        current = ctx.sample_source
        if isinstance(current, _AgentSampleSource) and current.agent is self:
            return
        if current is not None:
            raise ValueError(
                f"rollout {ctx.rollout_id!r} already has a sample source ({current!r}), and one rollout yields one "
                "sample; when a rollout runs several agents, pass record_sample=False to all but the one whose "
                "history is the sample"
            )
        ctx.set_sample_source(_AgentSampleSource(self))

    def rollout_sample(self) -> RolloutSample:
        """The agent's history as a :class:`RolloutSample` (what the registered source gives the core).

        * ``messages``: ``agent.messages``, Strands' native (Bedrock-style) history, deep-copied
          and JSON-ready (``bytes`` of images and documents become base64 strings);
        * ``system_prompt``: the agent's system prompt (Strands keeps it out of the history);
        * ``chat_messages``: the chat-completions messages Strands' ``OpenAIModel`` sends for that
          history (``OpenAIModel.format_request_messages``), the system prompt first;
        * ``metrics``: ``turns`` (model calls over the agent's life) and, where the endpoint
          reported usage, ``input_tokens``, ``output_tokens`` and ``total_tokens``.
        """
        messages = self.messages
        chat: list[dict[str, Any]] | None
        try:
            chat = _jsonable(
                OpenAIModel.format_request_messages(
                    messages, self.system_prompt, system_prompt_content=self.system_prompt_content
                )
            )
        except (TypeError, KeyError):  # a content block the chat format cannot hold
            chat = None
        metrics: dict[str, Any] = {"turns": self.event_loop_metrics.cycle_count}
        usage = self.event_loop_metrics.accumulated_usage
        if usage.get("totalTokens"):
            metrics["input_tokens"] = usage.get("inputTokens", 0)
            metrics["output_tokens"] = usage.get("outputTokens", 0)
            metrics["total_tokens"] = usage.get("totalTokens", 0)
        return RolloutSample(
            messages=_jsonable(messages),
            system_prompt=self.system_prompt,
            chat_messages=chat,
            metrics=metrics,
        )


class _AgentSampleSource:
    """The rollout's sample source: the agent's history when the core asks (success or failure)."""

    __slots__ = ("agent",)

    def __init__(self, agent: OsmosisStrandsAgent) -> None:
        self.agent = agent

    def __repr__(self) -> str:
        return f"<OsmosisStrandsAgent {self.agent.name!r} sample source>"

    async def get_sample(self) -> RolloutSample:
        return self.agent.rollout_sample()


def _refuse_in_loop(call: str, instead: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{call} is synchronous and was called inside a running event loop (an async AgentWorkflow.run): "
        f"it would block every other rollout on the loop. Use `{instead}` instead"
    )


def _jsonable(value: Any) -> Any:
    """A JSON-ready deep copy: containers copied, bytes as base64, other objects as their str."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)
