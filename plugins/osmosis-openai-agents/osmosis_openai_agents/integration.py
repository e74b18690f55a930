"""The OpenAI Agents SDK side of osmosis: the :class:`OsmosisRolloutModel` placeholder and :class:`OsmosisAgent`.

This module imports the Agents SDK; ``osmosis_openai_agents`` loads it on first use of these names.

How a rollout runs
------------------
The author writes the SDK's normal code inside an :class:`~osmosis_core.AgentWorkflow`::

    agent = OsmosisAgent(name="calculator", instructions="...", tools=[multiply])
    result = await Runner.run(agent, ctx.prompt, max_turns=8)        # or Runner.run_streamed(...)

* **The model is resolved per call.** :class:`OsmosisRolloutModel` is an ``agents.Model`` that, on
  every ``get_response`` / ``stream_response``, delegates to an ``OpenAIChatCompletionsModel`` for
  the *active* rollout: model name ``ctx.policy.model``, client ``rollout_openai_client()`` (the
  rollout's view of one pooled ``AsyncOpenAI`` per event loop, ``max_retries=0``, the
  ``X-Osmosis-Rollout-Id`` header). The delegate is made once per rollout and kept in
  ``RolloutContext.extras``, so no client is built per call, and one agent object (even a
  module-level one) serves any number of concurrent rollouts. Outside a rollout the placeholder
  raises ``RuntimeError``; it never falls back to a public API.
* **The sample is registered by the placeholder.** On its first call in a rollout it registers
  itself as the rollout's sample source (unless the workflow registered another one). Every call
  records ``input + response.output``; the latest call's full history wins. The sample is a
  :class:`~osmosis_core.RolloutSample` whose ``messages`` are the SDK's Responses-format items
  (what ``result.to_input_list()`` gives, JSON-ready, bytes as base64), ``system_prompt`` the
  agent's instructions, ``chat_messages`` the chat-completions messages the policy was sent
  (system message first, then ``Converter.items_to_messages(messages)``), and ``metrics``
  ``turns`` (model responses) plus ``input_tokens`` / ``output_tokens`` / ``total_tokens`` when
  the endpoint reports usage. The workflow can therefore return ``None``.

Notes
-----
* ``ctx.prompt`` holds the row's system prompt as a ``system`` message. Passing it to
  ``Runner.run`` works (the SDK sends it as is); the template passes it as the agent's
  ``instructions`` instead, so that ``sample.system_prompt`` holds it.
* Every agent of a handoff chain must call the policy: use :class:`OsmosisAgent` (or the
  placeholder) for each, or ``RunConfig(model=OsmosisRolloutModel())`` for all. A plain
  ``Agent`` without a model would go to the SDK's default model on api.openai.com.
* With your own ``max_turns`` error handler that returns a final output, the run succeeds and the
  sample is the history up to the limit (the handler's synthesized answer is not in it).

Safe defaults (each one can be overridden)
------------------------------------------
* **Tracing off.** ``agents.set_tracing_disabled(True)`` is called once, when the first
  placeholder or :class:`OsmosisAgent` is made: otherwise the SDK exports traces (prompts,
  answers) to api.openai.com whenever ``OPENAI_API_KEY`` is set. Call
  ``set_tracing_disabled(False)`` afterwards, with your own trace processor, to trace.
* **An unknown tool is answered as an error to the model** (``"Tool 'x' not found."``) and the
  run goes on. The SDK reads this only from ``RunConfig.tool_not_found_behavior``, whose default
  raises, so osmosis wraps the SDK's default runner (``agents.run.set_default_agent_runner``,
  installed with the tracing switch): for a run whose agent is an :class:`OsmosisAgent` or uses
  the placeholder, ``Runner.run`` / ``run_streamed`` / ``run_sync`` get
  ``tool_not_found_behavior=OsmosisAgent.tool_not_found_behavior`` (default
  ``"return_error_to_model"``) unless the ``RunConfig`` you pass asks for
  ``"return_error_to_model"`` itself. Set ``OsmosisAgent(tool_not_found_behavior="raise_error")``
  to fail instead. Other runs are passed through untouched.
* **A turn limit.** The SDK's ``max_turns`` (``Runner.run(..., max_turns=N)``, default 10) is the
  limit. Reaching it raises the SDK's ``MaxTurnsExceeded``, so the rollout **fails** with
  category ``agent_error``; the partial history (including the last turn's tool results, taken
  from the SDK's run data through a ``max_turns`` error handler that the wrapper chains in front
  of yours) stays registered as the sample, for the backend to attach to the failed result.
* **A tool call without an id** ends the rollout with :class:`ToolCallWithoutIdError` (a
  ``ValueError``: category ``validation_error``) after one request, instead of an SDK error deep
  in the run or a loop.
* **No hidden retries**: the core client has ``max_retries=0`` and the SDK's runner retries are
  opt-in (``ModelSettings.retry``), so none happen unless you ask.
* **Policy failures** (endpoint unreachable, a 4xx/5xx answer, a stream broken mid-answer) are
  raised as :class:`osmosis_core.PolicyError` (``from`` the original error): category
  ``policy_error``, the message names the status and endpoint, never the key.
* **``Runner.run_sync`` inside a rollout is refused** with a ``RuntimeError`` that says to
  ``await Runner.run(...)``: the workflow already runs on the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import enum
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pydantic
from agents import Agent, Model, ModelSettings, OpenAIChatCompletionsModel, set_tracing_disabled
from agents.exceptions import ModelBehaviorError
from agents.items import ModelResponse
from agents.models.chatcmpl_converter import Converter
from agents.run import AgentRunner, get_default_agent_runner, set_default_agent_runner
from agents.run_config import RunConfig, ToolNotFoundBehavior
from agents.usage import Usage

from osmosis_core import RolloutSample, current_rollout_context
from osmosis_openai import policy_error, rollout_openai_client

if TYPE_CHECKING:
    from agents.agent_output import AgentOutputSchemaBase
    from agents.handoffs import Handoff
    from agents.items import TResponseInputItem, TResponseStreamEvent
    from agents.models.interface import ModelTracing
    from agents.tool import Tool
    from openai.types.responses.response_prompt_param import ResponsePromptParam

__all__ = ["OsmosisAgent", "OsmosisRolloutModel", "ToolCallWithoutIdError"]

_STATE_KEY = "osmosis_openai_agents.rollout"
_SETTINGS_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelSettings))

_OUTSIDE_ROLLOUT = (
    "OsmosisRolloutModel is a placeholder for the rollout's policy model and was called outside a rollout. "
    "Call the agent inside an AgentWorkflow run by an osmosis backend (osmosis run, "
    "osmosis_core.testing.run_rollout, ExecutionBackend.execute); outside one, give the agent a real model, "
    "e.g. agents.OpenAIChatCompletionsModel(model=..., openai_client=AsyncOpenAI(...))"
)
_OTHER_LOOP = (
    "OsmosisRolloutModel was called on another event loop than the one its rollout runs on "
    "(Runner.run_sync in a worker thread?). Inside an AgentWorkflow use `await Runner.run(agent, ...)`."
)
_RUN_SYNC = (
    "Runner.run_sync() cannot be used inside an osmosis rollout: AgentWorkflow.run is async and already runs "
    "on the event loop. Use `result = await Runner.run(agent, ctx.prompt, ...)` (or Runner.run_streamed) instead."
)


class ToolCallWithoutIdError(ModelBehaviorError, ValueError):
    """The policy answered with a tool call that has no id, so no tool result could refer to it.

    Raised by :class:`OsmosisRolloutModel` after the one request that produced it; a ``ValueError``,
    so the rollout fails with category ``validation_error`` (bad model output).
    """


# -- the per-rollout state: the delegate model and the recorded history (the sample source) --------


class _RolloutRecord:
    """One rollout's delegate model and latest history; registered as the rollout's sample source."""

    __slots__ = (
        "_calls",
        "_items",
        "_latest",
        "_output",
        "delegate",
        "input_tokens",
        "loop",
        "output_tokens",
        "reported_usage",
        "system_prompt",
        "total_tokens",
        "turns",
    )

    def __init__(self, delegate: OpenAIChatCompletionsModel, loop: asyncio.AbstractEventLoop) -> None:
        self.delegate = delegate
        self.loop = loop
        self.system_prompt: str | None = None
        self.turns = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.total_tokens = 0
        self.reported_usage = False
        self._items: list[Any] = []
        self._output: list[Any] = []
        self._calls = 0
        self._latest = 0

    def __repr__(self) -> str:
        return f"<osmosis_openai_agents history: {len(self._items) + len(self._output)} items, {self.turns} turns>"

    def start_call(self, system_prompt: str | None, model_input: str | list[TResponseInputItem]) -> int:
        """A model call starts: its input becomes the latest history. Returns the call's token."""
        self._calls += 1
        self._latest = self._calls
        self.system_prompt = system_prompt
        self._items = [{"role": "user", "content": model_input}] if isinstance(model_input, str) else list(model_input)
        self._output = []
        return self._calls

    def finish_call(self, token: int, output: list[Any], usage: Any) -> None:
        """A model call answered: count it and, if it is still the latest, append its output."""
        self.turns += 1
        if usage is not None:
            inp = getattr(usage, "input_tokens", 0) or 0
            out = getattr(usage, "output_tokens", 0) or 0
            if inp or out:
                self.reported_usage = True
                self.input_tokens += inp
                self.output_tokens += out
                self.total_tokens += getattr(usage, "total_tokens", 0) or (inp + out)
        if token == self._latest:
            self._output = list(output)

    def replace_history(self, items: list[Any]) -> None:
        """The SDK's own full history of a run that stopped (the max-turns handler)."""
        self._calls += 1
        self._latest = self._calls
        self._items = list(items)
        self._output = []

    async def get_sample(self) -> RolloutSample:
        items = _jsonable(self._items)
        if self._output:
            out = ModelResponse(output=self._output, usage=Usage(), response_id=None).to_input_items()
            items.extend(_jsonable(out))
        chat: list[Any] | None
        try:
            chat = _jsonable(
                Converter.items_to_messages(
                    items, model=str(self.delegate.model), base_url=str(self.delegate._client.base_url)
                )
            )
        except Exception:  # an item kind chat completions cannot express: keep the native history only
            chat = None
        if chat is not None and self.system_prompt:
            chat.insert(0, {"role": "system", "content": self.system_prompt})
        metrics: dict[str, Any] = {"turns": self.turns}
        if self.reported_usage:
            metrics.update(
                input_tokens=self.input_tokens, output_tokens=self.output_tokens, total_tokens=self.total_tokens
            )
        return RolloutSample(messages=items, system_prompt=self.system_prompt, chat_messages=chat, metrics=metrics)


