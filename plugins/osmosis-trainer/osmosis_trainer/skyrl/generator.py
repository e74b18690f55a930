"""``OsmosisGenerator``: SkyRL's ``GeneratorInterface`` whose rollouts ``osmosis serve --traces`` runs.

SkyRL's trainer hands each step's prompts to ``generate`` (every prompt ``n_samples_per_prompt``
times in a row, with a ``TrajectoryID`` each); the generator sends one rollout request per
trajectory to an osmosis rollout server, with the policy SkyRL serves as the rollouts' model (its
vLLM router: ``get_endpoint_url()/v1``, under its served model name), SkyRL's sampling parameters
applied to every model call, and the step as the policy version; then turns the results' token
traces into SkyRL's ``GeneratorOutput`` (:func:`osmosis_trainer.skyrl.generator_output`: one row
per trajectory, or one row per stitched sequence step-wise; a failed rollout masked, never raised).

It needs SkyRL installed (``pip install skyrl``: Python >= 3.12); the rest of osmosis-trainer does not.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput

from osmosis_trainer.client import RolloutClient, RolloutRequest
from osmosis_trainer.groups import order_results
from osmosis_trainer.skyrl.convert import (
    FAILED_GROUPS,
    FailedGroups,
    default_label,
    generator_output,
    instance_of,
    sampling_from_skyrl,
    step_version,
)

__all__ = ["OsmosisGenerator"]

logger = logging.getLogger("osmosis_trainer.skyrl")


class OsmosisGenerator(GeneratorInterface):  # type: ignore[misc]  # SkyRL's classes are untyped
    """A SkyRL generator whose trajectories are rollouts of ``osmosis serve --traces``.

    :param server_url: the rollout server (``osmosis serve CONFIG --traces``).
    :param policy_url: the OpenAI base URL the rollouts' model calls go to: SkyRL's inference
        endpoint, ``inference_engine_client.get_endpoint_url() + "/v1"`` (:meth:`from_skyrl` sets it).
    :param model: the model name sent to the policy (SkyRL's served model name).
    :param token: the server's bearer token; default ``$OSMOSIS_SERVER_TOKEN``.
    :param policy_api_key: the bearer for ``policy_url``, if it needs one.
    :param step_wise: SkyRL's ``generator.step_wise_trajectories`` (must match it: SkyRL validates
        the output against it).
    :param failed_groups: ``"mask_group"`` (Harbor's) or ``"mask"``: see :mod:`osmosis_trainer.skyrl.convert`.
    :param concurrency: rollouts in flight at once.
    :param label: a trajectory's label from its ``env_extras`` (default :func:`default_label`).
    :param rollout_id_prefix: the rollout ids' prefix (default ``skyrl-`` and 8 random hex digits:
        one generator's ids never collide with another's on the server's run folder).
    :param overlong_filtering: SkyRL's ``generator.apply_overlong_filtering``.
    :param zero_reward_on_non_stop: SkyRL's ``generator.zero_reward_on_non_stop``.
    :param max_response_tokens: cut each response to this many tokens.
    :param agent_timeout_sec: each rollout's workflow timeout (default the server's).
    :param policy_version: a batch's policy version (default :func:`step_version`).
    """

    def __init__(
        self,
        server_url: str,
        policy_url: str,
        *,
        model: str | None = None,
        token: str | None = None,
        policy_api_key: str | None = None,
        step_wise: bool = False,
        failed_groups: FailedGroups = "mask_group",
        concurrency: int = 64,
        label: Callable[[Mapping[str, Any] | None], Any] = default_label,
        rollout_id_prefix: str | None = None,
        overlong_filtering: bool = False,
        zero_reward_on_non_stop: bool = False,
        max_response_tokens: int | None = None,
        agent_timeout_sec: float | None = None,
        policy_version: Callable[[Mapping[str, Any]], str | None] = step_version,
    ) -> None:
        if failed_groups not in FAILED_GROUPS:
            raise ValueError(f"failed_groups must be one of {', '.join(FAILED_GROUPS)}, got {failed_groups!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.client = RolloutClient(server_url, token=token)
        self.policy_url = policy_url
        self.model = model
        self._policy_api_key = policy_api_key
        self.step_wise = step_wise
        self.failed_groups: FailedGroups = failed_groups
        self.concurrency = concurrency
        self.label = label
        self.rollout_id_prefix = rollout_id_prefix or f"skyrl-{uuid.uuid4().hex[:8]}"
        self.overlong_filtering = overlong_filtering
        self.zero_reward_on_non_stop = zero_reward_on_non_stop
        self.max_response_tokens = max_response_tokens
        self.agent_timeout_sec = agent_timeout_sec
        self.policy_version = policy_version
        self._batches = 0
        self._groups = 0
        self._warned: set[tuple[str, ...]] = set()

    def __repr__(self) -> str:
        return f"OsmosisGenerator({self.client.url!r}, {self.policy_url!r}, step_wise={self.step_wise})"

    @classmethod
    def from_skyrl(cls, cfg: Any, inference_engine_client: Any, *, server_url: str, **options: Any) -> OsmosisGenerator:
        """The generator for a SkyRL config and its inference client (what ``BasePPOExp.get_generator``
        receives): the rollouts call ``inference_engine_client.get_endpoint_url() + "/v1"`` under the
        name the engine knows the policy by (SkyRL's ``resolve_policy_model_name``: the served model
        name, the model path, or the LoRA adapter's name), with ``step_wise``, ``overlong_filtering``
        and ``zero_reward_on_non_stop`` from ``cfg.generator``. ``options`` go to the constructor."""
        from skyrl.backends.skyrl_train.inference_servers.utils import resolve_policy_model_name

        generator_cfg = cfg.generator
        settings: dict[str, Any] = {
            "model": resolve_policy_model_name(cfg),
            "step_wise": bool(generator_cfg.step_wise_trajectories),
            "overlong_filtering": bool(generator_cfg.apply_overlong_filtering),
            "zero_reward_on_non_stop": bool(getattr(generator_cfg, "zero_reward_on_non_stop", False)),
        }
        policy_url = inference_engine_client.get_endpoint_url().rstrip("/") + "/v1"
        return cls(server_url, policy_url, **{**settings, **options})

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        """Run one rollout per trajectory of ``input_batch``; SkyRL's output, in the batch's order."""
        requests = self._requests(input_batch)
        finished = [result async for result in self.client.run_many(requests, concurrency=self.concurrency)]
        output = generator_output(
            order_results(requests, finished),
            input_batch["trajectory_ids"],
            step_wise=self.step_wise,
            failed_groups=self.failed_groups,
            overlong_filtering=self.overlong_filtering,
            zero_reward_on_non_stop=self.zero_reward_on_non_stop,
            max_response_tokens=self.max_response_tokens,
        )
        return cast(GeneratorOutput, output)

    def _requests(self, input_batch: Mapping[str, Any]) -> list[RolloutRequest]:
        """The rollout requests of a batch (one per trajectory, in its order): what :meth:`generate` sends.

        :raises ValueError: no ``trajectory_ids``, or lists of different lengths (the message names them).
        """
        prompts = input_batch["prompts"]
        trajectory_ids = input_batch.get("trajectory_ids")
        if trajectory_ids is None:
            raise ValueError("the generator input has no trajectory_ids: SkyRL's trainer sets them, one per prompt")
        if len(prompts) != len(trajectory_ids):
            raise ValueError(f"{len(prompts)} prompts for {len(trajectory_ids)} trajectory_ids")
        extras = input_batch.get("env_extras")
        if extras is not None and len(extras) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts for {len(extras)} env_extras")
        sampling, dropped = sampling_from_skyrl(input_batch.get("sampling_params"))
        if dropped and dropped not in self._warned:
            self._warned.add(dropped)
            logger.warning("sampling_params osmosis serve cannot apply, left out: %s", ", ".join(dropped))
        version = self.policy_version(input_batch)
        batch, self._batches = self._batches, self._batches + 1
        groups: dict[Any, int] = {}
        samples: dict[int, int] = {}
        requests = []
        for index, (prompt, tid) in enumerate(zip(prompts, trajectory_ids, strict=True)):
            instance = instance_of(tid)
            group = groups.setdefault(instance, self._groups + len(groups))
            sample = samples[group] = samples.get(group, -1) + 1
            requests.append(
                RolloutRequest(
                    rollout_id=f"{self.rollout_id_prefix}-b{batch}-g{group}-s{sample}",
                    initial_messages=list(prompt),
                    chat_completions_url=self.policy_url,
                    llm_api_key=self._policy_api_key,
                    label=self.label(extras[index] if extras is not None else None),
                    model=self.model,
                    row=group,
                    sample_index=sample,
                    sampling_params=sampling,
                    policy_version=version,
                    agent_timeout_sec=self.agent_timeout_sec,
                )
            )
        self._groups += len(groups)
        return requests
