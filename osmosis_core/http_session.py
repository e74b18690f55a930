"""Deprecated since 0.2.0: ``osmosis_core.http_session`` is ``osmosis_core.http`` (:mod:`osmosis_core.http.client`)."""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core.http.client", "0.2.0")
