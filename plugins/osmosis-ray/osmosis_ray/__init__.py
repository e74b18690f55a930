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

from typing import TYPE_CHECKING

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_ray.actor import RolloutActor as RolloutActor
    from osmosis_ray.backend import RayBackend as RayBackend
    from osmosis_ray.config import LocalClusterSection as LocalClusterSection
    from osmosis_ray.config import RayBackendConfig as RayBackendConfig
    from osmosis_ray.shipping import declared_requirements as declared_requirements
    from osmosis_ray.shipping import missing_requirements as missing_requirements

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "actor": ["RolloutActor"],
        "backend": ["RayBackend"],
        "config": ["LocalClusterSection", "RayBackendConfig"],
        "shipping": ["declared_requirements", "missing_requirements"],
    },
)
