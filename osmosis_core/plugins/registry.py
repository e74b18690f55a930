"""Deprecated since 0.2.0: ``osmosis_core.plugins.registry`` is now the private ``osmosis_core._engine.registry``.

Public names: ``osmosis_core.plugin``, ``osmosis_core.frontend`` (the old paths warn).
"""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(
    __name__, "osmosis_core._engine.registry", "0.2.0", ("osmosis_core.plugin", "osmosis_core.frontend")
)
