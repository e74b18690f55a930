"""What both ends of the rollout protocol share: a rollout's status names, the lease header, the
token's variable, and how a ``Retry-After`` header is read. ``osmosis serve`` (osmosis-server)
imports them from here, so the client and the server cannot disagree.

>>> RolloutStatus("success").final, RolloutStatus.RUNNING.final
(True, False)
>>> retry_after_seconds("2", 1.0), retry_after_seconds("soon", 1.0), retry_after_seconds(None, 0.5)
(2.0, 1.0, 0.5)
"""

from __future__ import annotations

import math
from typing import Final

from osmosis_trainer._compat import StrEnum

__all__ = ["DEFAULT_TOKEN_ENV", "LEASE_HEADER", "ROLLOUT_ID_HEADER", "RolloutStatus", "retry_after_seconds"]

LEASE_HEADER: Final = "X-Osmosis-Rollout-Lease"
"""The header a result poll carries its polling-lease token in (the reference's name)."""

ROLLOUT_ID_HEADER: Final = "X-Osmosis-Rollout-Id"
"""The header the policy gateway sends with each model call of a rollout, naming the rollout: what a
token-in engine routes on (:class:`osmosis_trainer.bridge.TokenBridge` hands it to verl as the
sticky ``request_id``)."""

DEFAULT_TOKEN_ENV: Final = "OSMOSIS_SERVER_TOKEN"
"""The variable the server's bearer token is read from (by the client, and by ``osmosis serve``
when its ``token_env`` is not set)."""


class RolloutStatus(StrEnum):
    """A rollout's status on the wire: in flight (queued, running, grading) or final."""

    QUEUED = "queued"
    RUNNING = "running"
    GRADING = "grading"
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def final(self) -> bool:
        """True for success, failure and cancelled."""
        return self in _FINAL


_FINAL: Final = frozenset({RolloutStatus.SUCCESS, RolloutStatus.FAILURE, RolloutStatus.CANCELLED})


def retry_after_seconds(value: str | None, default: float) -> float:
    """The wait a ``Retry-After`` header asks for, in seconds, kept within 0.05 to 60."""
    try:
        seconds = float(value) if value is not None else default
    except ValueError:
        return default
    return min(max(seconds, 0.05), 60.0) if math.isfinite(seconds) else default
