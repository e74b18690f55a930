"""The author API: an :class:`AgentWorkflow` (the agent) and a :class:`Grader` (the reward).

A rollout author writes both once; every backend runs them the same way. A complete rollout::

    import re
    from osmosis_core import AgentWorkflow, AgentWorkflowContext, Grader, GraderContext, chat_completion

    class EchoWorkflow(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
            reply = await chat_completion(ctx.prompt)          # calls the rollout's policy endpoint
            return [*ctx.prompt, reply]                        # the sample: the message history

    class ExactGrader(Grader):
        async def grade(self, ctx: GraderContext) -> float:
            match = re.search(r"####\\s*(\\S+)", ctx.sample.last_text())
            return 1.0 if match and match.group(1) == str(ctx.label) else 0.0

A workflow may return its messages (a list), a :class:`RolloutSample` (to add metrics or a
system prompt), or ``None`` when an agent integration registered the sample on the
:class:`RolloutContext`. A new workflow and grader instance, with its own copy of the config, is
made for every rollout, so instance state never leaks between rollouts.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import enum
from typing import Any, ClassVar

import attrs

from osmosis_core.context import RolloutContext
from osmosis_core.records import Message, PolicyEndpoint, RolloutSample

__all__ = [
    "AgentWorkflow",
    "AgentWorkflowConfig",
    "AgentWorkflowContext",
    "ConcurrencyConfig",
    "Grader",
    "GraderConfig",
    "GraderContext",
    "WorkflowOutput",
]

DEFAULT_MAX_CONCURRENT = 4
"""How many rollouts run at once when no config says otherwise."""


def _positive_or_none(_inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{attribute.name} must be a whole number >= 1 or None, got {value!r}")


@attrs.frozen(kw_only=True)
class ConcurrencyConfig:
    """How many executions may run at once. ``None`` means the default of 4, never "unlimited".

    Frozen: a value, replaced (``attrs.evolve``) rather than changed in place.
    """

    max_concurrent: int | None = attrs.field(default=None, validator=_positive_or_none)

    @property
    def limit(self) -> int:
        """The effective limit."""
        return self.max_concurrent if self.max_concurrent is not None else DEFAULT_MAX_CONCURRENT


@attrs.define(kw_only=True)
class AgentWorkflowConfig:
    """Settings of a workflow. Subclass it with attrs to add your own::

        @attrs.define(kw_only=True)
        class MultiplyConfig(AgentWorkflowConfig):
            max_turns: int = 8
            temperature: float = 1.0

        class MultiplyWorkflow(AgentWorkflow[MultiplyConfig]):
            config_type = MultiplyConfig

    A run config's ``[rollout.workflow_config]`` table sets these fields by name.
    """

    name: str = ""
    description: str | None = None
    concurrency: ConcurrencyConfig = attrs.field(factory=ConcurrencyConfig)


@attrs.define(kw_only=True)
class GraderConfig:
    """Settings of a grader; ``concurrency`` limits how many gradings run at once."""

    name: str = ""
    description: str | None = None
    concurrency: ConcurrencyConfig = attrs.field(factory=ConcurrencyConfig)


WorkflowOutput = RolloutSample | list[Message] | None
"""What :meth:`AgentWorkflow.run` may return."""


@attrs.define
class AgentWorkflowContext[C: AgentWorkflowConfig]:
    """What a workflow gets: the prompt, its config and the row's metadata (never the label)."""

    prompt: list[Message]
    config: C
    metadata: dict[str, Any]
    rollout: RolloutContext

    @property
    def rollout_id(self) -> str:
        """The running rollout's id."""
        return self.rollout.rollout_id

    @property
    def policy(self) -> PolicyEndpoint:
        """The policy endpoint this rollout calls."""
        return self.rollout.policy

    @property
    def user_prompt(self) -> str:
        """The text of the last user message of the prompt."""
        for message in reversed(self.prompt):
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                return str(message["content"])
        return ""


class AgentWorkflow[C: AgentWorkflowConfig](abc.ABC):
    """The agent side of a rollout. Implement :meth:`run`; see the module docstring for an example.

    ``config_type`` names the config class the run config's ``[rollout.workflow_config]`` table
    is read into.
    """

    config_type: ClassVar[type[AgentWorkflowConfig]] = AgentWorkflowConfig

    def __init__(self, config: C | None = None) -> None:
        self.config: C = config if config is not None else self.config_type()  # type: ignore[assignment]

    @abc.abstractmethod
    async def run(self, ctx: AgentWorkflowContext[C]) -> WorkflowOutput:
        """Run the agent on ``ctx.prompt`` against the rollout's policy; return or register the sample."""


@attrs.define
class GraderContext[G: GraderConfig]:
    """What a grader gets: the sample, the row's label, the prompt, the metadata and its config."""

    sample: RolloutSample
    label: Any
    prompt: list[Message]
    metadata: dict[str, Any]
    config: G

    def set_reward(self, reward: float) -> None:
        """Set the sample's reward (a finite number)."""
        self.sample.reward = reward


class Grader[G: GraderConfig](abc.ABC):
    """The reward side of a rollout. Implement :meth:`grade`; see the module docstring for an example.

    Return the reward, or call ``ctx.set_reward``. A grader that sets no reward fails the rollout
    with a ``validation_error``; so does a row with no label when a grader is configured.
    """

    config_type: ClassVar[type[GraderConfig]] = GraderConfig

    def __init__(self, config: G | None = None) -> None:
        self.config: G = config if config is not None else self.config_type()  # type: ignore[assignment]

    @abc.abstractmethod
    async def grade(self, ctx: GraderContext[G]) -> float | None:
        """Score ``ctx.sample`` against ``ctx.label``; return the reward or set it."""


_SHARED_TYPES: frozenset[type[Any]] = frozenset(
    {str, int, float, bool, bytes, complex, type(None), frozenset, range, ConcurrencyConfig}  # (frozen, of ints)
)
_attrs_fields: dict[type[Any], tuple[str, ...]] = {}


def copy_config[T](config: T) -> T:
    """A per-rollout copy of a config, so a rollout's changes never reach the next one.

    attrs instances are copied field by field (immutable values shared, nested attrs copied the
    same way); anything else is deep-copied, or shallow-copied when it refuses a deep copy, or
    shared when it refuses both (a client object, a lock, a Strands tool). Cheaper than
    ``copy.deepcopy`` on the hot path.
    """
    cls = type(config)
    if cls in _SHARED_TYPES or isinstance(config, enum.Enum):
        return config
    names = _attrs_fields.get(cls)
    if names is None and attrs.has(cls):
        names = _attrs_fields[cls] = tuple(a.name for a in attrs.fields(cls))
    if names is not None:
        new = object.__new__(cls)
        for name in names:
            value = getattr(config, name)
            if type(value) not in _SHARED_TYPES:
                value = copy_config(value)
            object.__setattr__(new, name, value)
        return new
    for copier in (copy.deepcopy, copy.copy):
        with contextlib.suppress(Exception):
            return copier(config)
    return config
