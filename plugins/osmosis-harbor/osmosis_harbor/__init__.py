"""osmosis-harbor: run osmosis rollouts in isolated Harbor trials, with or without Docker.

* :class:`HarborBackend` (backend ``harbor``): every rollout in its own Harbor trial, in template
  mode (one reusable task; the grader is the trial's verifier) or dataset mode (rows name existing
  Harbor tasks, whose verifiers give the reward);
* :class:`BubblewrapEnvironment`: a Harbor environment (by import path,
  ``osmosis_harbor.sandbox:BubblewrapEnvironment``) that sandboxes every command with bubblewrap;
* :class:`HarborBackendConfig`: the ``[backend.harbor]`` settings.

Names are imported lazily: ``import osmosis_harbor`` (or reading its settings) does not import
Harbor, nor litellm with it.

>>> import osmosis_harbor
>>> osmosis_harbor.HarborBackendConfig().mode
'template'
"""

from typing import TYPE_CHECKING

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_harbor.agent import OsmosisWorkflowAgent as OsmosisWorkflowAgent
    from osmosis_harbor.backend import HarborBackend as HarborBackend
    from osmosis_harbor.bwrap import BubblewrapMissing as BubblewrapMissing
    from osmosis_harbor.bwrap import Sandbox as Sandbox
    from osmosis_harbor.config import EnvironmentSection as EnvironmentSection
    from osmosis_harbor.config import HarborBackendConfig as HarborBackendConfig
    from osmosis_harbor.config import SandboxSection as SandboxSection
    from osmosis_harbor.sandbox import BubblewrapEnvironment as BubblewrapEnvironment
    from osmosis_harbor.tasks import DEFAULT_TASK_DIR as DEFAULT_TASK_DIR
    from osmosis_harbor.tasks import dataset_rows as dataset_rows
    from osmosis_harbor.tasks import write_dataset as write_dataset
    from osmosis_harbor.verifier import OsmosisGraderVerifier as OsmosisGraderVerifier

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "agent": ["OsmosisWorkflowAgent"],
        "backend": ["HarborBackend"],
        "bwrap": ["BubblewrapMissing", "Sandbox"],
        "config": ["EnvironmentSection", "HarborBackendConfig", "SandboxSection"],
        "sandbox": ["BubblewrapEnvironment"],
        "tasks": ["DEFAULT_TASK_DIR", "dataset_rows", "write_dataset"],
        "verifier": ["OsmosisGraderVerifier"],
    },
)
