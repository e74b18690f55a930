"""The failures the Strands integration raises itself (importable without Strands).

How each maps to a rollout's error category (``osmosis_core.classify_exception``):

* :class:`TurnLimitExceeded` (a ``RuntimeError``) -> ``agent_error``: the agent did not finish
  within its turn budget. The history up to that point stays registered as the rollout's sample.
* :class:`MalformedToolCall` (a ``ValueError``) -> ``validation_error``: the policy sent a tool
  call Strands cannot run (no id or no name). Plain Strands would skip it and call the model
  again and again; here the rollout fails at once.
* An endpoint failure (unreachable, a 4xx/5xx answer, a stream that breaks or ends without a
  ``finish_reason``) -> ``osmosis_core.PolicyError`` -> ``policy_error``.
"""

from __future__ import annotations

__all__ = ["MalformedToolCall", "TurnLimitExceeded"]


class TurnLimitExceeded(RuntimeError):
    """The agent used its whole turn budget (model calls) without a final answer.

    :param limit: the turn limit that was reached.
    :param turns: model calls made by the invocation.
    """

    def __init__(self, message: str, *, limit: int | None = None, turns: int | None = None) -> None:
        self.limit = limit
        self.turns = turns
        super().__init__(message)


class MalformedToolCall(ValueError):
    """The policy answered with a tool call that has no id (or no name), which Strands cannot run."""
