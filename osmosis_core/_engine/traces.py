"""A run's traces: the gateway a plugin provides, and ``traces.jsonl`` written beside the results."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from osmosis_core._engine.registry import PluginRegistry, get_registry
from osmosis_core._engine.results import ResultWriter
from osmosis_core.errors import ConfigError, clip
from osmosis_core.records import PolicyEndpoint
from osmosis_core.traces import RolloutTraceLike, TraceGateway, trace_line
from osmosis_core.wire import finite_json

__all__ = ["RunTraces", "SharedGateways", "make_trace_gateway", "write_trace_line"]

log = logging.getLogger("osmosis_core.traces")  # the name users filter on

_warned: set[type] = set()
"""The gateway classes already said to take no ``policy_version``."""


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
    registry = registry or get_registry()
    gateway = registry.pm.hook.osmosis_policy_gateway(upstream=upstream, settings=dict(settings), source=source)
    if gateway is None:
        raise ConfigError(
            source, ["traces need a policy gateway plugin: pip install osmosis-gateway @ $.traces (or --traces)"]
        )
    return gateway  # type: ignore[no-any-return]


def write_trace_line(writer: ResultWriter, line: dict[str, Any], secrets: Iterable[str | None] = ()) -> None:
    """Append a ``traces.jsonl`` line that can always be written: a NaN or an infinity in it (a
    request's ``temperature``, a tool's schema) as its spelling (``"NaN"``, ``"Infinity"``); a trace
    that still cannot be written as JSON (text that is no UTF-8) as a line that says so, incomplete,
    without its calls. One rollout's trace never stops a run or a server."""
    line = finite_json(line)
    try:
        writer.write(line, secrets)
    except (ValueError, TypeError, UnicodeError, RecursionError) as exc:
        why = clip(f"the trace cannot be written as JSON ({type(exc).__name__}: {exc}); its calls are left out", ())
        kept: dict[str, Any] = {k: line[k] for k in ("rollout_id", "row_index", "sample_index", "capture") if k in line}
        writer.write({**kept, "complete": False, "incomplete_reason": why, "calls": []}, secrets)


class RunTraces:
    """A run's gateway and its ``traces.jsonl``: a rollout's trace line is written just before its
    result line, so every result of the file has its trace (``--resume`` appends, as for results)."""

    def __init__(self, gateway: TraceGateway, path: Path, secrets: Iterable[str | None] = ()) -> None:
        self.gateway = gateway
        self._writer = ResultWriter(path, secrets=secrets)

    async def start(self) -> None:
        """Start the gateway."""
        await self.gateway.start()

    def open(self, rollout_id: str) -> PolicyEndpoint:
        """The endpoint of a rollout about to run."""
        return self.gateway.open_rollout(rollout_id)

    def finish(self, rollout_id: str, row_index: int, sample_index: int, *, write: bool) -> None:
        """Take the rollout's trace out of the gateway; write its line (:func:`write_trace_line`)
        unless the rollout was cancelled."""
        trace = self.gateway.pop_trace(rollout_id)
        if trace is not None and write:
            write_trace_line(self._writer, trace_line(rollout_id, row_index, sample_index, trace.to_json()))

    async def aclose(self) -> None:
        """Stop the gateway and close the file."""
        try:
            self._writer.close()
        finally:
            await self.gateway.aclose()


def _open_rollout(
    gateway: TraceGateway,
    rollout_id: str,
    *,
    policy_version: str | None = None,
    sampling: Mapping[str, Any] | None = None,
) -> PolicyEndpoint:
    """``gateway.open_rollout(rollout_id)`` with the keywords given (not None) that the gateway takes
    (none given: called exactly so, its signature unread; :meth:`SharedGateways.open` says what
    becomes of the others)."""
    options: dict[str, Any] = {"policy_version": policy_version, "sampling": sampling}
    options = {name: value for name, value in options.items() if value is not None}
    if not options:
        return gateway.open_rollout(rollout_id)
    kind = type(gateway)
    takes = _keywords(kind) if callable(getattr(kind, "open_rollout", None)) else _signature(gateway.open_rollout)
    taken = {name: value for name, value in options.items() if takes is None or name in takes}
    endpoint: PolicyEndpoint = gateway.open_rollout(rollout_id, **taken)
    if sampling is not None and "sampling" not in taken:
        endpoint = attrs.evolve(endpoint, sampling=sampling)
    if policy_version is not None and "policy_version" not in taken and kind not in _warned:
        _warned.add(kind)
        log.warning(
            "the trace gateway %s takes no policy_version: its traces record none (rollout %s asked for %r)",
            kind.__qualname__,
            rollout_id,
            policy_version,
        )
    return endpoint


@functools.cache
def _keywords(kind: type) -> frozenset[str] | None:
    """The keyword names ``kind.open_rollout`` takes; None when it takes any (``**kwargs``)."""
    return _signature(kind.open_rollout)  # type: ignore[attr-defined]


