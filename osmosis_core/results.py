"""Deprecated since 0.2.0: ``osmosis_core.results`` is the private ``osmosis_core._engine.results``."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core._engine.results", "0.2.0")
