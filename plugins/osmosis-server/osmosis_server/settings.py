"""The server's settings: the ``[server]`` table of a run config, overridden by ``osmosis serve`` flags.

::

    [server]
    host = "127.0.0.1"            # bind address; a non-loopback one needs a token (it always has one unless --no-auth)
    port = 8000
    token_env = "OSMOSIS_SERVER_TOKEN"   # the variable holding the bearer token; unset: one is generated
    max_queued = 1024             # rollouts waiting beyond the backend's max_concurrency; past it: 429
    lease_timeout_sec = 120       # a rollout nobody polls (and without callback_url) this long is cancelled
    retention_sec = 900           # a finished result stays in memory this long; then a poll reads it from results.jsonl
    grace_sec = 30                # on SIGTERM: how long running rollouts get to finish
    result_wait_sec = 30          # the longest a result poll waits for a change

>>> ServerSettings().problems()
[]
>>> ServerSettings(lease_timeout_sec=10, result_wait_sec=30).problems()
['must be greater than result_wait_sec (30.0), got 10.0 @ $.server.lease_timeout_sec']
"""

from __future__ import annotations

import math

import attrs

from osmosis_trainer.wire import DEFAULT_TOKEN_ENV  # the variable a token is read from (the client reads it too)

__all__ = ["DEFAULT_TOKEN_ENV", "ServerSettings"]


@attrs.define(kw_only=True)
class ServerSettings:
    """How the rollout server listens, admits, keeps and drains rollouts (see the module docstring)."""

    host: str = "127.0.0.1"
    port: int = 8000
    token_env: str | None = None
    """The variable holding the bearer token (default ``OSMOSIS_SERVER_TOKEN``); unset: one is generated."""
    max_queued: int = 1024
    lease_timeout_sec: float = 120.0
    retention_sec: float = 900.0
    grace_sec: float = 30.0
    result_wait_sec: float = 30.0
    max_body_mb: float = 64.0
    """The largest request body accepted, in MiB (413 past it)."""

    def problems(self) -> list[str]:
        """What is wrong, each as ``message @ $.server.key`` (empty when the settings are usable)."""
        out: list[str] = []
        if not 0 <= self.port <= 65535:
            out.append(f"must be a port number (0-65535), got {self.port} @ $.server.port")
        if self.max_queued < 0:
            out.append(f"must be >= 0, got {self.max_queued} @ $.server.max_queued")
        for key in ("lease_timeout_sec", "result_wait_sec", "max_body_mb"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                out.append(f"must be a positive number, got {value} @ $.server.{key}")
        for key in ("retention_sec", "grace_sec"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                out.append(f"must be a number >= 0, got {value} @ $.server.{key}")
        if not out and self.lease_timeout_sec <= self.result_wait_sec:
            # the reference client checks it: a poll must renew the lease before it runs out
            out.append(
                f"must be greater than result_wait_sec ({float(self.result_wait_sec)}), "
                f"got {float(self.lease_timeout_sec)} @ $.server.lease_timeout_sec"
            )
        return out
