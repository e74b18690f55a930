"""A GRPO-style training loop against an osmosis rollout server, without a GPU.

This is the trainer's side of the picture: it is where verl, SkyRL, TRL or your own loop plug in.
Each step takes a batch of dataset rows, asks the rollout server for ``n`` samples of each row
against the *current* policy endpoint, groups the rewards per row, and computes group-relative
advantages ``(r - mean) / (std + eps)`` with ``osmosis_trainer.group_advantages`` (a failed rollout is
left out of its group: no advantage, and not counted as a 0); a real trainer would then update the
model on those (samples, advantages) and publish the new weights to its inference server.

With no arguments it brings everything up itself on this machine:

* the rollout server: ``osmosis serve configs/training/multiply-plain.toml`` (a child process);
* a stand-in "policy": the scripted calculator server of ``osmosis_core.testing``, made to answer
  wrongly some of the time, less often after each step (so the rewards move as if it learned).
  It is not a model: the numbers say nothing about any model.

    python examples/grpo_loop.py                       # 3 steps, 4 rows x 8 samples each
    python examples/grpo_loop.py --steps 5 --rows 8 --n 4
    # against your own server and inference endpoint:
    OSMOSIS_SERVER_TOKEN=... python examples/grpo_loop.py --server http://10.0.0.5:8000 \\
        --policy-url http://10.0.0.6:8000/v1 --model Qwen/Qwen3-8B
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATASET = ROOT / "rollouts" / "multiply-plain" / "data" / "multiply.jsonl"
CONFIG = ROOT / "configs" / "training" / "multiply-plain.toml"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The dataset rows as prompts (chat messages) and labels."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        messages = []
        if row.get("system_prompt"):
            messages.append({"role": "system", "content": row["system_prompt"]})
        messages.append({"role": "user", "content": row["user_prompt"]})
        rows.append({"messages": messages, "label": row.get("ground_truth")})
    return rows


def advantages(rewards: list[float]) -> list[float]:
    """GRPO's group-relative advantages of one group's rewards (none of them missing)."""
    from osmosis_trainer import group_advantages

    return [a if a is not None else 0.0 for a in group_advantages(rewards, len(rewards))]


async def train(args: argparse.Namespace, server_url: str, token: str | None, policy_url: str, noisy: Any) -> None:
    from osmosis_trainer import RolloutClient, RolloutRequest, group_advantages, order_results

    rows = read_rows(Path(args.dataset))
    async with RolloutClient(server_url, token=token) as client:
        health = await client.health()
        print(f"rollout server {server_url}: backend runs {health.get('max_concurrency', '?')} at once")
        for step in range(1, args.steps + 1):
            batch = [(i % len(rows), rows[i % len(rows)]) for i in range((step - 1) * args.rows, step * args.rows)]
            requests = [
                RolloutRequest(
                    rollout_id=f"step{step}-row{index}-s{k}-{secrets.token_hex(3)}",
                    initial_messages=row["messages"],
                    chat_completions_url=policy_url,  # the *current* policy: a trainer's inference server
                    label=row["label"],
                    model=args.model,
                    row=index,
                    sample_index=k,
                )
                for index, row in batch
                for k in range(args.n)
            ]
            started = time.perf_counter()
            finished = [r async for r in client.run_many(requests, concurrency=args.concurrency)]  # completion order
            results = order_results(requests, finished)  # back in the requests' order: n in a row per row
            spent = time.perf_counter() - started
            # a failed rollout has no reward: it is left out of its group's mean and std, never scored 0
            rewards = [r.reward if r.ok else None for r in results]
            advantage = group_advantages(rewards, args.n)
            failed = sum(not r.ok for r in results)
            every = [r for r in rewards if r is not None]
            mean = f"{statistics.fmean(every):.2f}" if every else "-"
            print(
                f"step {step}: {len(batch)} rows x {args.n} samples in {spent:.1f}s, "
                f"mean reward {mean}{f', {failed} failed' if failed else ''}"
            )
            for start in range(0, len(results), args.n):
                index = requests[start].row
                shown = " ".join("-" if r is None else f"{r:g}" for r in rewards[start : start + args.n])
                adv = " ".join("-" if a is None else f"{a:+.2f}" for a in advantage[start : start + args.n])
                print(f"  row {index:3d}  rewards {shown}  advantages {adv}")
            # <- a real trainer: update the policy on (samples, advantages) here, then publish the new
            #    weights to the inference server behind policy_url (verl / SkyRL / TRL do this part)
            if noisy is not None:
                noisy["p_wrong"] *= 0.5  # the stand-in "learns"


def noisy_calculator(state: dict[str, float]) -> Any:
    """The scripted calculator, wrong with probability ``state["p_wrong"]`` on its final answer."""
    import random

    from osmosis_core.testing import Reply, calculator

    rng = random.Random(7)

    def script(request: dict[str, Any]) -> Reply:
        reply = calculator(request)
        if reply.content and "####" in reply.content and rng.random() < state["p_wrong"]:
            return Reply(content=re.sub(r"####\s*(-?\d+)", lambda m: f"#### {int(m.group(1)) + 1}", reply.content))
        return reply

    return script


def start_server(out: Path, token: str, concurrency: int) -> tuple[subprocess.Popen[str], str]:
    """`osmosis serve` of the multiply-plain training config, on a free port."""
    osmosis = Path(sys.executable).parent / "osmosis"
    # --watch-stdin: the server drains and stops when this script ends, however it ends (kill -9 too)
    args = ["serve", str(CONFIG), "--port", "0", "--watch-stdin", "--concurrency", str(concurrency)]
    proc = subprocess.Popen(
        [str(osmosis), *args, "--output", str(out)],
        env={**os.environ, "OSMOSIS_SERVER_TOKEN": token},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=(out.parent / "serve.log").open("w"),
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return proc, match.group(1)
    raise SystemExit(f"osmosis serve did not start (exit {proc.wait()}); see {out.parent / 'serve.log'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", help="a running rollout server (default: start osmosis serve here)")
    parser.add_argument("--policy-url", help="the policy's OpenAI-compatible base URL (default: a stand-in)")
    parser.add_argument("--model", default=None, help="the model name sent to the policy")
    parser.add_argument("--dataset", default=str(DATASET))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4, help="rows per step")
    parser.add_argument("--n", type=int, default=8, help="samples per row (the group GRPO compares)")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    if args.server and not args.policy_url:
        parser.error("--server needs --policy-url (the endpoint the rollouts call)")

    noisy: dict[str, float] | None = None
    stand_in = None
    served = None
    try:
        policy_url = args.policy_url
        if policy_url is None:
            from osmosis_core.testing import ScriptedPolicyServer

            noisy = {"p_wrong": 0.5}
            stand_in = ScriptedPolicyServer(noisy_calculator(noisy)).start()
            policy_url = stand_in.url
            print(f"policy: a scripted stand-in at {policy_url} (not a model; it answers wrongly at times)")
        token = os.environ.get("OSMOSIS_SERVER_TOKEN")
        server_url = args.server
        if server_url is None:
            token = secrets.token_urlsafe(24)
            out = Path(tempfile.mkdtemp(prefix="grpo-loop-")) / "run"
            served, server_url = start_server(out, token, args.concurrency)
            print(f"rollout server: osmosis serve {CONFIG.relative_to(ROOT)} (records in {out})")
        asyncio.run(train(args, server_url, token, policy_url, noisy))
    finally:
        if served is not None:
            served.send_signal(signal.SIGTERM)
            served.wait(60)
        if stand_in is not None:
            stand_in.stop()


if __name__ == "__main__":
    main()
