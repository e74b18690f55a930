"""Deprecated since 0.2.0: ``osmosis_core.run_lock`` is the private ``osmosis_core._engine.run_lock``."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core._engine.run_lock", "0.2.0")
