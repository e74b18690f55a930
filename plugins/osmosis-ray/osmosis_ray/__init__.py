"""osmosis-ray: run osmosis rollouts on a Ray cluster.

* :class:`RayBackend` (backend ``ray``): async Ray actors, spread over the cluster's nodes, each
  hosting the ``local`` backend (or any registered backend, ``inner = "harbor"``); dispatch,
  retries of Ray's own failures, poison-row isolation and a watchdog on the driver;
* :class:`RayBackendConfig`: the ``[backend.ray]`` settings.

Names are imported lazily: ``import osmosis_ray`` does not import Ray (``RayBackend`` does).

>>> import osmosis_ray
>>> osmosis_ray.RayBackendConfig().inner
'local'
"""

from osmosis_core.plugin import attach_stub

__version__ = "0.1.0"
__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
