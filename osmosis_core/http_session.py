"""Deprecated since 0.2.0: ``osmosis_core.http_session`` is the private ``osmosis_core._engine.http_session``."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core._engine.http_session", "0.2.0")
