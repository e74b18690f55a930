"""The plugin layer: hook specifications, the registry that loads plugins, and the built-ins.

Plugin authors import only :data:`hookimpl` (re-exported as ``osmosis_core.hookimpl``) and the
spec records (``BackendSpec``, ``TemplateSpec``, ``GraderSpec``).
"""

from __future__ import annotations

from osmosis_core.plugins.hookspecs import PROJECT_NAME, hookimpl, hookspec
from osmosis_core.plugins.registry import PluginInfo, PluginRegistry, get_registry

__all__ = ["PROJECT_NAME", "PluginInfo", "PluginRegistry", "get_registry", "hookimpl", "hookspec"]
