"""Deprecated: ``osmosis migrate`` moved to the osmosis-migrate plugin (``pip install osmosis-migrate``).

``osmosis_core.migrate.plan_migration`` and the other names below keep working for one release,
with an :class:`~osmosis_core.deprecation.OsmosisDeprecationWarning`, when the plugin is installed:
use ``osmosis_migrate``. The core never imports the plugin until one of these names is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from osmosis_core.deprecation import warn_deprecated

__all__: list[str] = []  # the moved names below are reached through __getattr__ only (and warn)

_MOVED = frozenset({"FileChange", "Finding", "MigrateError", "MigrationPlan", "apply_migration", "plan_migration"})

_SINCE = "0.2.0"


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_deprecated(f"osmosis_core.migrate.{name}", f"osmosis_migrate.{name}", _SINCE)
    try:
        # by name, on first use only: the core never imports a plugin (import-linter's contract) but
        # this one forwarding, which a user of the old name asked for
        plugin = importlib.import_module("osmosis_migrate")
    except ImportError as exc:
        raise ImportError(
            f"osmosis_core.migrate.{name} moved to the osmosis-migrate plugin: pip install osmosis-migrate"
        ) from exc
    return getattr(plugin, name)
