"""Deprecated since 0.2.0: ``osmosis_core.lifeline`` is the private ``osmosis_core._engine.lifeline``."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core._engine.lifeline", "0.2.0")
