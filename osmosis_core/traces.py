"""Training traces in a run: the seam between ``osmosis run`` and a policy gateway plugin.

With ``osmosis run --traces`` (or a ``[traces]`` table) the run puts a policy gateway in front of
its ``[policy]``: each rollout calls the gateway at a URL of its own, the gateway records every
call (prompt token ids, generated token ids, logprobs), and the run writes one line per rollout to
``traces.jsonl`` beside ``results.jsonl``. The core never imports the gateway: a plugin provides
it through the ``osmosis_policy_gateway`` hook (``pip install osmosis-gateway``).

A backend, ``osmosis serve`` or a trainer's own loop needs three calls of :class:`TraceGateway`::

    gateway = make_trace_gateway(policy, {"adapter": "vllm"})
    await gateway.start()
    request = attrs.evolve(request, policy=gateway.open_rollout(request.rollout_id))
    ...                                     # run the rollout
    line = gateway.pop_trace(request.rollout_id).to_json()

A trainer's ``policy_version=`` and ``sampling=`` for a rollout go to ``open_rollout`` too (see
:meth:`TraceGateway.open_rollout`). ``make_trace_gateway`` is in ``osmosis_core.frontend``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from osmosis_core.records import PolicyEndpoint

__all__ = [
    "TRACES",
    "RolloutTraceLike",
    "TraceGateway",
    "trace_from_line",
    "trace_line",
    "traces_enabled",
]

TRACES = "traces.jsonl"
"""The run folder's trace file: one line per finished rollout, like ``results.jsonl``."""


@runtime_checkable
class RolloutTraceLike(Protocol):
    """A rollout's trace as the run writes it."""

    def to_json(self) -> dict[str, Any]: ...


@runtime_checkable
class TraceGateway(Protocol):
    """What a policy gateway plugin gives the run (``osmosis_gateway.PolicyGateway`` is one)."""

    async def start(self) -> Any:
        """Listen, in the running event loop."""

    async def aclose(self) -> None:
        """Stop listening."""

    def open_rollout(self, rollout_id: str) -> PolicyEndpoint:
        """Register a rollout; the endpoint its model calls go to.

        A gateway may also take the keywords ``policy_version`` (a string recorded on each call of
        the rollout) and ``sampling`` (a trainer's checked settings, :mod:`osmosis_core.sampling`,
        set over what the rollout sends on each call it forwards, the rollout's values kept in the
        trace as sent), as ``osmosis_gateway.PolicyGateway`` does. A gateway without them keeps
        working: see :meth:`SharedGateways.open` (in ``osmosis_core.plugin``).
        """

    def pop_trace(self, rollout_id: str) -> RolloutTraceLike | None:
        """Take a finished rollout's trace out of the gateway."""


def traces_enabled(table: Mapping[str, Any]) -> bool:
    """Whether a ``[traces]`` table turns traces on: present and not ``enabled = false``."""
    return bool(table) and table.get("enabled", True) is not False


def trace_line(rollout_id: str, row_index: int, sample_index: int, trace: Mapping[str, Any]) -> dict[str, Any]:
    """The ``traces.jsonl`` line of a rollout's trace (its JSON form): its place, then the trace."""
    line: dict[str, Any] = {"rollout_id": rollout_id, "row_index": row_index, "sample_index": sample_index}
    line |= {"complete": None, "incomplete_reason": None}  # next, whether the trace has them or not
    return line | {key: value for key, value in trace.items() if key != "rollout_id"}


def trace_from_line(line: Mapping[str, Any]) -> dict[str, Any]:
    """The trace a ``traces.jsonl`` line holds, as a result carries it (:func:`trace_line`'s inverse)."""
    return {key: value for key, value in line.items() if key not in ("row_index", "sample_index")}
