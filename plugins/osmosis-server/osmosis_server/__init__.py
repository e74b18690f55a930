"""osmosis-server: serve osmosis rollouts to a trainer over HTTP, and drive them from the trainer.

* :func:`create_app`: the rollout server as an ASGI app (Starlette, served by uvicorn), for any
  :class:`~osmosis_core.ExecutionBackend`; wire-compatible with osmosis-ai 0.3.8's rollout server;
* ``osmosis serve CONFIG``: the same app built from a run config, as ``osmosis run`` builds a run;
* :class:`RolloutClient`: the async client a trainer submits, polls and cancels rollouts with;
* :class:`ServerSettings`: the ``[server]`` table.

Names are imported lazily: ``import osmosis_server`` imports neither Starlette nor uvicorn.

>>> import osmosis_server
>>> osmosis_server.ServerSettings().max_queued
1024
"""

from typing import TYPE_CHECKING

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_server.app import create_app as create_app
    from osmosis_server.client import Admission as Admission
    from osmosis_server.client import RolloutAlreadyAdmitted as RolloutAlreadyAdmitted
    from osmosis_server.client import RolloutClient as RolloutClient
    from osmosis_server.client import RolloutClientError as RolloutClientError
    from osmosis_server.client import RolloutConflict as RolloutConflict
    from osmosis_server.client import RolloutLost as RolloutLost
    from osmosis_server.client import RolloutProtocolError as RolloutProtocolError
    from osmosis_server.client import RolloutRequest as RolloutRequest
    from osmosis_server.client import RolloutResult as RolloutResult
    from osmosis_server.client import ServerUnavailable as ServerUnavailable
    from osmosis_server.client import Unauthorized as Unauthorized
    from osmosis_server.protocol import LEASE_HEADER as LEASE_HEADER
    from osmosis_server.protocol import RolloutStatus as RolloutStatus
    from osmosis_server.run_folder import RunFolder as RunFolder
    from osmosis_server.serving import serve as serve
    from osmosis_server.settings import ServerSettings as ServerSettings

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "app": ["create_app"],
        "client": [
            "Admission",
            "RolloutAlreadyAdmitted",
            "RolloutClient",
            "RolloutClientError",
            "RolloutConflict",
            "RolloutLost",
            "RolloutProtocolError",
            "RolloutRequest",
            "RolloutResult",
            "ServerUnavailable",
            "Unauthorized",
        ],
        "protocol": ["LEASE_HEADER", "RolloutStatus"],
        "run_folder": ["RunFolder"],
        "serving": ["serve"],
        "settings": ["ServerSettings"],
    },
)