def _rollout_record() -> _RolloutRecord:
    """The active rollout's record, made (and registered as its sample source) on first use."""
    ctx = current_rollout_context()
    if ctx is None:
        raise RuntimeError(_OUTSIDE_ROLLOUT)
    loop = asyncio.get_running_loop()
    record: _RolloutRecord | None = ctx.extras.get(_STATE_KEY)
    if record is None:
        delegate = OpenAIChatCompletionsModel(model=ctx.policy.model, openai_client=rollout_openai_client())
        record = ctx.extras[_STATE_KEY] = _RolloutRecord(delegate, loop)
        if ctx.sample_source is None:  # the workflow may have registered its own: one source per rollout
            ctx.set_sample_source(record)
    elif record.loop is not loop:
        raise RuntimeError(_OTHER_LOOP)
    return record


def _jsonable(value: Any) -> Any:
    """A JSON-ready copy: pydantic models dumped, bytes as base64 text, tuples as lists."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, pydantic.BaseModel):
        return _jsonable(value.model_dump(exclude_unset=True))
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    return str(value)


def _translate(exc: Exception) -> Exception | None:
    """The osmosis error for a failure of the delegate, or None to let it through unchanged."""
    if isinstance(exc, pydantic.ValidationError) and any(
        "call_id" in err.get("loc", ()) for err in exc.errors(include_url=False)
    ):
        return ToolCallWithoutIdError("the policy sent a tool call without an id (function.call_id is missing)")
    return policy_error(exc)


def _check_call_ids(output: list[Any]) -> None:
    for item in output:
        if getattr(item, "type", None) == "function_call" and not getattr(item, "call_id", None):
            name = getattr(item, "name", "?")
            raise ToolCallWithoutIdError(f"the policy sent a tool call to {name!r} without an id")


# -- the placeholder model -------------------------------------------------------------------------


class OsmosisRolloutModel(Model):
    """Placeholder for the rollout's policy model, resolved when the model is called.

    Put it where a model goes (``OsmosisAgent`` does by default;
    ``agents.Agent(model=OsmosisRolloutModel())`` and ``RunConfig(model=OsmosisRolloutModel())`` work
    too). Each call delegates to ``OpenAIChatCompletionsModel(model=ctx.policy.model,
    openai_client=rollout_openai_client())`` for the active rollout and records the history as the
    rollout's sample (see the module docstring).

    Sampling parameters given here are defaults under the agent's ``model_settings`` (a value set
    there wins)::

        OsmosisRolloutModel(temperature=1.0, top_p=0.95, max_tokens=1024)
        OsmosisRolloutModel(top_k=20)              # not a ModelSettings field: sent in extra_body
        OsmosisRolloutModel(settings=ModelSettings(parallel_tool_calls=False))

    ``include_usage`` defaults to True, so streamed answers report token usage too.

    :raises RuntimeError: when called outside a rollout (never a fallback to a public API).
    """

    def __init__(self, settings: ModelSettings | None = None, **params: Any) -> None:
        _ensure_safe_defaults()
        base = ModelSettings(include_usage=True)
        if settings is not None:
            base = base.resolve(settings)
        known = {k: v for k, v in params.items() if k in _SETTINGS_FIELDS}
        extra = {k: v for k, v in params.items() if k not in _SETTINGS_FIELDS}
        if known:
            base = base.resolve(ModelSettings(**known))
        if extra:
            base = base.resolve(ModelSettings(extra_body={**(base.extra_body or {}), **extra}))  # type: ignore[dict-item]
        self.settings = base

    def __repr__(self) -> str:
        set_fields = {f: v for f in sorted(_SETTINGS_FIELDS) if (v := getattr(self.settings, f)) is not None}
        return f"OsmosisRolloutModel({', '.join(f'{k}={v!r}' for k, v in set_fields.items())})"

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: ResponsePromptParam | None = None,
    ) -> ModelResponse:
        record = _rollout_record()
        token = record.start_call(system_instructions, input)
        try:
            response = await record.delegate.get_response(
                system_instructions,
                input,
                self.settings.resolve(model_settings),
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
        except Exception as exc:
            mapped = _translate(exc)
            if mapped is None:
                raise
            raise mapped from exc
        record.finish_call(token, response.output, response.usage)
        _check_call_ids(response.output)
        return response

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: ResponsePromptParam | None = None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        record = _rollout_record()
        token = record.start_call(system_instructions, input)
        stream = record.delegate.stream_response(
            system_instructions,
            input,
            self.settings.resolve(model_settings),
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        async with aclosing(stream):  # type: ignore[type-var]
            iterator = aiter(stream)
            while True:
                try:
                    event = await anext(iterator)
                except StopAsyncIteration:
                    return
                except Exception as exc:
                    mapped = _translate(exc)
                    if mapped is None:
                        raise
                    raise mapped from exc
                if event.type == "response.completed":
                    # recorded before it is yielded: a consumer may stop at the terminal event
                    output = list(event.response.output)
                    record.finish_call(token, output, event.response.usage)
                    _check_call_ids(output)
                yield event

    def get_retry_advice(self, request: Any) -> Any:
        """The delegate's advice (used only when you opt into ``ModelSettings.retry``)."""
        ctx = current_rollout_context()
        record = ctx.extras.get(_STATE_KEY) if ctx is not None else None
        return record.delegate.get_retry_advice(request) if record is not None else None


