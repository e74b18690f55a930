"""Deprecated since 0.2.0: ``osmosis_core.plugins.builtin`` is now the private ``osmosis_core._engine.builtin``.

Public names: ``osmosis_core.plugin`` (the old paths warn).
"""

from osmosis_core.deprecation import moved_module

__getattr__ = moved_module(__name__, "osmosis_core._engine.builtin", "0.2.0", ("osmosis_core.plugin",))
