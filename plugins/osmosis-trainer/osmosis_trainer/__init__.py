"""osmosis-trainer: the trainer's side of osmosis, on Python 3.10 to 3.13, without osmosis-core.

A trainer never imports the rollout runtime: it drives ``osmosis serve`` over HTTP and turns each
result's token trace into its own rows. This package is what its image installs:

* :class:`RolloutClient` (:mod:`osmosis_trainer.client`): submit, poll, cancel rollouts, and
  :meth:`RolloutClient.run_many`; each :class:`RolloutRequest` may carry the trainer's
  :class:`SamplingParams` and its ``policy_version``;
* the trace records (:mod:`osmosis_trainer.trace`): :class:`RolloutTrace`, :func:`trainer_view`
  (token sequences stitched by exact prefix, a loss mask, aligned logprobs, counts);
* :mod:`osmosis_trainer.rows`: :func:`rollout_rows`, a result as per-sequence training rows (prompt
  ids, completion ids, mask, logprobs, reward, and why a row is masked);
* :mod:`osmosis_trainer.groups`: prompts repeated per group, results back in the rows' order,
  group-relative advantages that leave failed rollouts out;
* :mod:`osmosis_trainer.skyrl`: SkyRL's generator (``OsmosisGenerator``) and experiment, for a
  trainer that has SkyRL installed (imported only when used).
* :mod:`osmosis_trainer.verl`: verl's agent loop (``OsmosisAgentLoop``), for a trainer that has verl
  installed; :mod:`osmosis_trainer.slime`: slime's custom generate function (no slime import);
* :mod:`osmosis_trainer.bridge`: the token-in bridge, SGLang's ``/generate`` in front of an engine
  that is a Python object (verl's), so a rollout server's token-in gateway reaches it.

Names are imported lazily: ``import osmosis_trainer`` imports neither aiohttp nor cattrs.

>>> import osmosis_trainer
>>> osmosis_trainer.repeat_prompts(["a", "b"], 2)
['a', 'a', 'b', 'b']
"""

from typing import TYPE_CHECKING

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_trainer.client import Admission as Admission
    from osmosis_trainer.client import RolloutAlreadyAdmitted as RolloutAlreadyAdmitted
    from osmosis_trainer.client import RolloutClient as RolloutClient
    from osmosis_trainer.client import RolloutClientError as RolloutClientError
    from osmosis_trainer.client import RolloutConflict as RolloutConflict
    from osmosis_trainer.client import RolloutLost as RolloutLost
    from osmosis_trainer.client import RolloutProtocolError as RolloutProtocolError
    from osmosis_trainer.client import RolloutRequest as RolloutRequest
    from osmosis_trainer.client import RolloutResult as RolloutResult
    from osmosis_trainer.client import ServerUnavailable as ServerUnavailable
    from osmosis_trainer.client import Unauthorized as Unauthorized
    from osmosis_trainer.client import failed_rollout as failed_rollout
    from osmosis_trainer.client import is_setup_refusal as is_setup_refusal
    from osmosis_trainer.groups import GroupStats as GroupStats
    from osmosis_trainer.groups import group_advantages as group_advantages
    from osmosis_trainer.groups import group_stats as group_stats
    from osmosis_trainer.groups import order_results as order_results
    from osmosis_trainer.groups import prompt_groups as prompt_groups
    from osmosis_trainer.groups import repeat_prompts as repeat_prompts
    from osmosis_trainer.records import ErrorCategory as ErrorCategory
    from osmosis_trainer.records import ErrorInfo as ErrorInfo
    from osmosis_trainer.records import Message as Message
    from osmosis_trainer.records import RolloutSample as RolloutSample
    from osmosis_trainer.records import TrainerError as TrainerError
    from osmosis_trainer.rows import MaskReason as MaskReason
    from osmosis_trainer.rows import SequenceRow as SequenceRow
    from osmosis_trainer.rows import rollout_rows as rollout_rows
    from osmosis_trainer.rows import rows_metrics as rows_metrics
    from osmosis_trainer.sampling import SamplingParams as SamplingParams
    from osmosis_trainer.trace import CallStatus as CallStatus
    from osmosis_trainer.trace import RolloutTrace as RolloutTrace
    from osmosis_trainer.trace import TraceCall as TraceCall
    from osmosis_trainer.trace import TrainerView as TrainerView
    from osmosis_trainer.trace import TrainingSequence as TrainingSequence
    from osmosis_trainer.trace import comparable_trace as comparable_trace
    from osmosis_trainer.trace import read_traces as read_traces
    from osmosis_trainer.trace import trace_from_json as trace_from_json
    from osmosis_trainer.trace import trainer_view as trainer_view
    from osmosis_trainer.trace import view_of_json as view_of_json
    from osmosis_trainer.wire import DEFAULT_TOKEN_ENV as DEFAULT_TOKEN_ENV
    from osmosis_trainer.wire import LEASE_HEADER as LEASE_HEADER
    from osmosis_trainer.wire import RolloutStatus as RolloutStatus

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
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
            "failed_rollout",
            "is_setup_refusal",
        ],
        "groups": ["GroupStats", "group_advantages", "group_stats", "order_results", "prompt_groups", "repeat_prompts"],
        "records": ["ErrorCategory", "ErrorInfo", "Message", "RolloutSample", "TrainerError"],
        "rows": ["MaskReason", "SequenceRow", "rollout_rows", "rows_metrics"],
        "sampling": ["SamplingParams"],
        "trace": [
            "CallStatus",
            "RolloutTrace",
            "TraceCall",
            "TrainerView",
            "TrainingSequence",
            "comparable_trace",
            "read_traces",
            "trace_from_json",
            "trainer_view",
            "view_of_json",
        ],
        "wire": ["DEFAULT_TOKEN_ENV", "LEASE_HEADER", "RolloutStatus"],
    },
)
