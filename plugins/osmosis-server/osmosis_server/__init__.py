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

from osmosis_core.plugin import attach_stub

__version__ = "0.1.0"
__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