def _signature(method: Any) -> frozenset[str] | None:
    """The keyword names ``method`` takes; None when it takes any (``**kwargs``); none when it has
    no signature to read."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return frozenset(p.name for p in parameters if p.kind in keyword)


class SharedGateways:
    """Trace gateways by upstream endpoint, shared by the rollouts that call the same one (what
    ``osmosis serve --traces`` and a ``harbor`` backend's no-network trials keep).

    A gateway starts with the first rollout :meth:`open` sends to its endpoint; :meth:`take` ends a
    rollout (and hands back its trace). Gateways no rollout uses stay open for the next, up to
    ``keep_idle`` of them; past that they are stopped at the next :meth:`open` or :meth:`close_idle`.

    >>> import asyncio
    >>> gateways = SharedGateways({"adapter": "openai"}, source="$.traces")
    >>> gateways.open_count, asyncio.run(gateways.aclose())
    (0, None)

    :param settings: the ``[traces]`` table every gateway is made with.
    :param source: where those settings came from (named in errors).
    :param registry: whose ``osmosis_policy_gateway`` hook makes them (default: the process's).
    """

    def __init__(
        self,
        settings: Mapping[str, Any],
        *,
        source: str,
        keep_idle: int = 0,
        registry: PluginRegistry | None = None,
    ) -> None:
        self.settings = dict(settings)
        self.source = source
        self.keep_idle = keep_idle
        self.registry = registry
        self._gateways: dict[tuple[Any, ...], TraceGateway] = {}
        self._users: dict[tuple[Any, ...], int] = {}
        self._lock = asyncio.Lock()

    @property
    def open_count(self) -> int:
        """Gateways listening now."""
        return len(self._gateways)

    @property
    def upstreams(self) -> list[str]:
        """The base URLs of the gateways listening now, oldest first."""
        return [key[0] for key in self._gateways]

    @staticmethod
    def key(policy: PolicyEndpoint) -> tuple[Any, ...]:
        """What makes two policies one upstream (URL, model, key, headers, response limit)."""
        headers = tuple(sorted(policy.headers.items()))
        return (policy.base_url, policy.model, policy.api_key, headers, policy.max_response_bytes)

    async def open(
        self, policy: PolicyEndpoint, rollout_id: str, *, policy_version: str | None = None
    ) -> PolicyEndpoint:
        """The rollout's own endpoint on the gateway in front of ``policy`` (started when none is).

        ``policy.sampling`` (a trainer's settings for this rollout) and ``policy_version`` go to the
        gateway's ``open_rollout`` (:meth:`TraceGateway.open_rollout`), each only when given and only
        when it names the keyword (or takes ``**kwargs``); the gateway is made without them, so
        rollouts with other settings share it. A gateway that takes no ``sampling`` (a third
        party's) leaves it to the rollout's own clients: the endpoint returned carries the settings,
        so ``chat_completion`` and the agent integrations set them (its trace then shows the
        trainer's values as the ones sent). One that takes no ``policy_version`` records none; a
        warning says so, once per gateway class.

        :raises ConfigError: no plugin provides a gateway, or it refused the settings.
        """
        sampling = policy.sampling
        if sampling is not None:
            policy = attrs.evolve(policy, sampling=None)
        key = self.key(policy)
        async with self._lock:
            gateway = self._gateways.get(key)
            if gateway is None:
                await self._close_idle(self.keep_idle - 1)
                gateway = make_trace_gateway(policy, self.settings, source=self.source, registry=self.registry)
                try:
                    await gateway.start()
                except BaseException:  # cancelled or refused while starting: nothing left listening
                    with contextlib.suppress(Exception):
                        await gateway.aclose()
                    raise
                self._gateways[key] = gateway
            endpoint = _open_rollout(gateway, rollout_id, policy_version=policy_version, sampling=sampling)
            self._users[key] = self._users.get(key, 0) + 1
        return endpoint

    def take(self, policy: PolicyEndpoint, rollout_id: str) -> RolloutTraceLike | None:
        """End a rollout :meth:`open` started: its trace, taken out of its gateway (None: none kept)."""
        key = self.key(policy)
        gateway = self._gateways.get(key)
        if gateway is None:
            return None
        self._users[key] -= 1
        return gateway.pop_trace(rollout_id)

    async def close_idle(self) -> None:
        """Stop the gateways no rollout uses, past ``keep_idle`` of them."""
        async with self._lock:
            await self._close_idle(self.keep_idle)

    async def _close_idle(self, keep: int) -> None:
        idle = [key for key in self._gateways if self._users.get(key, 0) <= 0]
        for key in idle[: max(len(idle) - max(keep, 0), 0)]:
            self._users.pop(key, None)
            with contextlib.suppress(Exception):
                await self._gateways.pop(key).aclose()

    async def aclose(self) -> None:
        """Stop every gateway."""
        async with self._lock:
            gateways, self._gateways = list(self._gateways.values()), {}
            self._users.clear()
        for gateway in gateways:
            with contextlib.suppress(Exception):
                await gateway.aclose()
