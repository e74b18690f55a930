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

from typing import TYPE_CHECKING

from osmosis_core import ConfigError
from osmosis_core.plugin import SharedGateways

if TYPE_CHECKING:
    from osmosis_core import PolicyEndpoint

__all__ = ["GatewayMissing", "PolicyGateways"]

_SETTINGS = {"adapter": "openai"}


class GatewayMissing(RuntimeError):
    """No plugin provides a policy gateway (osmosis-gateway is not installed)."""


class PolicyGateways(SharedGateways):
    """Gateways by upstream endpoint, shared by the rollouts that use the same one, each stopped
    with its last rollout.

    >>> PolicyGateways().open_count
    0
    """

    def __init__(self) -> None:
        super().__init__(_SETTINGS, source="[backend.harbor]", keep_idle=0)

    async def open(
        self, policy: PolicyEndpoint, rollout_id: str, *, policy_version: str | None = None
    ) -> PolicyEndpoint:
        """The rollout's endpoint on a gateway in front of ``policy`` (started when none is); the
        gateway sets ``policy.sampling`` (a trainer's settings) on each of the rollout's calls.

        :raises GatewayMissing: no plugin provides a gateway.
        """
        try:
            return await super().open(policy, rollout_id, policy_version=policy_version)
        except ConfigError as exc:
            raise GatewayMissing(str(exc)) from exc

    async def close(self, policy: PolicyEndpoint, rollout_id: str) -> None:
        """End the rollout on its gateway (what it recorded is dropped); stop the gateway when it was the last one."""
        self.take(policy, rollout_id)
        await self.close_idle()
