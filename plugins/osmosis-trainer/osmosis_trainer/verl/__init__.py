"""verl with osmosis rollouts: an agent loop whose samples ``osmosis serve --traces`` runs.

* :class:`OsmosisAgentLoop` (:mod:`.agent_loop`): verl's ``AgentLoopBase``, registered as
  ``osmosis`` (``_target_: osmosis_trainer.verl.OsmosisAgentLoop`` in an ``agent_loop_config_path``
  entry): each sample one rollout request, its model calls served by verl's own engine through a
  token-in bridge (:class:`osmosis_trainer.bridge.TokenBridge`), its result one ``AgentLoopOutput``;
* :func:`agent_loop_fields`, :func:`sampling_from_verl`, :func:`row_label` (:mod:`.convert`): the
  conversions, pure (no verl, no torch): one output per sample, a failed or forked rollout masked
  with its reason in ``extra_fields``, never raised.

Importing this package imports neither verl nor torch; :class:`OsmosisAgentLoop` needs verl
installed (``pip install verl``). See osmosis-trainer's README, "verl".
"""

from typing import TYPE_CHECKING, Any

import lazy_loader

if TYPE_CHECKING:
    from osmosis_trainer.verl.agent_loop import OsmosisAgentLoop as OsmosisAgentLoop
    from osmosis_trainer.verl.agent_loop import VerlEngine as VerlEngine
    from osmosis_trainer.verl.agent_loop import close_bridges as close_bridges
    from osmosis_trainer.verl.convert import EXTRA_FIELDS as EXTRA_FIELDS
    from osmosis_trainer.verl.convert import VERL_MASK_REASONS as VERL_MASK_REASONS
    from osmosis_trainer.verl.convert import agent_loop_fields as agent_loop_fields
    from osmosis_trainer.verl.convert import row_label as row_label
    from osmosis_trainer.verl.convert import sampling_from_verl as sampling_from_verl

_lazy_getattr, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "agent_loop": ["OsmosisAgentLoop", "VerlEngine", "close_bridges"],
        "convert": ["EXTRA_FIELDS", "VERL_MASK_REASONS", "agent_loop_fields", "row_label", "sampling_from_verl"],
    },
)

VERL_NAMES = frozenset({"OsmosisAgentLoop", "VerlEngine", "close_bridges"})
"""The names that need verl installed (the rest are pure)."""


def __getattr__(name: str) -> Any:
    try:
        return _lazy_getattr(name)
    except ModuleNotFoundError as exc:
        if name in VERL_NAMES and (exc.name or "").partition(".")[0] == "verl":
            raise ModuleNotFoundError(
                f"osmosis_trainer.verl.{name} needs verl installed (pip install verl): {exc}", name=exc.name
            ) from exc
        raise
