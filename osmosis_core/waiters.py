"""Deprecated since 0.2.0: ``osmosis_core.waiters`` is the private ``osmosis_core._engine.waiters``."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core._engine.waiters", "0.2.0")
