"""The osmosis plugin of osmosis-ray (entry point ``ray``): registers the ``ray`` backend.

It stays light: nothing here imports Ray (it takes a second or two to import), so ``osmosis --help``
and ``osmosis plugins`` stay fast; Ray is imported when the backend is built.

>>> [spec.name for spec in osmosis_register_backends()]
['ray']
"""

from __future__ import annotations

from osmosis_core.plugin import BackendSpec, hookimpl

__all__ = ["osmosis_register_backends"]


@hookimpl
def osmosis_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            "ray",
            "osmosis_ray.backend:RayBackend.from_setup",
            config_type="osmosis_ray.config:RayBackendConfig",
            description="Rollouts in async Ray actors over a cluster (or a local one), each hosting the local backend.",
        )
    ]
