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

from typing import TYPE_CHECKING

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_gateway.adapters import ADAPTERS as ADAPTERS
    from osmosis_gateway.adapters import AdapterName as AdapterName
    from osmosis_gateway.atif import trace_to_atif as trace_to_atif
    from osmosis_gateway.gateway import POLICY_VERSION_FIELD as POLICY_VERSION_FIELD
    from osmosis_gateway.gateway import POLICY_VERSION_HEADER as POLICY_VERSION_HEADER
    from osmosis_gateway.gateway import PolicyGateway as PolicyGateway
    from osmosis_gateway.settings import TracesSettings as TracesSettings
    from osmosis_gateway.trace import RolloutTrace as RolloutTrace
    from osmosis_gateway.trace import TraceCall as TraceCall
    from osmosis_gateway.trace import TrainerView as TrainerView
    from osmosis_gateway.trace import TrainingSequence as TrainingSequence
    from osmosis_gateway.trace import comparable_trace as comparable_trace
    from osmosis_gateway.trace import read_traces as read_traces
    from osmosis_gateway.trace import trace_from_json as trace_from_json
    from osmosis_gateway.trace import trainer_view as trainer_view

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "adapters": ["ADAPTERS", "AdapterName"],
        "atif": ["trace_to_atif"],
        "gateway": ["POLICY_VERSION_FIELD", "POLICY_VERSION_HEADER", "PolicyGateway"],
        "settings": ["TracesSettings"],
        "trace": [
            "RolloutTrace",
            "TraceCall",
            "TrainerView",
            "TrainingSequence",
            "comparable_trace",
            "read_traces",
            "trace_from_json",
            "trainer_view",
        ],
    },
)
