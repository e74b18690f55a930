"""Deprecated since 0.2.0: ``osmosis_core.plugins.hookspecs`` is ``osmosis_core.hookspecs``."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core.hookspecs", "0.2.0")