# -- the agent -------------------------------------------------------------------------------------


@dataclass
class OsmosisAgent[TContext](Agent[TContext]):
    """An ``agents.Agent`` whose model defaults to :class:`OsmosisRolloutModel` (the rollout's policy).

    Everything else is the SDK's ``Agent``; run it with ``Runner.run`` / ``Runner.run_streamed``.
    The agent holds no per-rollout state, so one instance can serve concurrent rollouts.

    :param tool_not_found_behavior: what a call to a tool the agent does not have does:
        ``"return_error_to_model"`` (default: the model is told ``Tool 'x' not found.`` and the run
        goes on) or ``"raise_error"`` (the SDK's ``ModelBehaviorError``: the rollout fails). Applied
        to runs started with this agent; see the module docstring.
    :raises TypeError: for a model *name*: the SDK would send it to api.openai.com. Leave ``model``
        unset, or pass a ``Model`` instance.
    """

    model: str | Model | None = field(default_factory=OsmosisRolloutModel)
    tool_not_found_behavior: ToolNotFoundBehavior = "return_error_to_model"

    def __post_init__(self) -> None:
        _ensure_safe_defaults()
        if self.model is None:
            self.model = OsmosisRolloutModel()
        elif isinstance(self.model, str):
            raise TypeError(
                f"OsmosisAgent(model={self.model!r}): a model name would be resolved by the SDK's default provider "
                "(api.openai.com). Leave model unset to call the rollout's policy (OsmosisRolloutModel()), "
                "or pass an agents.Model instance"
            )
        if self.tool_not_found_behavior not in ("return_error_to_model", "raise_error"):
            raise ValueError(
                "tool_not_found_behavior must be 'return_error_to_model' or 'raise_error', "
                f"got {self.tool_not_found_behavior!r}"
            )
        super().__post_init__()  # type: ignore[no-untyped-call]


