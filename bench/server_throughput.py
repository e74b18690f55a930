"""`osmosis serve` throughput and memory, driven by the real RolloutClient over loopback HTTP.

Starts the real command (`osmosis serve CONFIG --port 0`) as a child process and drives it from
this process with `RolloutClient.run_many`, client and server on this machine:

1. trivial rollouts (no model call): N (default 2,000) at concurrency 64: rollouts/s and the
   server's CPU milliseconds per rollout (from /proc);
2. memory: M (default 20,000) more, then the server's RSS once their retention has expired,
   against its RSS after the first N (retention is set short for the bench);
3. one model call per rollout against the scripted policy server (a separate process) at 100 ms
   latency, concurrency 100: achieved rate over the ideal (concurrency / latency); then the same
   at 1 s, where the machine's CPU is not the bound, to show what the server itself adds.

    python bench/server_throughput.py [--rollouts 2000] [--more 20000] [--concurrency 64]
                                      [--latency 0.1] [--model-concurrency 100] [--log-level info]

Targets (2 shared cores): >= 800 rollouts/s in (1), RSS growth < 10% in (2), >= 0.9 of ideal in (3).
Printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from _serve import CONFIG, Served, ticks  # (bench/ is the script's folder: on sys.path)

ROOT = Path(__file__).resolve().parent.parent
TRIVIAL = '''
from osmosis_core import AgentWorkflow, Grader


class Trivial(AgentWorkflow):
    """No model call: the prompt and a fixed answer."""

    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": "#### 42"}]


class Exact(Grader):
    async def grade(self, ctx):
        return 1.0 if ctx.sample.last_text().endswith(str(ctx.label)) else 0.0
'''


def rss_mb(pid: int) -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    assert match
    return int(match.group(1)) / 1024


async def drive(url: str, token: str, n: int, concurrency: int, policy_url: str, tag: str) -> float:
    from osmosis_core.http import http_scope
    from osmosis_trainer import RolloutClient, RolloutRequest

    client = RolloutClient(url, token=token)
    requests = (
        RolloutRequest(
            rollout_id=f"{tag}-{i}",
            initial_messages=[{"role": "user", "content": f"What is {i % 97} times 3?"}],
            chat_completions_url=policy_url,
            label=str((i % 97) * 3) if tag.startswith("stub") else "42",  # the calculator's answer, or Trivial's
        )
        for i in range(n)
    )
    started = time.perf_counter()
    failed = 0
    async with http_scope():
        async for result in client.run_many(requests, concurrency=concurrency):
            if not result.ok or result.reward != 1.0:
                failed += 1
                if failed <= 3:
                    print(f"  unexpected result: {result.status} {result.reward} {result.error}")
    wall = time.perf_counter() - started
    if failed:
        print(f"  {failed} of {n} rollouts did not succeed with reward 1.0")
    return wall


def run(coro) -> float:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--more", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--model-concurrency", type=int, default=100)
    parser.add_argument("--model-rollouts", type=int, default=2000)
    parser.add_argument("--slow-latency", type=float, default=1.0)
    parser.add_argument("--slow-rollouts", type=int, default=500)
    parser.add_argument(
        "--retention",
        type=float,
        default=1.0,
        help="the server's retention_sec here (about as many results retained at the peak as the first batch makes)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="osmosis-bench-serve-"))
    token = secrets.token_urlsafe(24)
    try:
        rollout = tmp / "trivial"
        rollout.mkdir()
        (rollout / "main.py").write_text(TRIVIAL)
        config = tmp / "trivial.toml"
        config.write_text(CONFIG.format(rollout=rollout, concurrency=args.concurrency))
        print(
            f"server_throughput: osmosis serve, client RolloutClient.run_many on this machine "
            f"({os.cpu_count()} cores), log level {args.log_level}"
        )
        served = Served(
            config, tmp / "run-trivial", token, "--retention", str(args.retention), "--log-level", args.log_level
        )
        try:
            dummy = "http://127.0.0.1:9/v1"  # never called: the trivial workflow makes no model call
            cpu0 = ticks(served.pid)
            wall = run(drive(served.url, token, args.rollouts, args.concurrency, dummy, "warm"))
            cpu = ticks(served.pid) - cpu0
            print(
                f"  trivial, {args.rollouts} rollouts at concurrency {args.concurrency}: "
                f"{args.rollouts / wall:,.0f} rollouts/s, server CPU {cpu / args.rollouts * 1000:.2f} ms per rollout "
                f"(target >= 800/s; the reference SDK did ~120/s here)"
            )
            time.sleep(args.retention + 1.5)
            rss_first = rss_mb(served.pid)
            cpu0 = ticks(served.pid)
            wall = run(drive(served.url, token, args.more, args.concurrency, dummy, "more"))
            cpu = ticks(served.pid) - cpu0
            print(
                f"  trivial, {args.more} more: {args.more / wall:,.0f} rollouts/s, "
                f"server CPU {cpu / args.more * 1000:.2f} ms per rollout"
            )
            time.sleep(args.retention + 1.5)
            rss_after = rss_mb(served.pid)
            print(
                f"  server RSS after retention expired: {rss_first:.1f} MB after the first {args.rollouts}, "
                f"{rss_after:.1f} MB after {args.more} more: {(rss_after / rss_first - 1) * 100:+.1f}% (target < 10%)"
            )
        finally:
            served.stop()

        from osmosis_core.testing import StubPolicyProcess

        config = tmp / "one_call.toml"
        config.write_text(CONFIG.format(rollout=ROOT / "bench" / "one_call", concurrency=args.model_concurrency))
        served = Served(config, tmp / "run-one-call", token, "--log-level", args.log_level)
        try:
            # at 100 ms the machine's 2 cores bound the rate (client, server and stand-in all on them);
            # at the slow latency they do not: that line shows what the server adds to a rollout
            for latency, n, note in (
                (args.latency, args.model_rollouts, "target >= 0.9"),
                (args.slow_latency, args.slow_rollouts, "not CPU-bound"),
            ):
                with StubPolicyProcess(latency=latency) as stub:
                    run(drive(served.url, token, 100, args.model_concurrency, stub.url, f"stub-warm-{latency}"))
                    wall = run(drive(served.url, token, n, args.model_concurrency, stub.url, f"stub-{latency}"))
                ideal = args.model_concurrency / latency
                rate = n / wall
                print(
                    f"  one model call at {latency * 1000:.0f} ms, {n} rollouts at concurrency "
                    f"{args.model_concurrency}: {rate:,.0f} rollouts/s = {rate / ideal:.2f} of ideal "
                    f"({ideal:,.0f}/s; {note})"
                )
        finally:
            served.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
