"""SkyRL's experiment with osmosis rollouts: ``OsmosisExp`` (a ``BasePPOExp`` whose generator is
:class:`~osmosis_trainer.skyrl.OsmosisGenerator`) and its config, ``OsmosisSkyRLConfig``: SkyRL's
``SkyRLTrainConfig`` with an ``osmosis`` section, set on the command line like the rest::

    python -m osmosis_trainer.skyrl.experiment \\
        osmosis.server_url=http://rollouts:8000 generator.step_wise_trajectories=true \\
        trainer.policy.model.path=Qwen/Qwen3-0.6B ...        # SkyRL's own settings

or through SkyRL's own entrypoint: ``python -m skyrl.train.entrypoints.main_base
trainer.override_entrypoint=osmosis_trainer.skyrl.experiment osmosis.server_url=... ...``.
The server's token comes from the environment (``$OSMOSIS_SERVER_TOKEN``, or the variable
``osmosis.token_env`` names), never from the config: SkyRL logs its whole config.

No ``from __future__ import annotations`` here: SkyRL builds its config from the dataclasses'
field types, which must be types, not strings.
"""

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.config.config import BaseConfig
from skyrl.train.entrypoints.main_base import BasePPOExp

from osmosis_trainer.skyrl.convert import FAILED_GROUPS
from osmosis_trainer.skyrl.generator import OsmosisGenerator
from osmosis_trainer.wire import DEFAULT_TOKEN_ENV

__all__ = ["OsmosisConfig", "OsmosisExp", "OsmosisSkyRLConfig", "config_from_cli", "main"]


@dataclass
class OsmosisConfig(BaseConfig):  # type: ignore[misc]  # SkyRL's classes are untyped
    """The ``osmosis`` section: where the rollouts run, and how their failures are handled."""

    server_url: str | None = None
    """The rollout server: ``osmosis serve CONFIG --traces`` (required)."""
    token_env: str = DEFAULT_TOKEN_ENV
    """The environment variable holding the server's bearer token (unset: no token)."""
    concurrency: int = 64
    """Rollouts in flight at once."""
    failed_groups: str = "mask_group"
    """``mask_group`` (a failed rollout masks its prompt's group: Harbor's rule) or ``mask`` (only itself)."""
    rollout_id_prefix: str | None = None
    """The rollout ids' prefix (default: ``skyrl-`` and 8 random hex digits)."""
    max_response_tokens: int | None = None
    """Cut each response to this many tokens."""
    agent_timeout_sec: float | None = None
    """Each rollout's workflow timeout (default: the server's)."""


@dataclass
class OsmosisSkyRLConfig(SkyRLTrainConfig):  # type: ignore[misc]
    """SkyRL's ``SkyRLTrainConfig`` with the :class:`OsmosisConfig` section ``osmosis``."""

    osmosis: OsmosisConfig = field(default_factory=OsmosisConfig)


class OsmosisExp(BasePPOExp):  # type: ignore[misc]
    """SkyRL's PPO experiment whose trajectories are rollouts of ``osmosis serve --traces``, calling
    the policy SkyRL serves (its inference endpoint ``/v1``, its served model name)."""

    def get_generator(self, cfg: Any, tokenizer: Any, inference_engine_client: Any) -> OsmosisGenerator:
        """:meth:`OsmosisGenerator.from_skyrl` with the config's ``osmosis`` section.

        :raises ValueError: ``osmosis.server_url`` is not set, or ``osmosis.failed_groups`` is unknown.
        """
        section = getattr(cfg, "osmosis", None) or OsmosisConfig()
        if not section.server_url:
            raise ValueError("osmosis.server_url is not set: the URL of `osmosis serve CONFIG --traces`")
        if section.failed_groups not in FAILED_GROUPS:
            raise ValueError(
                f"osmosis.failed_groups must be one of {', '.join(FAILED_GROUPS)}, got {section.failed_groups!r}"
            )
        return OsmosisGenerator.from_skyrl(
            cfg,
            inference_engine_client,
            server_url=section.server_url,
            token=os.environ.get(section.token_env, ""),  # unset: no token (not the default variable)
            concurrency=section.concurrency,
            failed_groups=section.failed_groups,
            rollout_id_prefix=section.rollout_id_prefix,
            max_response_tokens=section.max_response_tokens,
            agent_timeout_sec=section.agent_timeout_sec,
        )


def config_from_cli(argv: Sequence[str]) -> OsmosisSkyRLConfig:
    """The config of ``key.path=value`` arguments (SkyRL's ``from_cli_overrides``; an unknown key
    is an error naming the valid ones). SkyRL's ``trainer.override_entrypoint`` argument, which
    brought the run here, is dropped."""
    args = [arg for arg in argv if not arg.startswith("trainer.override_entrypoint=")]
    config: OsmosisSkyRLConfig = OsmosisSkyRLConfig.from_cli_overrides(args)
    return config


def main(argv: Sequence[str] | None = None) -> None:
    """Train: SkyRL's ``main_base.main`` with :class:`OsmosisExp` (validate the config, start Ray, run
    the experiment in a Ray task off the head node)."""
    import ray
    from skyrl.train.utils import validate_cfg
    from skyrl.train.utils.utils import initialize_ray

    cfg = config_from_cli(sys.argv[1:] if argv is None else argv)
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(ray.remote(num_cpus=1)(_run_experiment).remote(cfg))


def _run_experiment(cfg: OsmosisSkyRLConfig) -> None:
    OsmosisExp(cfg).run()


if __name__ == "__main__":
    # the canonically imported module's main, so Ray's workers import the same classes by name
    from osmosis_trainer.skyrl.experiment import main as _main

    _main()
