"""SkyRL with osmosis rollouts: a ``GeneratorInterface`` whose trajectories ``osmosis serve --traces`` runs.

* :class:`OsmosisGenerator` (:mod:`.generator`): SkyRL's ``GeneratorInput`` (prompts, env_extras,
  sampling_params, trajectory_ids) as rollout requests (SkyRL's sampling parameters on every model
  call, ``step-<global_step>`` as the policy version), the results as its ``GeneratorOutput``;
* :class:`OsmosisExp`, :class:`OsmosisSkyRLConfig` (:mod:`.experiment`): SkyRL's ``BasePPOExp``
  with that generator, calling the policy SkyRL serves (``get_endpoint_url()/v1``, its served model
  name), and an ``osmosis`` config section (``osmosis.server_url=...``);
* :func:`generator_output`, :func:`sampling_from_skyrl` (:mod:`.convert`): the conversions, pure
  (no SkyRL, no torch): one row per trajectory, or per stitched sequence step-wise (as SkyRL's
  Harbor integration emits them); a failed rollout a masked ``[0]`` placeholder, never raised.

Importing this package imports neither SkyRL nor torch; :class:`OsmosisGenerator` and the
experiment need SkyRL installed (``pip install skyrl``, Python >= 3.12). See osmosis-trainer's README,
"SkyRL".
"""

from typing import TYPE_CHECKING, Any

import lazy_loader

if TYPE_CHECKING:
    from osmosis_trainer.skyrl.convert import FailedGroups as FailedGroups
    from osmosis_trainer.skyrl.convert import default_label as default_label
    from osmosis_trainer.skyrl.convert import generator_output as generator_output
    from osmosis_trainer.skyrl.convert import sampling_from_skyrl as sampling_from_skyrl
    from osmosis_trainer.skyrl.convert import step_version as step_version
    from osmosis_trainer.skyrl.experiment import OsmosisConfig as OsmosisConfig
    from osmosis_trainer.skyrl.experiment import OsmosisExp as OsmosisExp
    from osmosis_trainer.skyrl.experiment import OsmosisSkyRLConfig as OsmosisSkyRLConfig
    from osmosis_trainer.skyrl.generator import OsmosisGenerator as OsmosisGenerator

_lazy_getattr, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "convert": ["FailedGroups", "default_label", "generator_output", "sampling_from_skyrl", "step_version"],
        "experiment": ["OsmosisConfig", "OsmosisExp", "OsmosisSkyRLConfig"],
        "generator": ["OsmosisGenerator"],
    },
)

SKYRL_NAMES = frozenset({"OsmosisConfig", "OsmosisExp", "OsmosisGenerator", "OsmosisSkyRLConfig"})
"""The names that need SkyRL installed (the rest are pure)."""


def __getattr__(name: str) -> Any:
    try:
        return _lazy_getattr(name)
    except ModuleNotFoundError as exc:
        if name in SKYRL_NAMES and (exc.name or "").partition(".")[0] == "skyrl":
            raise ModuleNotFoundError(
                f"osmosis_trainer.skyrl.{name} needs SkyRL installed (pip install skyrl; Python >= 3.12): {exc}",
                name=exc.name,
            ) from exc
        raise
