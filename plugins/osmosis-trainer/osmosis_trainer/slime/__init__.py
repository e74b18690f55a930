"""slime with osmosis rollouts: a custom generate function whose samples ``osmosis serve --traces`` runs.

* :func:`generate` (:mod:`.rollout`): ``--custom-generate-function-path osmosis_trainer.slime.generate``;
  each sample one rollout request whose policy is slime's SGLang router (the rollout server's
  token-in gateway calls its ``/generate``), the result always a ``list[Sample]``: the sample filled
  (a list of one), or one per sequence sharing one ``rollout_id`` when the rollout forked;
  :func:`check_args` refuses the slime settings a rollout cannot serve (``--rollout-top-p`` < 1.0);
* :func:`samples_of` (:mod:`.convert`): that conversion, pure, on slime's ``Sample`` by duck typing.

Nothing here imports slime or torch. See osmosis-trainer's README, "slime".
"""

from typing import TYPE_CHECKING

import lazy_loader

if TYPE_CHECKING:
    from osmosis_trainer.slime.convert import samples_of as samples_of
    from osmosis_trainer.slime.rollout import check_args as check_args
    from osmosis_trainer.slime.rollout import generate as generate
    from osmosis_trainer.slime.rollout import prompt_messages as prompt_messages

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={"convert": ["samples_of"], "rollout": ["check_args", "generate", "prompt_messages"]},
)
