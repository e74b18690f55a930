"""The SkyRL generator against SkyRL itself: its ``validate_generator_output``, its trainer's
``generate`` and ``postprocess_generator_output`` (SkyRL's ``RayPPOTrainer`` built on the CPU, as
SkyRL's own CPU tests build it), its ``merge_stepwise_output``, and real rollouts of ``osmosis serve
--traces`` with the scripted policy (vLLM's token ids; ``drifting`` for broken prefixes; faults
injected for failed rollouts).

Needs SkyRL installed (the ``skyrl`` nox session: SkyRL's published package on Python 3.11 with
torch's CPU build); skipped elsewhere. SkyRL 0.4.0 declares Python >= 3.12, where the only torch on
PyPI is a CUDA build of several GB; on 3.11 its code runs unchanged once ``typing.TypedDict`` is
``typing_extensions.TypedDict`` (pydantic refuses the former in a model before Python 3.12, and
``skyrl.tinker.types`` has one): this module sets that before SkyRL is imported, nothing else.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import typing
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trainer_helpers import LABELS, PROMPTS, call

if sys.version_info < (3, 12) and importlib.util.find_spec("skyrl") is not None:  # see the module docstring
    import typing_extensions

    typing.TypedDict = typing_extensions.TypedDict  # type: ignore[assignment,misc]

pytest.importorskip("skyrl.train.trainer", reason="SkyRL is not installed (the skyrl nox session installs it)")

from skyrl.backends.skyrl_train.inference_servers.engine_utils import get_sampling_params_for_backend
from skyrl.train.dataset.preprocess import convert_prompts_responses_to_batch_tensors
from skyrl.train.generators.base import GeneratorInterface, TrajectoryID
from skyrl.train.generators.utils import merge_stepwise_output, prepare_generator_input
from skyrl.train.trainer import RayPPOTrainer
from skyrl.train.utils.trainer_utils import validate_generator_output

from osmosis_trainer import RolloutResult, RolloutTrace
from osmosis_trainer.skyrl import (
    OsmosisExp,
    OsmosisGenerator,
    OsmosisSkyRLConfig,
    generator_output,
)
from osmosis_trainer.skyrl.experiment import config_from_cli

N = 2  # samples per prompt
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata's, in SkyRL


class _Dataset:  # what RayPPOTrainer's constructor needs of a dataset (SkyRL's CPU tests' DummyDataset)
    def __len__(self):
        return 1

    def __getitem__(self, index):
        return "unused"

    def collate_fn(self, batch):
        return batch


def skyrl_config(*, step_wise: bool = False, argv: list[str] = ()) -> OsmosisSkyRLConfig:
    cfg = config_from_cli(["trainer.policy.model.path=stub", *argv])
    cfg.trainer.train_batch_size = cfg.trainer.eval_batch_size = len(PROMPTS)
    cfg.trainer.resume_mode = "none"
    cfg.generator.n_samples_per_prompt = N
    cfg.generator.step_wise_trajectories = step_wise
    cfg.generator.merge_stepwise_output = step_wise
    cfg.generator.inference_engine.enable_ray_prometheus_stats = False  # (it asks Ray for its nodes)
    cfg.data.dataloader.num_workers = 0
    cfg.generator.sampling_params.temperature = 0.7
    cfg.generator.sampling_params.top_p = 0.9
    cfg.generator.sampling_params.max_generate_length = 256
    return cfg


def trainer_with(cfg, generator: GeneratorInterface) -> RayPPOTrainer:
    return RayPPOTrainer(
        cfg=cfg,
        tracker=None,
        tokenizer=None,
        train_dataset=_Dataset(),
        eval_dataset=None,
        inference_engine_client=None,
        generator=generator,
    )


def batch(cfg, step: int = 3):
    """SkyRL's own generator input for PROMPTS (its prepare_generator_input, its vLLM sampling params)."""
    rows = [
        {"prompt": prompt, "env_class": None, "env_extras": {"reward_spec": {"ground_truth": label}}, "uid": f"u{i}"}
        for i, (prompt, label) in enumerate(zip(PROMPTS, LABELS, strict=True))
    ]
    sampling = get_sampling_params_for_backend("vllm", cfg.generator.sampling_params)
    generator_input, _ = prepare_generator_input(rows, N, sampling, "osmosis", "train", step)
    return generator_input


