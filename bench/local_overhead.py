"""LocalBackend's per-rollout overhead against a plain-asyncio floor doing the same work.

2,000 trivial rollouts (no model call: the agent builds a 3-message history, the grader scores
it) at concurrency 64, both driven by asyncio.gather; repeated, alternating, best and median kept.
The floor awaits the same agent and grader coroutines under an asyncio.Semaphore; LocalBackend
adds what a backend must do: per-rollout workflow and grader instances and config copies, the
rollout context, separate workflow and grader limits, timeouts (600 s / 120 s, as a run sets
them), results with timings, and the callbacks.
Prints microseconds per rollout (wall / N), the ratio to the floor, and peak RSS.

    python bench/local_overhead.py [--n 2000] [--concurrency 64] [--repeat 5]

Target: LocalBackend within 2x of the floor. (The reference SDK measured 380-1,060 us per rollout
here against a floor of 67-114 us.)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
import time

from osmosis_core import (
    AgentWorkflow,
    AgentWorkflowConfig,
    ConcurrencyConfig,
    ExecutionRequest,
    ExecutionResult,
    Grader,
    LocalBackend,
    PolicyEndpoint,
    RolloutSample,
)

POLICY = PolicyEndpoint("http://127.0.0.1:9/v1", "m")


def history(prompt: list[dict]) -> list[dict]:
    return [*prompt, {"role": "assistant", "content": "calling"}, {"role": "assistant", "content": "#### 42"}]


def score(sample: RolloutSample, label: str) -> float:
    return 1.0 if sample.last_text().endswith(label) else 0.0


async def agent(prompt: list[dict]) -> list[dict]:
    """The "agent": what both the floor and the workflow await."""
    return history(prompt)


async def judge(sample: RolloutSample, label: str) -> float:
    """The "grader": what both the floor and the grader await."""
    return score(sample, label)


class Trivial(AgentWorkflow):
    async def run(self, ctx):
        return await agent(ctx.prompt)


class TrivialGrader(Grader):
    async def grade(self, ctx):
        return await judge(ctx.sample, ctx.label)


def requests(n: int, timeouts: bool) -> list[ExecutionRequest]:
    agent_timeout, grader_timeout = (600.0, 120.0) if timeouts else (None, None)
    return [
        ExecutionRequest(
            f"r{i}",
            [{"role": "user", "content": f"q{i}"}],
            POLICY,
            label="42",
            agent_timeout_sec=agent_timeout,
            grader_timeout_sec=grader_timeout,
        )
        for i in range(n)
    ]


async def floor(reqs: list[ExecutionRequest], concurrency: int) -> list[float]:
    sem = asyncio.Semaphore(concurrency)
    rewards: list[float] = []

    async def one(req: ExecutionRequest) -> None:
        async with sem:
            if req.agent_timeout_sec is None:
                sample = RolloutSample(messages=await agent(req.prompt))
                sample.reward = await judge(sample, req.label)
            else:
                async with asyncio.timeout(req.agent_timeout_sec):
                    sample = RolloutSample(messages=await agent(req.prompt))
                async with asyncio.timeout(req.grader_timeout_sec):
                    sample.reward = await judge(sample, req.label)
            rewards.append(sample.reward)

    await asyncio.gather(*(one(r) for r in reqs))
    return rewards


async def backend_run(reqs: list[ExecutionRequest], concurrency: int) -> list[float]:
    config = AgentWorkflowConfig(concurrency=ConcurrencyConfig(max_concurrent=concurrency))
    backend = LocalBackend(Trivial, config, TrivialGrader)
    rewards: list[float] = []

    async def on_workflow(result: ExecutionResult) -> None:
        pass

    async def on_grader(result: ExecutionResult) -> None:
        rewards.append(result.reward)

    await asyncio.gather(*(backend.execute(r, on_workflow, on_grader) for r in reqs))
    return rewards


def timed(fn, reqs, concurrency) -> float:
    gc.collect()
    start = time.perf_counter()
    rewards = asyncio.run(fn(reqs, concurrency))
    elapsed = time.perf_counter() - start
    assert len(rewards) == len(reqs), "the work was not done"
    assert all(r == 1.0 for r in rewards), "the work was not done"
    return elapsed / len(reqs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"local_overhead: {args.n} trivial rollouts, concurrency {args.concurrency}, {args.repeat} runs each")
    for timeouts in (False, True):
        reqs = requests(args.n, timeouts)
        timed(floor, reqs, args.concurrency)  # warm-up
        timed(backend_run, reqs, args.concurrency)
        floors, backends = [], []
        for _ in range(args.repeat):
            floors.append(timed(floor, reqs, args.concurrency))
            backends.append(timed(backend_run, reqs, args.concurrency))
        ratios = [b / f for b, f in zip(backends, floors, strict=True)]
        f_med, b_med = statistics.median(floors), statistics.median(backends)
        print(
            f"  {'with' if timeouts else 'without'} timeouts (agent 600 s, grader 120 s, on both sides):"
            if timeouts
            else "  without timeouts:"
        )
        print(f"    plain asyncio floor : median {f_med:6.1f} us/rollout, best {min(floors):6.1f}")
        print(f"    LocalBackend        : median {b_med:6.1f} us/rollout, best {min(backends):6.1f}")
        print(f"    added per rollout   : {b_med - f_med:6.1f} us")
        print(
            f"    ratio to floor      : median {statistics.median(ratios):.2f}x, best {min(ratios):.2f}x (target <= 2x)"
        )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  peak RSS: {rss:.0f} MB")


if __name__ == "__main__":
    main()
