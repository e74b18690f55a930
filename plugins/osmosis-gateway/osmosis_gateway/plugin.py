"""The osmosis plugin of osmosis-gateway (entry point ``gateway``): the run's policy gateway
(hook ``osmosis_policy_gateway``) and the ``osmosis gateway`` and ``osmosis export`` commands.

It stays light: aiohttp and the gateway are imported when a run with traces starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from osmosis_core.plugin import hookimpl

if TYPE_CHECKING:
    import click

    from osmosis_core import PolicyEndpoint
    from osmosis_core.plugin import TraceGateway

__all__ = ["osmosis_policy_gateway", "osmosis_register_commands"]


@hookimpl
def osmosis_policy_gateway(upstream: PolicyEndpoint, settings: dict[str, Any], source: str) -> TraceGateway:
    from osmosis_gateway.settings import gateway_from_settings

    gateway: TraceGateway = gateway_from_settings(upstream, settings, source)
    return gateway


@hookimpl
def osmosis_register_commands(cli: click.Group) -> None:
    from osmosis_gateway.commands import export, gateway

    cli.add_command(gateway)
    cli.add_command(export)
