"""osmosis-harbor: run osmosis rollouts in isolated Harbor trials, with or without Docker.

* :class:`HarborBackend` (backend ``harbor``): every rollout in its own Harbor trial, in template
  mode (one reusable task; the grader is the trial's verifier) or dataset mode (rows name existing
  Harbor tasks, whose verifiers give the reward);
* :class:`BubblewrapEnvironment`: a Harbor environment (by import path,
  ``osmosis_harbor.sandbox:BubblewrapEnvironment``) that sandboxes every command with bubblewrap;
* :class:`HarborBackendConfig`: the ``[backend.harbor]`` settings.

Names are imported lazily: ``import osmosis_harbor`` does not import Harbor.

>>> import osmosis_harbor, sys
>>> osmosis_harbor.HarborBackendConfig().mode, "harbor" in sys.modules
('template', False)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "HarborBackend": "osmosis_harbor.backend",
    "HarborBackendConfig": "osmosis_harbor.config",
    "EnvironmentSection": "osmosis_harbor.config",
    "SandboxSection": "osmosis_harbor.config",
    "BubblewrapEnvironment": "osmosis_harbor.sandbox",
    "OsmosisWorkflowAgent": "osmosis_harbor.agent",
    "OsmosisGraderVerifier": "osmosis_harbor.verifier",
    "BubblewrapMissing": "osmosis_harbor.bwrap",
    "Sandbox": "osmosis_harbor.bwrap",
    "DEFAULT_TASK_DIR": "osmosis_harbor.tasks",
    "dataset_rows": "osmosis_harbor.tasks",
    "write_dataset": "osmosis_harbor.tasks",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'osmosis_harbor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from osmosis_harbor.agent import OsmosisWorkflowAgent
    from osmosis_harbor.backend import HarborBackend
    from osmosis_harbor.bwrap import BubblewrapMissing, Sandbox
    from osmosis_harbor.config import EnvironmentSection, HarborBackendConfig, SandboxSection
    from osmosis_harbor.sandbox import BubblewrapEnvironment
    from osmosis_harbor.tasks import DEFAULT_TASK_DIR, dataset_rows, write_dataset
    from osmosis_harbor.verifier import OsmosisGraderVerifier
