"""Deprecated since 0.2.0: ``osmosis_core.http_server`` is ``osmosis_core.http`` (:mod:`osmosis_core.http.server`)."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core.http.server", "0.2.0")
