"""The ``[traces]`` table of a run config (``osmosis run --traces`` turns it on with its defaults)::

[traces]
adapter = "vllm"            # how the upstream is asked for tokens: vllm, sglang, openai (text only)
policy_version = "step-0"   # recorded on every call that names none
# host = "127.0.0.1"        # where the gateway listens (a bearer is always required)
# port = 0                  # 0 picks a free port
# enabled = false           # keep the table, turn traces off
"""

from __future__ import annotations

from typing import Any

import attrs

from osmosis_core import PolicyEndpoint
from osmosis_core.plugin import structure_table
from osmosis_gateway.adapters import AdapterName

__all__ = ["TracesSettings", "gateway_from_settings"]


@attrs.define(kw_only=True)
class TracesSettings:
    """``[traces]``: the policy gateway of a run."""

    enabled: bool = True
    adapter: AdapterName = "vllm"
    policy_version: str | None = None
    host: str = "127.0.0.1"
    port: int = 0


def gateway_from_settings(upstream: PolicyEndpoint, settings: dict[str, Any], source: str) -> Any:
    """A :class:`~osmosis_gateway.PolicyGateway` (not started) in front of ``upstream``.

    :raises osmosis_core.ConfigError: a bad ``[traces]`` key, named by its path.
    """
    from osmosis_gateway.gateway import PolicyGateway

    checked = structure_table(settings, TracesSettings, "$.traces", source)
    return PolicyGateway(
        upstream,
        adapter=checked.adapter,
        host=checked.host,
        port=checked.port,
        policy_version=checked.policy_version,
    )
