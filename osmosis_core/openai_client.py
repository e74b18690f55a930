"""Deprecated since 0.2.0: ``osmosis_core.openai_client`` is ``osmosis_openai`` (pip install osmosis-openai)."""

from osmosis_core.deprecation import moved_names

_NAMES = ("fast_client_class", "policy_error", "rollout_openai_client")
__getattr__ = moved_names(__name__, {name: (f"osmosis_openai:{name}", "0.2.0", "osmosis-openai") for name in _NAMES})
