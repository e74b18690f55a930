"""osmosis-server: serve osmosis rollouts to a trainer over HTTP (the trainer's side is osmosis-trainer).

* :func:`create_app`: the rollout server as an ASGI app (Starlette, served by uvicorn), for any
  :class:`~osmosis_core.plugin.ExecutionBackend`; wire-compatible with osmosis-ai 0.3.8's rollout server;
* ``osmosis serve CONFIG``: the same app built from a run config, as ``osmosis run`` builds a run;
* the async client a trainer submits, polls and cancels rollouts with is
  :class:`osmosis_trainer.RolloutClient` (the osmosis-trainer distribution, which this one depends
  on); ``osmosis_server.RolloutClient`` and the other client names still work, with a warning;
* :class:`ServerSettings`: the ``[server]`` table.

Names are imported lazily: ``import osmosis_server`` imports neither Starlette nor uvicorn.

>>> import osmosis_server
>>> osmosis_server.ServerSettings().max_queued
1024
"""

from typing import TYPE_CHECKING

import lazy_loader

from osmosis_core.plugin import moved_names
from osmosis_server.client import _MOVED

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_server.app import create_app as create_app
    from osmosis_server.protocol import LEASE_HEADER as LEASE_HEADER
    from osmosis_server.protocol import RolloutStatus as RolloutStatus
    from osmosis_server.run_folder import RunFolder as RunFolder
    from osmosis_server.serving import serve as serve
    from osmosis_server.settings import ServerSettings as ServerSettings

_lazy_getattr, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "app": ["create_app"],
        "protocol": ["LEASE_HEADER", "RolloutStatus"],
        "run_folder": ["RunFolder"],
        "serving": ["serve"],
        "settings": ["ServerSettings"],
    },
)

# the client moved to osmosis-trainer (CHANGELOG 0.2.0): each of its names warns and still works
__getattr__ = moved_names(
    __name__,
    {name: (f"osmosis_trainer:{name}", "0.2.0", "osmosis-trainer") for name in _MOVED},
    fallback=_lazy_getattr,
)
