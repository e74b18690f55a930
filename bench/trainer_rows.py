"""What turning a rollout into a trainer's rows costs the trainer, next to what the rollout cost.

A trainer that drives ``osmosis serve`` receives each rollout's result with its token trace and turns
it into its own rows (prompt ids, completion ids, loss mask, logprobs, reward), then computes
group-relative advantages over the step's batch. That work runs on the trainer's side, in the
training loop, once per rollout; this bench says whether it matters next to the rollout itself.

1. The rollouts, real: ``osmosis serve CONFIG --traces`` (a child process) against the scripted
   stand-in answering as vLLM (another child: token ids and logprobs), driven by
   ``RolloutClient.run_many`` from this process. Two kinds: multiply-plain from ``rollouts/`` (a tool
   call, then the answer: 2 model calls) and ``bench/multi_turn`` (5 questions in one conversation:
   10 calls, each prompt extending the last). After a warm-up batch, the server's CPU over a batch
   (user + system, from ``/proc/<pid>/stat``) divided by its rollouts is the rollout's own cost: the
   agent loop, the gateway capturing every call's tokens, grading, HTTP, ``results.jsonl`` and
   ``traces.jsonl``. The stand-in's CPU (the model's, a GPU's in a real run) is not counted.
2. The conversion, in this process on the results the batch returned: process CPU time of many
   repetitions, best of ``--repeat`` rounds, per rollout:

   * ``osmosis_trainer.rollout_rows(result, sequences="last")`` (one row per rollout: TRL, verl) and
     ``sequences="all"`` (a row per stitched sequence: SkyRL, slime);
   * ``group_advantages`` over the batch's rewards (groups of ``--group``), per rollout;
   * the TRL and SkyRL adapters' builders: ``OsmosisRollout``'s ``rollout_func`` rows (from
     ``rollout_rows``, timed with it) and SkyRL's step-wise ``GeneratorOutput`` (neither needs TRL or
     SkyRL installed).

Printed: each figure in microseconds per rollout, and its ratio to the server's CPU per rollout,
all taken in one run (printed, never asserted). The server and the stand-in run on the same shared
cores as this process, so the server's figure is noisy from run to run; the conversion's, a best of
several CPU-time rounds, is steady. Both are CPU, not wall time: a rollout's wall time is mostly the
model's, which a real run spends on a GPU.

    python bench/trainer_rows.py [--rollouts 256] [--multi-turn 128] [--concurrency 32] [--group 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _serve import CONFIG, Served, ticks  # (bench/ is the script's folder: on sys.path)

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = "You are a careful calculator. Use the multiply tool, then answer on the last line as: #### <number>"


def requests_for(kind: str, n: int, group: int, policy_url: str, tag: str) -> list[Any]:
    """``n`` requests as a trainer sends them: each prompt ``group`` times in a row, a step's version."""
    from osmosis_trainer import RolloutRequest, SamplingParams

    out = []
    for i in range(n):
        prompt, sample = i // group, i % group
        a, b = 11 + prompt % 89, 3 + prompt % 7
        questions = [[a + k, b + k] for k in range(1, 5)] if kind == "multi" else []
        last = questions[-1] if questions else [a, b]
        out.append(
            RolloutRequest(
                rollout_id=f"{tag}-p{prompt}-s{sample}",
                initial_messages=[
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"val1 = {a}\nval2 = {b}"},
                ],
                chat_completions_url=policy_url,
                label=str(last[0] * last[1]),
                metadata={"questions": questions} if questions else None,
                row=prompt,
                sample_index=sample,
                sampling_params=SamplingParams(temperature=1.0, max_tokens=256),
                policy_version=tag,
            )
        )
    return out


async def collect(url: str, token: str, requests: Sequence[Any], concurrency: int) -> list[Any]:
    from osmosis_trainer import RolloutClient, order_results

    async with RolloutClient(url, token=token) as client:
        finished = [result async for result in client.run_many(requests, concurrency=concurrency)]
    return order_results(requests, finished)


def run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def per_rollout(
    works: dict[str, Callable[[], Any]], rollouts: int, repeat: int, min_sec: float = 0.2
) -> dict[str, float]:
    """Process CPU seconds per rollout of each of ``works`` (each handles ``rollouts`` of them): best of
    ``repeat`` rounds, a round calling each work in turn until ``min_sec`` of CPU has gone by (so a
    spell of interference on the shared cores lands on every work's round alike, not on one of them)."""
    best = dict.fromkeys(works, float("inf"))
    for work in works.values():
        work()  # warm: imports, caches
    for _ in range(repeat):
        for name, work in works.items():
            calls = 0
            started = time.process_time()
            while (spent := time.process_time() - started) < min_sec or not calls:
                work()
                calls += 1
            best[name] = min(best[name], spent / (calls * rollouts))
    return best


