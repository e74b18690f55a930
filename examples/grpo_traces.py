"""GRPO on token-level traces: group advantages spread over the tokens the policy generated.

The sibling of ``grpo_loop.py`` for the part a trainer does with tokens. Each step runs ``n``
rollouts of each row (the multiply-plain example on the ``local`` backend) through a policy
gateway (``osmosis_gateway.PolicyGateway``) in front of the inference server, takes each
rollout's trace out of the gateway, and turns it into training sequences with
``trainer_view``: token ids exactly as the server saw and produced them, stitched by token
prefix, a loss mask (1 on generated tokens), and the sampling logprobs. The group-relative
advantage of each rollout ``(r - mean) / (std + eps)`` is then spread over its masked tokens, and
the (toy) policy-gradient loss ``-sum(A * logprob * mask) / sum(mask)`` is what a trainer would
backpropagate (with the current policy's logprobs in place of the sampling ones). A rollout
whose trace is incomplete is dropped from its group, never trained on.

With no arguments the "policy" is the scripted calculator of ``osmosis_core.testing`` answering
like vLLM (token ids, logprobs), wrong some of the time, less after each step. It is not a model.

    python examples/grpo_traces.py                        # 3 steps, 4 rows x 8 samples
    python examples/grpo_traces.py --policy-url http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B   # vLLM
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_loop import DATASET, advantages, noisy_calculator, read_rows  # noqa: E402


def load_example() -> Any:
    """rollouts/multiply-plain/main.py (its workflow and grader)."""
    spec = importlib.util.spec_from_file_location(
        "multiply_plain_main", ROOT / "rollouts" / "multiply-plain" / "main.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def token_advantages(advantage: float, mask: list[int]) -> list[float]:
    """One rollout's advantage on each token it generated, 0.0 elsewhere."""
    return [advantage if m else 0.0 for m in mask]


async def train(args: argparse.Namespace, policy_url: str, noisy: dict[str, float] | None) -> None:
    from osmosis_core import ExecutionRequest, LocalBackend, PolicyEndpoint
    from osmosis_core.http import http_scope
    from osmosis_gateway import PolicyGateway, trainer_view

    example = load_example()
    rows = read_rows(Path(args.dataset))
    backend = LocalBackend(example.MultiplyWorkflow, None, example.MultiplyGrader, None)
    upstream = PolicyEndpoint(policy_url, args.model)
    async with http_scope(), PolicyGateway(upstream, adapter=args.adapter) as gateway:
        print(f"gateway {gateway.url} in front of {policy_url} (adapter {args.adapter})")
        for step in range(1, args.steps + 1):
            gateway.policy_version = f"step-{step}"  # recorded on every call: off-policy correction
            batch = [(i % len(rows), rows[i % len(rows)]) for i in range((step - 1) * args.rows, step * args.rows)]
            rewards: dict[str, float] = {}

            async def one(index: int, row: dict[str, Any], k: int, step: int, rewards: dict[str, float]) -> str:
                rollout_id = f"step{step}-row{index}-s{k}"
                request = ExecutionRequest(
                    rollout_id=rollout_id,
                    prompt=row["messages"],
                    policy=gateway.open_rollout(rollout_id),
                    label=row["label"],
                )

                async def keep(result: Any) -> None:
                    reward = result.sample.reward if result.ok and result.sample is not None else None
                    rewards[rollout_id] = reward if reward is not None else 0.0  # a failure scores 0

                await backend.execute(request, keep, keep)
                return rollout_id

            ids = await asyncio.gather(
                *(one(index, row, k, step, rewards) for index, row in batch for k in range(args.n))
            )
            traces = {rollout_id: gateway.pop_trace(rollout_id) for rollout_id in ids}  # the gateway forgets them
            numerator = denominator = 0.0
            dropped = breaks = sequences = 0
            for index, _row in batch:
                group = [f"step{step}-row{index}-s{k}" for k in range(args.n)]
                kept = [r for r in group if traces[r] is not None and traces[r].complete]  # type: ignore[union-attr]
                dropped += len(group) - len(kept)
                if not kept:
                    continue
                for rollout_id, advantage in zip(kept, advantages([rewards[r] for r in kept]), strict=True):
                    view = trainer_view(traces[rollout_id])  # type: ignore[arg-type]
                    breaks += view.prefix_breaks
                    for sequence in view.sequences:
                        sequences += 1
                        per_token = token_advantages(advantage, sequence.loss_mask)
                        numerator += sum(a * lp for a, lp in zip(per_token, sequence.logprobs, strict=True))
                        denominator += sum(sequence.loss_mask)
            mean = statistics.fmean(rewards.values())
            loss = -numerator / denominator if denominator else 0.0
            print(
                f"step {step}: {len(ids)} rollouts, mean reward {mean:.2f}, {sequences} sequences, "
                f"{int(denominator)} trained tokens, {breaks} prefix breaks, {dropped} incomplete dropped, "
                f"pg loss {loss:+.4f}"
            )
            # <- a real trainer: backpropagate that loss (with the current policy's logprobs and an
            #    importance ratio against sequence.logprobs), then publish the new weights
            if noisy is not None:
                noisy["p_wrong"] *= 0.5  # the stand-in "learns"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy-url", help="the inference server's OpenAI base URL (default: a stand-in)")
    parser.add_argument("--model", default="osmosis-stub")
    parser.add_argument("--adapter", default="vllm", choices=["vllm", "sglang"])
    parser.add_argument("--dataset", default=str(DATASET))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    args = parser.parse_args()
    stand_in = None
    noisy: dict[str, float] | None = None
    try:
        policy_url = args.policy_url
        if policy_url is None:
            from osmosis_core.testing import ScriptedPolicyServer

            noisy = {"p_wrong": 0.5}
            stand_in = ScriptedPolicyServer(noisy_calculator(noisy), flavor="vllm").start()
            policy_url = stand_in.url
            print(f"policy: a scripted stand-in answering like vLLM at {policy_url} (not a model)")
        asyncio.run(train(args, policy_url, noisy))
    finally:
        if stand_in is not None:
            stand_in.stop()


if __name__ == "__main__":
    main()
