"""Deprecated: ``osmosis migrate`` moved to the osmosis-migrate plugin (``pip install osmosis-migrate``).

``osmosis_core.migrate.plan_migration`` and the other names below keep working for one release,
with an :class:`~osmosis_core.deprecation.OsmosisDeprecationWarning`, when the plugin is installed:
use ``osmosis_migrate``. The plugin is imported only when one of these names is asked for.
"""

from osmosis_core.deprecation import moved_names

__all__: list[str] = []  # the moved names are reached through __getattr__ only (and warn)

_MOVED = ("FileChange", "Finding", "MigrateError", "MigrationPlan", "apply_migration", "plan_migration")
__getattr__ = moved_names(__name__, {name: (f"osmosis_migrate:{name}", "0.2.0", "osmosis-migrate") for name in _MOVED})
