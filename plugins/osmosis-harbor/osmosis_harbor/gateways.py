"""The policy gateways a ``harbor`` backend puts between its no-network trials and their policy.

A no-network trial reaches the host through one socket (:mod:`osmosis_harbor.relay`), and what is
behind that socket is all it can reach. A byte relay to the policy server itself would hand the
trial every route of that server (vLLM's ``/sleep`` or ``/collective_rpc``, SGLang's
``/update_weights_from_disk`` or ``/flush_cache``), so the relay always leads to a policy gateway
(``osmosis_gateway.PolicyGateway``, from the ``osmosis_policy_gateway`` hook: ``pip install
osmosis-gateway``) that serves only the chat-completions and models routes of one rollout, with that
rollout's own token; the policy's key stays in the osmosis process.

:class:`PolicyGateways` starts one gateway per upstream endpoint in use (the ``openai`` adapter:
calls pass unchanged; what it records is dropped when the rollout ends) and stops it when its last
rollout ends. With ``osmosis run --traces`` the upstream is the run's own gateway (each rollout's
endpoint there), which records the trace as for any other rollout.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from osmosis_core import PolicyEndpoint
    from osmosis_core.plugin import TraceGateway

__all__ = ["GatewayMissing", "PolicyGateways"]

_SETTINGS = {"adapter": "openai"}


class GatewayMissing(RuntimeError):
    """No plugin provides a policy gateway (osmosis-gateway is not installed)."""


@attrs.define(eq=False)
class _Held:
    gateway: TraceGateway
    users: int = 0


class PolicyGateways:
    """Gateways by upstream endpoint, shared by the rollouts that use the same one.

    >>> PolicyGateways().open_count
    0
    """

    def __init__(self) -> None:
        self._held: dict[tuple[Any, ...], _Held] = {}
        self._lock = asyncio.Lock()

    @property
    def open_count(self) -> int:
        """Gateways listening now."""
        return len(self._held)

    @staticmethod
    def _key(policy: PolicyEndpoint) -> tuple[Any, ...]:
        headers = tuple(sorted(policy.headers.items()))
        return (policy.base_url, policy.model, policy.api_key, headers, policy.max_response_bytes)

    async def open(self, policy: PolicyEndpoint, rollout_id: str) -> PolicyEndpoint:
        """The rollout's endpoint on a gateway in front of ``policy`` (started when none is).

        :raises GatewayMissing: no plugin provides a gateway.
        """
        from osmosis_core import ConfigError
        from osmosis_core.frontend import make_trace_gateway

        key = self._key(policy)
        async with self._lock:
            held = self._held.get(key)
            if held is None:
                try:
                    gateway = make_trace_gateway(policy, _SETTINGS, source="[backend.harbor]")
                except ConfigError as exc:
                    raise GatewayMissing(str(exc)) from exc
                await gateway.start()
                held = self._held[key] = _Held(gateway)
            endpoint = held.gateway.open_rollout(rollout_id)
            held.users += 1
        return endpoint

    async def close(self, policy: PolicyEndpoint, rollout_id: str) -> None:
        """End the rollout on its gateway; stop the gateway when it was the last one."""
        async with self._lock:
            key = self._key(policy)
            held = self._held.get(key)
            if held is None:
                return
            held.gateway.pop_trace(rollout_id)
            held.users -= 1
            if held.users > 0:
                return
            del self._held[key]
            await held.gateway.aclose()

    async def aclose(self) -> None:
        """Stop every gateway."""
        async with self._lock:
            held, self._held = list(self._held.values()), {}
        for one in held:
            await one.gateway.aclose()
