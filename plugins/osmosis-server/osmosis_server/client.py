"""Deprecated since 0.2.0: the rollout client is in the osmosis-trainer distribution.

A trainer's image installs ``osmosis-trainer`` (Python 3.10+, no osmosis-core) and imports the
client from ``osmosis_trainer``; ``osmosis_server.client.RolloutClient`` and the other names still
work, with an ``OsmosisDeprecationWarning`` naming the new import, and go in the next release.
"""

from osmosis_core.plugin import moved_names

_MOVED = (
    "Admission",
    "RolloutAlreadyAdmitted",
    "RolloutClient",
    "RolloutClientError",
    "RolloutConflict",
    "RolloutLost",
    "RolloutProtocolError",
    "RolloutRequest",
    "RolloutResult",
    "ServerUnavailable",
    "Unauthorized",
)

__getattr__ = moved_names(
    __name__,
    {
        **{name: (f"osmosis_trainer:{name}", "0.2.0", "osmosis-trainer") for name in _MOVED},
        "RETRY_DELAYS_SEC": ("osmosis_trainer.client:RETRY_DELAYS_SEC", "0.2.0", "osmosis-trainer"),
    },
)
