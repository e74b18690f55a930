"""Deprecated since 0.2.0: ``osmosis_core.plugins.registry`` is ``osmosis_core._engine.registry``."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core._engine.registry", "0.2.0")
