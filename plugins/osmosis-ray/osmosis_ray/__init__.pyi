from osmosis_ray.actor import RolloutActor as RolloutActor
from osmosis_ray.backend import RayBackend as RayBackend
from osmosis_ray.config import LocalClusterSection as LocalClusterSection
from osmosis_ray.config import RayBackendConfig as RayBackendConfig
from osmosis_ray.shipping import declared_requirements as declared_requirements
from osmosis_ray.shipping import missing_requirements as missing_requirements

__version__: str
