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

from osmosis_core.plugin import attach_stub

__version__ = "0.1.0"
__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
