"""osmosis-gateway: training traces. A policy gateway in front of the inference server records
every model call of every rollout as the tokens the policy saw and produced.

* :class:`PolicyGateway`: the OpenAI-compatible proxy (``open_rollout`` -> a per-rollout
  endpoint, ``pop_trace`` -> its :class:`RolloutTrace`);
* :func:`trainer_view`: a trace as token sequences stitched by exact token prefix, with a loss
  mask and aligned logprobs (what verl, SkyRL, slime consume);
* ``osmosis run --traces`` (or ``[traces]``) writes ``traces.jsonl``; ``osmosis gateway`` runs one
  standalone; ``osmosis export RUN --format atif`` writes Harbor's trajectory format.

Names are imported lazily: ``import osmosis_gateway`` imports no aiohttp.

>>> import osmosis_gateway
>>> osmosis_gateway.POLICY_VERSION_HEADER
'X-Osmosis-Policy-Version'
"""

from osmosis_core.plugin import attach_stub

__version__ = "0.1.0"
__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