def generate(trainer: RayPPOTrainer, generator_input):
    """SkyRL's ``RayPPOTrainer.generate``: our generator, then SkyRL's validate_generator_output with the
    trainer's step-wise setting; then its postprocessing (step-wise merging, per-token rewards)."""
    output = asyncio.run(trainer.generate(generator_input))
    uids = [tid.instance_id for tid in output["trajectory_ids"]]
    return output, trainer.postprocess_generator_output(dict(output), uids)


def traces_of(run_dir, prefix: str) -> dict[str, dict]:
    lines = (json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines())
    return {line["rollout_id"]: line for line in lines if line["rollout_id"].startswith(prefix)}


def test_one_row_per_trajectory_through_skyrls_trainer_with_the_trace_logprobs_and_the_sampling_it_set(
    live_server,
):
    cfg = skyrl_config()
    generator = OsmosisGenerator(
        live_server.url, live_server.policy_url, token=live_server.token, rollout_id_prefix="plain"
    )
    trainer = trainer_with(cfg, generator)
    output, (processed, uids) = generate(trainer, batch(cfg))
    assert len(output["response_ids"]) == len(PROMPTS) * N  # one row per trajectory, validated by SkyRL
    assert output["rewards"] == [1.0] * 4
    assert output["stop_reasons"] == ["stop"] * 4
    assert trainer.all_metrics["generate/num_masked_trajectories"] == 0  # rollout_metrics, taken by SkyRL
    traces = traces_of(live_server.run_dir, "plain-")
    for index in range(len(PROMPTS) * N):  # batch 0, the prompt's group, the sample in it
        calls = traces[f"plain-b0-g{index // N}-s{index % N}"]["calls"]
        first, last = calls[0], calls[-1]
        assert len(calls) == 2  # the tool call, then the answer
        assert output["prompt_token_ids"][index] == first["prompt_token_ids"]
        whole = output["prompt_token_ids"][index] + output["response_ids"][index]
        assert whole == last["prompt_token_ids"] + last["completion_token_ids"]
        logprobs = output["rollout_logprobs"][index]
        mask = output["loss_masks"][index]
        assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == first["logprobs"] + last["logprobs"]
        assert 0 in mask  # the tool's answer between the turns
        for made in calls:  # SkyRL's sampling params on every call, and the step as the policy version
            assert made["sampling"] == {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.0, "max_tokens": 256}
            assert made["policy_version"] == "step-3"
    assert uids == ["u0", "u0", "u1", "u1"]
    assert [reward[-1] for reward in processed["rewards"]] == [1.0] * 4  # SkyRL's per-token rewards
    tensors = convert_prompts_responses_to_batch_tensors(
        0,
        processed["prompt_token_ids"],
        processed["response_ids"],
        processed["rewards"],
        processed["loss_masks"],
        processed["rollout_logprobs"],
    )
    loss_masks, logprobs = tensors[4], tensors[5]
    assert logprobs is not None
    assert logprobs.shape == loss_masks.shape  # what SkyRL's off-policy correction asserts (TIS: #1870)
    assert float(logprobs.sum()) < 0.0


def harbor_rows(traces: dict[str, dict], rollout_ids: list[str], trajectory_ids, rewards) -> dict:
    """The step-wise rows SkyRL's Harbor integration emits for these traces: one per model call, loss mask
    1 on its generated tokens, the reward on the trajectory's last call (build_step_wise_generator_output)."""
    out = {key: [] for key in ("prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons")}
    out.update(rollout_logprobs=[], trajectory_ids=[], is_last_step=[], rollout_metrics=None)
    for rollout_id, tid, reward in zip(rollout_ids, trajectory_ids, rewards, strict=True):
        calls = traces[rollout_id]["calls"]
        for index, made in enumerate(calls):
            last = index == len(calls) - 1
            out["prompt_token_ids"].append(made["prompt_token_ids"])
            out["response_ids"].append(made["completion_token_ids"])
            out["rewards"].append(reward if last else 0.0)
            out["loss_masks"].append([1] * len(made["completion_token_ids"]))
            out["stop_reasons"].append("stop")
            out["rollout_logprobs"].append(made["logprobs"])
            out["trajectory_ids"].append(tid)
            out["is_last_step"].append(last)
    return out


ROW_KEYS = ("prompt_token_ids", "response_ids", "rewards", "loss_masks", "rollout_logprobs", "is_last_step")