# -- defaults applied to runs: the runner wrapper ----------------------------------------------------

_MaxTurnsHandler = Callable[[Any], Any]


def _uses_placeholder(agent: Any, run_config: Any) -> bool:
    if isinstance(agent, OsmosisAgent) or isinstance(getattr(agent, "model", None), OsmosisRolloutModel):
        return True
    model = run_config.get("model") if isinstance(run_config, Mapping) else getattr(run_config, "model", None)
    return isinstance(model, OsmosisRolloutModel)


def _record_then(user_handler: _MaxTurnsHandler | None) -> _MaxTurnsHandler:
    """A ``max_turns`` error handler: keep the SDK's full history as the sample, then the author's handler."""

    async def record_history(data: Any) -> Any:
        ctx = current_rollout_context()
        record = ctx.extras.get(_STATE_KEY) if ctx is not None else None
        if isinstance(record, _RolloutRecord):
            record.replace_history(list(data.run_data.history))
        if user_handler is None:
            return None  # the SDK raises MaxTurnsExceeded
        result = user_handler(data)
        return await result if inspect.isawaitable(result) else result

    return record_history


def _with_osmosis_defaults(agent: Any, options: dict[str, Any]) -> dict[str, Any]:
    run_config = options.get("run_config")
    if not _uses_placeholder(agent, run_config):
        return options
    behavior: ToolNotFoundBehavior = getattr(agent, "tool_not_found_behavior", "return_error_to_model")
    if run_config is None:
        # a dict (not a RunConfig) keeps the SDK owning, and closing, the model provider it makes
        run_config = {"tool_not_found_behavior": behavior}
    elif isinstance(run_config, Mapping):
        if run_config.get("tool_not_found_behavior", "raise_error") == "raise_error":
            run_config = {**run_config, "tool_not_found_behavior": behavior}
    elif isinstance(run_config, RunConfig) and run_config.tool_not_found_behavior == "raise_error":
        run_config = dataclasses.replace(run_config, tool_not_found_behavior=behavior)
    handlers = dict(options.get("error_handlers") or {})
    handlers["max_turns"] = _record_then(handlers.get("max_turns"))
    return {**options, "run_config": run_config, "error_handlers": handlers}


