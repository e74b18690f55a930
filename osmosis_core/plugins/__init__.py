"""Deprecated since 0.2.0: the plugin layer is ``osmosis_core.hookspecs`` (the specs, ``hookimpl``)
and ``osmosis_core.plugin.get_registry``; this package was one letter from ``osmosis_core.plugin``.
"""

from osmosis_core.deprecation import moved_names

_SPECS = "osmosis_core.hookspecs"
__getattr__ = moved_names(
    __name__,
    {
        "PROJECT_NAME": (f"{_SPECS}:PROJECT_NAME", "0.2.0"),
        "hookimpl": (f"{_SPECS}:hookimpl", "0.2.0"),
        "hookspec": (f"{_SPECS}:hookspec", "0.2.0"),
        "get_registry": ("osmosis_core.plugin:get_registry", "0.2.0"),
        "PluginInfo": ("osmosis_core._engine.registry:PluginInfo", "0.2.0"),
        "PluginRegistry": ("osmosis_core._engine.registry:PluginRegistry", "0.2.0"),
    },
)
