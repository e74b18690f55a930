"""The ``[traces]`` table of a run config (``osmosis run --traces`` turns it on with its defaults)::

[traces]
adapter = "vllm"            # how the upstream is asked for tokens: vllm, sglang, openai (text only)
policy_version = "step-0"   # recorded on every call that names none
# host = "127.0.0.1"        # where the gateway listens (a bearer is always required)
# port = 0                  # 0 picks a free port
# read_timeout_sec = 600    # the upstream sending nothing this long fails the call (no_answer)
# enabled = false           # keep the table, turn traces off
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from osmosis_core import PolicyEndpoint
from osmosis_core.plugin import structure_table
from osmosis_gateway.adapters import AdapterName

READ_TIMEOUT_SEC: Final = 600.0
"""How long the upstream may send nothing (before its answer's head, or between two pieces of it)
before a call is given up (``no_answer``, or ``cut`` mid-stream): as long as the core's client waits."""

__all__ = ["READ_TIMEOUT_SEC", "TracesSettings", "gateway_from_settings"]


@attrs.define(kw_only=True)
class TracesSettings:
    """``[traces]``: the policy gateway of a run."""

    enabled: bool = True
    adapter: AdapterName = "vllm"
    policy_version: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    read_timeout_sec: float = attrs.field(default=READ_TIMEOUT_SEC, validator=attrs.validators.gt(0))


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
        read_timeout_sec=checked.read_timeout_sec,
    )
