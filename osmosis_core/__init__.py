"""osmosis-core: agent rollouts for RL post-training.

Write an :class:`AgentWorkflow` (the agent) and a :class:`Grader` (the reward) once; run them
over a dataset with ``osmosis run``, in-process (:class:`LocalBackend`) or on a plugin backend.

Public names are imported lazily, so ``import osmosis_core`` (and the ``osmosis`` CLI) starts fast.
"""

from typing import Any

from osmosis_core.lazy import attach_stub

__version__ = "0.1.0"
_public_getattr, __dir__, __all__ = attach_stub(__name__, __file__)


def __getattr__(name: str) -> Any:
    if name == "LocalBackendConfig":  # deprecated (CHANGELOG 0.2.0); it warns when built
        from osmosis_core.local import LocalBackendConfig

        return LocalBackendConfig
    return _public_getattr(name)
