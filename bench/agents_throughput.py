"""Agent-framework rollouts against the scripted server: rollouts/s over the ideal, and CPU per rollout.

Each rollout is one tool call and one answer (two model calls): the real multiply templates of
osmosis-strands and osmosis-openai-agents, and a bare ``AsyncOpenAI`` loop doing the same two calls
through the same pooled client. All run through LocalBackend at concurrency 100 against the
scripted server (a child process) with 200 ms latency per call, so the ideal is
concurrency / (2 x latency) = 250 rollouts/s.

    python bench/agents_throughput.py [--rollouts 1000] [--concurrency 100] [--latency 0.2]

One full wave of rollouts runs first, untimed (imports, connections), in the same event loop.

Target: at least 0.8 of ideal for each framework. Frameworks that are not installed are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from osmosis_core import (
    AgentWorkflow,
    AgentWorkflowConfig,
    ConcurrencyConfig,
    ExecutionRequest,
    ExecutionResult,
    LocalBackend,
    PolicyEndpoint,
    PolicyError,
)
from osmosis_core._engine.registry import PluginRegistry
from osmosis_core._engine.workers import WorkerPool
from osmosis_core.testing import StubPolicyProcess

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


class BareOpenAI(AgentWorkflow):
    """The same two calls with the pooled AsyncOpenAI client and no framework."""

    async def run(self, ctx: Any) -> list[dict[str, Any]]:
        from osmosis_openai import rollout_openai_client

        client = rollout_openai_client()
        messages: list[dict[str, Any]] = list(ctx.prompt)
        for _ in range(4):
            completion = await client.chat.completions.create(model=ctx.policy.model, messages=messages, tools=TOOLS)
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return messages
            for call in message.tool_calls:
                args = json.loads(call.function.arguments)
                product = float(args["a"]) * float(args["b"])
                messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{product:g}"})
        raise PolicyError("no final answer after 4 calls")


def template_classes(name: str) -> tuple[type, type] | None:
    registry = PluginRegistry()
    try:
        spec = registry.template(name)
    except Exception:
        return None
    main = spec.root / "rollouts" / name / "main.py"
    module_spec = importlib.util.spec_from_file_location(f"bench_{name.replace('-', '_')}", main)
    assert module_spec is not None
    assert module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except ImportError as exc:
        print(f"  {name}: skipped ({exc})")
        return None
    return module.MultiplyWorkflow, module.MultiplyGrader


def requests(n: int, policy: PolicyEndpoint, tag: str) -> list[ExecutionRequest]:
    rng = random.Random(3)
    out = []
    for i in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        prompt = [
            {"role": "system", "content": "Use the multiply tool, then answer on the last line as: #### <number>"},
            {"role": "user", "content": f"val1 = {a}\nval2 = {b}"},
        ]
        out.append(ExecutionRequest(f"{tag}-{i}", prompt, policy, label=str(a * b), agent_timeout_sec=120))
    return out


def _cpu(worker_pids: list[int]) -> float:
    """CPU seconds of this process and the given worker processes (from /proc, while they run)."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for pid in worker_pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def backend_for(workflow: type, grader: type | None, concurrency: int, workers: int) -> Any:
    config = workflow.config_type() if workflow.config_type is not AgentWorkflowConfig else AgentWorkflowConfig()
    config = attrs.evolve(config, concurrency=ConcurrencyConfig(max_concurrent=concurrency))
    if workers > 1:  # forked here, before the event loop starts, as `osmosis run --workers N` does
        return WorkerPool(workflow, config, grader, workers=workers)
    return LocalBackend(workflow, config, grader)


async def measure(backend: Any, reqs: list[ExecutionRequest], concurrency: int) -> dict:
    finals: dict[str, ExecutionResult] = {}

    async def keep(result: ExecutionResult) -> None:
        finals[result.rollout_id] = result

    warm = reqs[:concurrency]
    await asyncio.gather(*(backend.execute(r, keep, keep) for r in warm))  # one full wave: imports, connections
    finals.clear()
    timed = reqs[len(warm) :]
    pids = [w["pid"] for w in backend.health().get("workers", [])]
    cpu0, t0 = _cpu(pids), time.perf_counter()
    await asyncio.gather(*(backend.execute(r, keep, keep) for r in timed))
    wall, cpu = time.perf_counter() - t0, _cpu(pids) - cpu0
    failed = [r for r in finals.values() if not r.ok]
    rewards = [r.reward for r in finals.values() if r.ok and r.reward is not None]
    return {
        "n": len(timed),
        "rate": len(timed) / wall,
        "cpu_ms": cpu / len(timed) * 1000,
        "failed": len(failed),
        "first_error": failed[0].error if failed else None,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
    }


async def measure_and_close(backend: Any, reqs: list[ExecutionRequest], concurrency: int) -> dict:
    try:
        return await measure(backend, reqs, concurrency)
    finally:
        await backend.aclose()  # the workers, or this loop's HTTP clients


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--workers", type=int, default=1, help="processes (osmosis run --workers)")
    args = parser.parse_args()
    ideal = args.concurrency / (2 * args.latency)
    variants: list[tuple[str, type, type | None]] = [("bare AsyncOpenAI loop", BareOpenAI, None)]
    for label, template in (
        ("Strands (osmosis-strands)", "multiply-local-strands"),
        ("OpenAI Agents (osmosis-openai-agents)", "multiply-local-openai"),
    ):
        classes = template_classes(template)
        if classes is not None:
            variants.append((label, *classes))
    print(
        f"agents_throughput: {args.rollouts} rollouts of 2 model calls each, concurrency {args.concurrency}, "
        f"latency {args.latency * 1000:.0f} ms per call, ideal {ideal:.0f} rollouts/s"
    )
    with StubPolicyProcess(latency=args.latency) as stub:
        policy = PolicyEndpoint(stub.url, "osmosis-stub")
        for label, workflow, grader in variants:
            reqs = requests(args.rollouts + args.concurrency, policy, label.split()[0].lower())
            backend = backend_for(workflow, grader, args.concurrency, args.workers)
            m = asyncio.run(measure_and_close(backend, reqs, args.concurrency))
            note = f", {m['failed']} failed (first: {m['first_error']})" if m["failed"] else ""
            reward = "-" if m["mean_reward"] is None else f"{m['mean_reward']:.2f}"
            print(
                f"  {label:38s}: {m['rate']:6.1f} rollouts/s, ratio {m['rate'] / ideal:.2f} (target >= 0.8), "
                f"CPU {m['cpu_ms']:5.1f} ms/rollout, mean reward {reward}{note}"
            )
    print(f"  peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