class _OsmosisRunner(AgentRunner):
    """Wraps the SDK's default runner to apply osmosis' defaults to runs of osmosis agents.

    ``Runner.run`` / ``run_streamed`` / ``run_sync`` call the default runner; this one adds the
    defaults (see the module docstring) when the starting agent is an :class:`OsmosisAgent` or
    uses the placeholder, refuses ``run_sync`` inside a rollout, and passes everything else on to
    the runner it wraps unchanged.
    """

    def __init__(self, inner: AgentRunner) -> None:
        self._inner = inner

    async def run(self, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
        return await self._inner.run(starting_agent, input, **_with_osmosis_defaults(starting_agent, kwargs))

    def run_sync(self, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
        if current_rollout_context() is not None:
            raise RuntimeError(_RUN_SYNC)
        return self._inner.run_sync(starting_agent, input, **_with_osmosis_defaults(starting_agent, kwargs))

    def run_streamed(self, starting_agent: Any, input: Any, **kwargs: Any) -> Any:
        return self._inner.run_streamed(starting_agent, input, **_with_osmosis_defaults(starting_agent, kwargs))


_defaults_lock = threading.Lock()
_defaults_applied = False


def _ensure_safe_defaults() -> None:
    """Once per process: tracing off, and the runner wrapper installed (see the module docstring)."""
    global _defaults_applied
    if _defaults_applied:
        return
    with _defaults_lock:
        if _defaults_applied:
            return
        set_tracing_disabled(True)
        current = get_default_agent_runner()
        if not isinstance(current, _OsmosisRunner):
            set_default_agent_runner(_OsmosisRunner(current if current is not None else AgentRunner()))
        _defaults_applied = True
