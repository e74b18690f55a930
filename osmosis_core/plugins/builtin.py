"""Deprecated since 0.2.0: ``osmosis_core.plugins.builtin`` is ``osmosis_core._engine.builtin``."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core._engine.builtin", "0.2.0")