def test_a_drifting_template_gives_step_wise_rows_as_harbors_integration_emits_them(live_server, start_policy):
    drifting = start_policy(flavor="drifting")
    cfg = skyrl_config(step_wise=True, argv=["generator.inference_engine.served_model_name=stub-policy"])
    endpoint = SimpleNamespace(get_endpoint_url=lambda: drifting.removesuffix("/v1") + "/")  # SkyRL's client
    generator = OsmosisGenerator.from_skyrl(
        cfg, endpoint, server_url=live_server.url, token=live_server.token, rollout_id_prefix="drift"
    )
    assert (generator.policy_url, generator.model, generator.step_wise) == (drifting, "stub-policy", True)
    trainer = trainer_with(cfg, generator)
    generator_input = batch(cfg)
    output, (merged, _) = generate(trainer, generator_input)  # validated step-wise by SkyRL
    assert output["is_last_step"] == [False, True] * 4  # every trajectory broke its prefix once
    assert output["rewards"] == [0.0, 1.0] * 4
    assert [tid.to_string() for tid in output["trajectory_ids"]] == [
        f"u{i}_{k}" for i in range(2) for k in range(N) for _ in range(2)
    ]
    assert trainer.all_metrics["osmosis/prefix_breaks"] == 4
    traces = traces_of(live_server.run_dir, "drift-")
    assert {made["model"] for trace in traces.values() for made in trace["calls"]} == {"stub-policy"}
    rollout_ids = [f"drift-b0-g{index // N}-s{index % N}" for index in range(len(PROMPTS) * N)]
    harbor = harbor_rows(traces, rollout_ids, generator_input["trajectory_ids"], [1.0] * 4)
    validate_generator_output(4, harbor, step_wise=True)
    by_skyrl = merge_stepwise_output(harbor)  # SkyRL's prefix merging of Harbor's per-call rows
    for key in ROW_KEYS:
        assert output[key] == by_skyrl[key], key  # ours, before SkyRL's merge, are already what it makes
    assert merged["response_ids"] == output["response_ids"]  # so SkyRL's merge finds nothing more to merge

    # the same results, one row per trajectory: a broken prefix cannot be one row, so each is masked
    results = [
        RolloutResult.from_json({"rollout_id": rid, "status": "success", "reward": 1.0, "trace": traces[rid]})
        for rid in rollout_ids
    ]
    plain = generator_output(results, generator_input["trajectory_ids"])
    validate_generator_output(4, plain, step_wise=False)  # one row per trajectory: each masked, none raised
    assert plain["loss_masks"] == [[0]] * 4
    assert plain["rollout_metrics"]["osmosis/masked_prefix_break"] == 4


@pytest.mark.parametrize(
    ("failed_groups", "masked", "rewards"), [("mask_group", 2, [0.0, 0.0]), ("mask", 1, [1.0, 1.0])]
)
def test_a_rollout_failed_by_the_policy_is_masked_and_the_step_goes_on(
    live_server, start_policy, failed_groups, masked, rewards
):
    prefix = f"fault-{failed_groups}"
    fault = {"rollout_id": f"{prefix}-b0-g0-s1", "times": 50, "kind": "status", "status": 500}
    policy = start_policy(faults=[fault])
    cfg = skyrl_config(step_wise=True)
    generator = OsmosisGenerator(
        live_server.url, policy, token=live_server.token, step_wise=True, failed_groups=failed_groups,
        rollout_id_prefix=prefix,
    )  # fmt: skip
    trainer = trainer_with(cfg, generator)
    output, (merged, uids) = generate(trainer, batch(cfg))  # SkyRL validates it; nothing raised
    assert output["response_ids"][1] == [0]
    assert (output["prompt_token_ids"][1], output["loss_masks"][1], output["stop_reasons"][1]) == ([0], [0], "error")
    assert output["rewards"][:2] == rewards
    assert sum(1 for mask in output["loss_masks"] if not any(mask)) == masked
    assert all(any(mask) for mask in output["loss_masks"][2:])  # the other prompt's group trains
    metrics = trainer.all_metrics
    assert (metrics["generate/num_error_trajectories"], metrics["osmosis/masked_failed"]) == (1, 1)
    assert metrics["generate/num_masked_trajectories"] == masked
    assert len(merged["response_ids"]) == len(uids) == len(output["response_ids"])


