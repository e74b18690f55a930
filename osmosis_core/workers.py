"""Deprecated since 0.2.0: ``osmosis_core.workers`` is now the private ``osmosis_core._engine.workers``.

Public names: ``osmosis_core``, ``osmosis_core.plugin``, ``osmosis_core.frontend`` (the old paths warn).
"""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(
    __name__, "osmosis_core._engine.workers", "0.2.0", ("osmosis_core", "osmosis_core.plugin", "osmosis_core.frontend")
)
