"""Deprecated since 0.2.0: ``osmosis_core.runner`` is the private ``osmosis_core._engine.runner``."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core._engine.runner", "0.2.0")
