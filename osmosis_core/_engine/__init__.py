"""The engine behind ``osmosis run`` and the frontends: private, never imported by a plugin.

The runner, the results files, the run lock, the plugin registry, the rollout loader, the config
machinery, the worker pool and the HTTP helpers live here. Plugins use ``osmosis_core``,
``osmosis_core.plugin``, ``osmosis_core.frontend`` and ``osmosis_core.testing``; import-linter's
contract "Plugins use the public API only" fails a plugin that imports this package.
"""
