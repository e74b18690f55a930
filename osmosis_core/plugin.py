"""Everything a plugin author needs from osmosis, under one name: ``osmosis_core.plugin``.

A plugin (a backend, an agent integration, graders, templates, CLI commands) imports from here,
from ``osmosis_core`` (records, the author API, errors) and from ``osmosis_core.testing`` (test
tools) only; the first-party plugins do too, and the ``lint`` session checks it (import-linter).
Names are imported on first use, so a plugin's entry module stays light.

A complete backend plugin is the example in :mod:`osmosis_core.backend` (the same code as the
README's and ``osmosis_core/testing/example_backend.py``).

Check it with the backend contract suite (``osmosis_core.testing.BackendContract``).
"""

from osmosis_core.deprecation import moved_names
from osmosis_core.lazy import attach_stub

_public_getattr, __dir__, __all__ = attach_stub(__name__, __file__)
# deprecated (CHANGELOG 0.2.0): the openai client moved to the osmosis-openai distribution
_OPENAI_CLIENT = ("policy_error", "rollout_openai_client")
_MOVED = {name: (f"osmosis_openai:{name}", "0.2.0", "osmosis-openai") for name in _OPENAI_CLIENT}
__getattr__ = moved_names(__name__, _MOVED, fallback=_public_getattr)
