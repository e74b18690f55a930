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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from osmosis_core.errors import ConfigError

if TYPE_CHECKING:
    from osmosis_core._engine.registry import PluginRegistry
    from osmosis_core.records import PolicyEndpoint

__all__ = [
    "TRACES",
    "RolloutTraceLike",
    "RunTraces",
    "TraceGateway",
    "make_trace_gateway",
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
        """Register a rollout; the endpoint its model calls go to."""

    def pop_trace(self, rollout_id: str) -> RolloutTraceLike | None:
        """Take a finished rollout's trace out of the gateway."""


def traces_enabled(table: Mapping[str, Any]) -> bool:
    """Whether a ``[traces]`` table turns traces on: present and not ``enabled = false``."""
    return bool(table) and table.get("enabled", True) is not False


def make_trace_gateway(
    upstream: PolicyEndpoint,
    settings: Mapping[str, Any],
    *,
    source: str = "<config>",
    registry: PluginRegistry | None = None,
) -> TraceGateway:
    """The gateway a plugin provides in front of ``upstream``, configured by the ``[traces]`` table.

    :raises ConfigError: no plugin provides one (naming what to install), or the plugin refused the
        settings (naming the key).
    """
    from osmosis_core._engine.registry import get_registry

    registry = registry or get_registry()
    gateway = registry.pm.hook.osmosis_policy_gateway(upstream=upstream, settings=dict(settings), source=source)
    if gateway is None:
        raise ConfigError(
            source, ["traces need a policy gateway plugin: pip install osmosis-gateway @ $.traces (or --traces)"]
        )
    return gateway  # type: ignore[no-any-return]


def trace_line(rollout_id: str, row_index: int, sample_index: int, trace: Mapping[str, Any]) -> dict[str, Any]:
    """The ``traces.jsonl`` line of a rollout's trace (its JSON form): its place, then the trace."""
    data = dict(trace)
    line = {"rollout_id": rollout_id, "row_index": row_index, "sample_index": sample_index}
    line["complete"] = data.pop("complete", None)
    line["incomplete_reason"] = data.pop("incomplete_reason", None)
    data.pop("rollout_id", None)
    line.update(data)
    return line


def trace_from_line(line: Mapping[str, Any]) -> dict[str, Any]:
    """The trace a ``traces.jsonl`` line holds, as a result carries it (:func:`trace_line`'s inverse)."""
    return {key: value for key, value in line.items() if key not in ("row_index", "sample_index")}


class RunTraces:
    """A run's gateway and its ``traces.jsonl``: a rollout's trace line is written just before its
    result line, so every result of the file has its trace (``--resume`` appends, as for results)."""

    def __init__(self, gateway: TraceGateway, path: Path, secrets: Iterable[str | None] = ()) -> None:
        from osmosis_core._engine.results import ResultWriter

        self.gateway = gateway
        self._writer = ResultWriter(path, secrets=secrets)

    async def start(self) -> None:
        """Start the gateway."""
        await self.gateway.start()

    def open(self, rollout_id: str) -> PolicyEndpoint:
        """The endpoint of a rollout about to run."""
        return self.gateway.open_rollout(rollout_id)

    def finish(self, rollout_id: str, row_index: int, sample_index: int, *, write: bool) -> None:
        """Take the rollout's trace out of the gateway; write its line unless the rollout was cancelled."""
        trace = self.gateway.pop_trace(rollout_id)
        if trace is None or not write:
            return
        self._writer.write(trace_line(rollout_id, row_index, sample_index, trace.to_json()))

    async def aclose(self) -> None:
        """Stop the gateway and close the file."""
        try:
            self._writer.close()
        finally:
            await self.gateway.aclose()