def adapters(results: Sequence[Any], group: int) -> dict[str, Callable[[], Any]]:
    """The TRL and SkyRL builders, each from the batch's results to what its trainer takes: TRL's
    ``rollout_func`` rows (the rows ``OsmosisRollout`` returns, made from ``rollout_rows``) and SkyRL's
    step-wise ``GeneratorOutput`` (its trajectory ids as a trainer numbers them: a prompt's ``group``
    rollouts share one). Neither imports TRL or SkyRL."""
    from osmosis_trainer import rollout_rows
    from osmosis_trainer.skyrl import generator_output
    from osmosis_trainer.trl import OsmosisRollout

    ids = [(f"p{i // group}", i % group) for i in range(len(results))]
    return {
        "TRL rollout_func rows (OsmosisRollout)": lambda: OsmosisRollout._output(
            [rollout_rows(result, sequences="last")[0] for result in results], 0
        ),
        "SkyRL GeneratorOutput (step-wise)": lambda: generator_output(results, ids, step_wise=True),
    }


def measure(results: Sequence[Any], server_us: float, group: int, repeat: int) -> None:
    from osmosis_trainer import group_advantages, rollout_rows, rows_metrics

    n = len(results)
    rows_last = [row for result in results for row in rollout_rows(result, sequences="last")]
    rows_all = [row for result in results for row in rollout_rows(result, sequences="all")]
    figures = rows_metrics(rows_last)
    calls = sum(len(result.trace["calls"]) for result in results if result.trace)
    tokens = sum(len(row.prompt_ids) + len(row.completion_ids) for row in rows_last)
    print(
        f"  {n} rollouts, {calls / n:.1f} model calls and {tokens / n:,.0f} tokens each (the last row's prompt and "
        f"completion); rows: {len(rows_last)} last, {len(rows_all)} all; masked {figures['masked_rows']}, prefix "
        f"breaks {figures['prefix_breaks']}, rewards {sum(r.reward or 0.0 for r in results) / n:.2f} mean"
    )
    print(f"  {'rollout (osmosis serve, CPU per rollout)':<52} {server_us:9.1f} us")

    def line(what: str, seconds: float) -> None:
        us = seconds * 1e6
        print(f"  {what:<52} {us:9.1f} us   {us / server_us:6.3f} of the rollout's")

    rewards = [row.reward for row in rows_last]
    mask = [not row.masked for row in rows_last]
    last, advantages = 'rollout_rows(sequences="last")', f"group_advantages (batch of {n}, groups of {group})"
    works: dict[str, Callable[[], Any]] = {
        last: lambda: [rollout_rows(r, sequences="last") for r in results],
        'rollout_rows(sequences="all")': lambda: [rollout_rows(r, sequences="all") for r in results],
        advantages: lambda: group_advantages(rewards, group, mask=mask),
    }
    best = per_rollout({**works, **adapters(results, group)}, n, repeat)
    for what, seconds in best.items():
        line(what, seconds)
    line('rows ("last") + advantages', best[last] + best[advantages])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=256, help="2-call rollouts in the measured batch")
    parser.add_argument("--multi-turn", type=int, default=128, help="10-call rollouts in the measured batch")
    parser.add_argument("--warm", type=int, default=32, help="rollouts of each kind run first, not measured")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (the GRPO group)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of the conversion's timing (best kept)")
    args = parser.parse_args()
    from osmosis_core.testing import StubPolicyProcess

    tmp = Path(tempfile.mkdtemp(prefix="osmosis-bench-rows-"))
    token = secrets.token_urlsafe(24)
    print(
        f"trainer_rows: osmosis serve --traces against the scripted stand-in (vLLM flavour), driven by "
        f"RolloutClient.run_many at concurrency {args.concurrency}; conversion timed in this process "
        f"(Python {sys.version.split()[0]}, {os.cpu_count()} cores)"
    )
    try:
        with StubPolicyProcess(flavor="vllm") as stub:
            for kind, folder, n, what in (
                (
                    "plain",
                    ROOT / "rollouts" / "multiply-plain",
                    args.rollouts,
                    "multiply-plain: a tool call, then the answer",
                ),
                ("multi", ROOT / "bench" / "multi_turn", args.multi_turn, "multi_turn: 5 questions, 2 calls each"),
            ):
                config = tmp / f"{kind}.toml"
                config.write_text(CONFIG.format(rollout=folder, concurrency=args.concurrency))
                served = Served(config, tmp / f"run-{kind}", token, "--traces", "--log-level", "warning")
                try:
                    run(
                        collect(
                            served.url,
                            token,
                            requests_for(kind, args.warm, args.group, stub.url, "warm"),
                            args.concurrency,
                        )
                    )
                    requests = requests_for(kind, n, args.group, stub.url, "step-1")
                    before = ticks(served.pid)
                    results = run(collect(served.url, token, requests, args.concurrency))
                    server = (ticks(served.pid) - before) / n
                finally:
                    served.stop()
                print(f"{what}")
                failed = [r for r in results if not r.ok or r.trace is None]
                if failed:
                    print(f"  {len(failed)} of {n} rollouts failed or came without a trace: {failed[0].error}")
                measure(results, server * 1e6, args.group, args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