def test_the_experiment_wires_skyrls_inference_endpoint_and_the_osmosis_section(monkeypatch):
    monkeypatch.setenv("ROLLOUT_TOKEN", "s3cret")
    cfg = config_from_cli(
        [
            "trainer.override_entrypoint=osmosis_trainer.skyrl.experiment",  # how SkyRL's main_base came here
            "trainer.policy.model.path=stub",
            "osmosis.server_url=http://127.0.0.1:8000",
            "osmosis.token_env=ROLLOUT_TOKEN",
            "osmosis.failed_groups=mask",
            "osmosis.concurrency=8",
            "generator.step_wise_trajectories=true",
            "generator.apply_overlong_filtering=true",
            "generator.inference_engine.served_model_name=policy",
        ]
    )
    assert isinstance(cfg, OsmosisSkyRLConfig)
    experiment = object.__new__(OsmosisExp)  # (its __init__ loads a tokenizer and datasets, asks Ray for GPUs)
    endpoint = SimpleNamespace(get_endpoint_url=lambda: "http://127.0.0.1:9")
    generator = experiment.get_generator(cfg, None, endpoint)
    assert (generator.policy_url, generator.model) == ("http://127.0.0.1:9/v1", "policy")
    assert (generator.step_wise, generator.overlong_filtering, generator.failed_groups) == (True, True, "mask")
    assert (generator.client.url, generator.concurrency) == ("http://127.0.0.1:8000", 8)
    assert generator.client._auth == {"Authorization": "Bearer s3cret"}
    assert "s3cret" not in repr(generator)
    monkeypatch.delenv("ROLLOUT_TOKEN")
    monkeypatch.setenv("OSMOSIS_SERVER_TOKEN", "not-this-one")
    assert experiment.get_generator(cfg, None, endpoint).client._auth == {}  # the variable it names is unset
    with pytest.raises(ValueError, match=r"osmosis\.server_url is not set"):
        experiment.get_generator(config_from_cli(["trainer.policy.model.path=stub"]), None, endpoint)
    with pytest.raises(ValueError, match=r"Invalid fields \{'nope'\} for OsmosisConfig"):
        config_from_cli(["osmosis.nope=1"])


# -- SkyRL's validation of every shape a batch can take ------------------------------------------------


def _trace(kind: str, draw) -> tuple[list, str | None]:
    size = draw(st.integers(1, 4))
    prompt = [1] + [7] * draw(st.integers(0, 3))
    first = call(0, prompt, [3] * size)
    follow = prompt + [3] * size + [9]
    if kind == "clean":
        return [first, call(1, follow, [4])], None
    if kind == "drift":
        return [first, call(1, [*prompt, 9], [4, 4])], None
    if kind == "fork":  # a retry of the second call
        return [first, call(1, follow, [4]), call(2, follow, [5, 5])], None
    if kind == "incomplete":
        return [first, call(1, follow, None, status="cut")], "call 1 was cut"
    return [], None  # no call


KINDS = ["clean", "drift", "fork", "incomplete", "empty", "failed", "no_trace", "no_reward"]


@st.composite
def batches(draw):
    prompts = draw(st.integers(1, 3))
    samples = draw(st.integers(1, 3))
    results, ids = [], []
    for p in range(prompts):
        for k in range(samples):
            kind = draw(st.sampled_from(KINDS))
            rollout_id = f"p{p}-s{k}"
            data = {"rollout_id": rollout_id, "status": "success", "reward": draw(st.sampled_from([0.0, 0.5, 1.0]))}
            if kind == "failed":
                data.update(status="failure", error={"category": "agent_error", "message": "boom"})
            elif kind == "no_reward":
                data["reward"] = None
            if kind != "no_trace":
                calls, incomplete = _trace(kind if kind in ("drift", "fork", "incomplete", "empty") else "clean", draw)
                trace = RolloutTrace(rollout_id, calls=calls)
                if incomplete:
                    trace.mark_incomplete(incomplete)
                data["trace"] = trace.to_json()
            results.append(RolloutResult.from_json(data))
            ids.append(TrajectoryID(instance_id=f"u{p}", repetition_id=k))
    return results, ids


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.booleans(), st.sampled_from(["mask_group", "mask"]))
def test_every_batch_passes_skyrls_own_validation_and_its_step_wise_merge(drawn, step_wise, failed_groups):
    results, ids = drawn
    output = generator_output(results, ids, step_wise=step_wise, failed_groups=failed_groups)
    validate_generator_output(len(results), output, step_wise=step_wise)
    assert all(len(response) >= 1 for response in output["response_ids"])  # SkyRL puts the reward on [-1]
    if step_wise:
        merged = merge_stepwise_output(output)
        validate_generator_output(len(results), merged, step_wise=True)
        assert sum(merged["is_last_step"]) == len(results)
