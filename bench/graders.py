"""Per-grade CPU of osmosis-graders' `exact-match` and `math` on 10,000 samples, against LocalBackend's own cost.

What it measures, all in one process and one run:

1. ``exact-match`` on 10,000 GSM8K-style replies (``#### 1,234.``, ``$18``, wrong answers too):
   CPU per grade on the event loop (``time.process_time``).
2. ``math`` on 10,000 answers the fast path decides (integers, decimals, ``\\frac{a}{b}``,
   ``a/b``, identical LaTeX): CPU per grade on the loop; no CAS process is involved.
3. ``math`` on a mix where ``--cas-share`` (default 5 %) of the answers need math-verify
   (``\\frac{\\sqrt{2}}{2}`` vs ``\\frac{1}{\\sqrt{2}}``, sets, polynomials): CPU per grade on the
   loop (the fast path plus sending the job and reading the answer), CPU per comparison in the
   CAS worker processes (from ``/proc``), and the wall time at concurrency 64.
4. LocalBackend: 10,000 rollouts (a trivial agent) with a trivial grader, then with
   ``exact-match`` and with ``math`` (fast-path answers): CPU per rollout, so the grader's share is
   measured where it runs, next to the backend's own overhead.

It prints the ratio of grading CPU to the backend's per-rollout CPU, and what 1,000 rollouts/s
would cost: loop CPU for grading, and the CAS cores the mix needs.

5. The CAS pool against the same pool on pebble's ``ProcessPool.schedule(timeout=...)`` (issue 17;
   ``bench/_pebble_cas.py``, fork context), same run, same comparisons, alternating: the loop
   process's CPU per comparison (its threads included), the workers' CPU, the wall time, and how
   long a worker that stops answering (a C-level spin, seen from outside: SIGSTOP) holds its
   comparison. Skipped when pebble is not installed (``pip install pebble``) or with ``--no-pebble``.

    python bench/graders.py [--n 10000] [--cas-share 0.05] [--cas-workers 2] [--concurrency 64] [--no-pebble]

Why `math` is built this way (see osmosis_graders.math_equiv and osmosis_graders.cas_pool): the
CAS (sympy) costs tens of milliseconds per comparison and can spin for ever, so it never runs on
the loop. A fast path decides plain numbers and identical answers on the loop in microseconds
(most GSM8K and MATH answers); only the rest goes to a small pool of worker processes, each with a
hard per-expression limit (a killed and replaced process; a thread cannot be killed, and
math-verify's own signal timeout works only in the main thread and would interrupt the loop).
Target: the loop's grading CPU stays a fraction of the backend's own per-rollout CPU, and the CAS
work of the mix fits in the worker processes at 1,000 rollouts/s.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import signal
import statistics
import time
from typing import Any

from osmosis_core import (
    AgentWorkflow,
    AgentWorkflowConfig,
    ConcurrencyConfig,
    ExecutionRequest,
    ExecutionResult,
    Grader,
    GraderConfig,
    GraderContext,
    LocalBackend,
    PolicyEndpoint,
    RolloutSample,
)
from osmosis_graders import ExactMatchGrader, MathConfig, MathGrader
from osmosis_graders.cas_pool import CasPool, cas_pool

POLICY = PolicyEndpoint("http://127.0.0.1:9/v1", "m")


def cas_pair(rng: random.Random) -> tuple[str, str]:
    """An answer and a label only math-verify can compare (equivalent or not), with fresh numbers each time."""
    a, b, k = rng.randint(1, 30), rng.randint(1, 30), rng.randint(2, 60)
    return rng.choice(
        [
            (rf"\frac{{\sqrt{{{k}}}}}{{{k}}}", rf"\frac{{1}}{{\sqrt{{{k}}}}}"),
            (rf"\{{{a}, {b}\}}", rf"\{{{b},{a}\}}"),
            (rf"(x+{a})^2", f"x^2+{2 * a}x+{a * a}"),
            (rf"x = {a}", f"{a}"),
            (rf"{a}\pi", rf"\frac{{{2 * a}\pi}}{{2}}"),
            (rf"[{a}, {a + b})", rf"[{a}, {b}+{a})"),
            (rf"{a}x", f"{a}y"),
            (rf"\sqrt{{{k * k}}}+x", rf"x+{k}"),
        ]
    )


def gsm8k_samples(n: int, rng: random.Random) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        value = rng.randint(-5000, 500_000)
        shown = rng.choice([f"{value:,}", f"{value}", f"{value:,}.", f"${value:,}", f"{value}.0"])
        answer = shown if rng.random() < 0.8 else str(value + rng.randint(1, 9))
        work = " ".join(f"step {i}: {rng.randint(1, 99)} * {rng.randint(1, 99)}" for i in range(rng.randint(2, 8)))
        out.append((f"Let me think. {work}.\n#### {answer}", str(value)))
    return out


def fast_math_samples(n: int, rng: random.Random) -> list[tuple[str, str]]:
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.55:
            value = rng.randint(-999, 99_999)
            reply, label = str(value), str(value if rng.random() < 0.8 else value + 1)
        elif kind < 0.75:
            a, b = rng.randint(1, 99), rng.randint(2, 99)
            reply, label = rf"\frac{{{a}}}{{{b}}}", rng.choice([f"{a}/{b}", rf"\dfrac{{{a}}}{{{b}}}"])
        elif kind < 0.9:
            value = rng.randint(1, 9999) / 100
            reply, label = f"{value}", f"{value:.2f}"
        else:
            expr = rng.choice([r"\sqrt{2}", r"2\pi", r"\{1, 2\}", r"x^{2}+1"])
            reply, label = expr, expr.replace(" ", "")
        out.append((f"We get the result.\nSo the answer is $\\boxed{{{reply}}}$.", label))
    return out


def mixed_math_samples(n: int, share: float, rng: random.Random) -> list[tuple[str, str]]:
    fast = fast_math_samples(n, rng)
    for i in rng.sample(range(n), int(n * share)):
        reply, label = cas_pair(rng)
        fast[i] = (f"Thus $\\boxed{{{reply}}}$.", label)
    return fast


def contexts(grader: Grader[Any], samples: list[tuple[str, str]]) -> list[GraderContext[Any]]:
    return [
        GraderContext(RolloutSample(messages=[{"role": "assistant", "content": reply}]), label, [], {}, grader.config)
        for reply, label in samples
    ]


async def grade_sequentially(grader: Grader[Any], samples: list[tuple[str, str]]) -> tuple[float, list[float | None]]:
    ctxs = contexts(grader, samples)
    gc.collect()
    started = time.process_time()
    rewards = [await grader.grade(ctx) for ctx in ctxs]
    return (time.process_time() - started) / len(samples) * 1e6, rewards


def pids_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds used so far by these processes (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except OSError:
            pass
    return total


def worker_cpu_seconds() -> float:
    """CPU seconds used so far by the live CAS worker processes (Linux /proc)."""
    return pids_cpu_seconds(cas_pool().pids())


async def grade_concurrently(grader: Grader[Any], samples: list[tuple[str, str]], concurrency: int) -> dict[str, float]:
    ctxs = contexts(grader, samples)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(ctx: GraderContext[Any]) -> float | None:
        async with semaphore:
            return await grader.grade(ctx)

    gc.collect()
    cpu, workers, wall = time.process_time(), worker_cpu_seconds(), time.perf_counter()
    rewards = await asyncio.gather(*(one(ctx) for ctx in ctxs))
    cas = sum(1 for ctx in ctxs if ctx.sample.metrics.get("math.path") == "cas")
    return {
        "loop_us": (time.process_time() - cpu) / len(samples) * 1e6,
        "worker_s": worker_cpu_seconds() - workers,
        "wall_s": time.perf_counter() - wall,
        "cas": cas,
        "right": sum(r == 1.0 for r in rewards),
    }


class Trivial(AgentWorkflow):
    async def run(self, ctx: Any) -> RolloutSample:
        return RolloutSample(messages=[*ctx.prompt, {"role": "assistant", "content": ctx.metadata["reply"]}])


class TrivialGrader(Grader):
    async def grade(self, ctx: GraderContext[Any]) -> float:
        return 1.0 if ctx.sample.last_text().endswith(str(ctx.label)) else 0.0


async def backend_cpu(
    grader: type[Grader[Any]], config: GraderConfig | None, samples: list[tuple[str, str]], concurrency: int
) -> float:
    """CPU microseconds per rollout through LocalBackend (grader timeouts on, as a run sets them)."""
    requests = [
        ExecutionRequest(
            f"r{i}",
            [{"role": "user", "content": f"q{i}"}],
            POLICY,
            label=label,
            metadata={"reply": reply},
            agent_timeout_sec=600.0,
            grader_timeout_sec=120.0,
        )
        for i, (reply, label) in enumerate(samples)
    ]
    backend = LocalBackend(
        Trivial, AgentWorkflowConfig(concurrency=ConcurrencyConfig(max_concurrent=concurrency)), grader, config
    )
    done: list[ExecutionResult] = []

    async def on_workflow(result: ExecutionResult) -> None:
        pass

    async def on_grader(result: ExecutionResult) -> None:
        done.append(result)

    gc.collect()
    started = time.process_time()
    await asyncio.gather(*(backend.execute(r, on_workflow, on_grader) for r in requests))
    elapsed = time.process_time() - started
    assert len(done) == len(samples), [r.error for r in done if not r.ok][:3]
    assert all(r.ok for r in done), [r.error for r in done if not r.ok][:3]
    return elapsed / len(samples) * 1e6


async def pool_round(
    pool: Any, pairs: list[tuple[str, str]], concurrency: int, workers: int
) -> tuple[float, float, float]:
    """One pass of ``pairs`` through ``pool``: loop-process CPU ms, worker CPU ms per comparison, wall s."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(gold: str, answer: str) -> str:
        async with semaphore:
            return (await pool.check(gold, answer, limit=30.0, workers=workers)).outcome

    gc.collect()
    cpu, children, wall = time.process_time(), pids_cpu_seconds(pool.pids()), time.perf_counter()
    outcomes = await asyncio.gather(*(one(gold, answer) for gold, answer in pairs))
    assert set(outcomes) <= {"equal", "different"}, [o for o in outcomes if o not in ("equal", "different")]
    return (
        (time.process_time() - cpu) / len(pairs) * 1e3,
        (pids_cpu_seconds(pool.pids()) - children) / len(pairs) * 1e3,
        time.perf_counter() - wall,
    )


async def stopped_worker(pool: Any, limit: float = 1.0) -> float:
    """Seconds until a comparison whose (only) worker stops answering is given up (``limit`` + grace is the aim)."""
    await pool.warm_up(1)
    started = time.perf_counter()
    check = asyncio.ensure_future(pool.check(r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", limit=limit, workers=1))
    await asyncio.sleep(0.05)
    for pid in pool.pids():
        os.kill(pid, signal.SIGSTOP)
    result = await check
    assert result.outcome in ("timeout", "crashed"), result
    return time.perf_counter() - started


async def pool_side_by_side(n: int, concurrency: int, workers: int, repeat: int = 4) -> None:
    """The CAS pool and its pebble counterpart, same run, same comparisons, alternating (section 5)."""
    try:
        from _pebble_cas import PebbleCasPool
    except ImportError:
        print("  CAS pool vs pebble: skipped (pebble is not installed)")
        return
    rng = random.Random(3)
    pairs = [cas_pair(rng) for _ in range(n)]
    pools: dict[str, Any] = {"cas_pool (ours)": CasPool(), "pebble, fork": PebbleCasPool("fork")}
    rounds: dict[str, list[tuple[float, float, float]]] = {name: [] for name in pools}
    try:
        for pool in pools.values():
            await pool.warm_up(workers)
            await pool_round(pool, pairs[:40], concurrency, workers)
        for i in range(repeat):
            for name in list(pools) if i % 2 == 0 else reversed(list(pools)):
                rounds[name].append(await pool_round(pools[name], pairs, concurrency, workers))
        print(
            f"  CAS pool vs pebble: {n} comparisons x {repeat}, {workers} workers, concurrency {concurrency}, medians:"
        )
        base = statistics.median(r[0] for r in rounds["cas_pool (ours)"])
        for name, rows in rounds.items():
            loop_ms = statistics.median(r[0] for r in rows)
            print(
                f"    {name:16s}: {loop_ms:5.2f} ms loop-process CPU per comparison ({loop_ms / base:4.2f}x), "
                f"{statistics.median(r[1] for r in rows):5.1f} ms worker CPU, "
                f"wall {statistics.median(r[2] for r in rows):5.1f} s"
            )
        for name, pool in pools.items():
            pool.shutdown()
            pool = pools[name] = type(pool)()
            held = await stopped_worker(pool)
            print(f"    {name:16s}: a stopped worker (1 s limit) gives up its comparison after {held:4.2f} s")
    finally:
        for pool in pools.values():
            pool.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--cas-share", type=float, default=0.05)
    parser.add_argument("--cas-workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--no-pebble", action="store_true", help="skip section 5 (the CAS pool vs pebble)")
    args = parser.parse_args()
    rng = random.Random(12)
    gsm8k = gsm8k_samples(args.n, rng)
    fast = fast_math_samples(args.n, rng)
    mixed = mixed_math_samples(args.n, args.cas_share, rng)
    math_grader = MathGrader(MathConfig(cas_workers=args.cas_workers))
    print(f"graders: {args.n} samples each, {os.cpu_count()} CPUs, CAS workers {args.cas_workers}")

    async def run() -> None:
        await grade_sequentially(ExactMatchGrader(), gsm8k[:500])  # warm-up (regex caches, imports)
        await grade_sequentially(math_grader, fast[:500])
        exact_us, exact_rewards = await grade_sequentially(ExactMatchGrader(), gsm8k)
        fast_us, fast_rewards = await grade_sequentially(math_grader, fast)
        print(f"  exact-match          : {exact_us:7.1f} us CPU per grade ({sum(r == 1 for r in exact_rewards)} right)")
        print(f"  math, fast path      : {fast_us:7.1f} us CPU per grade ({sum(r == 1 for r in fast_rewards)} right)")

        start = time.perf_counter()
        await cas_pool().warm_up(args.cas_workers)
        print(f"  CAS workers ready in : {time.perf_counter() - start:7.2f} s (sympy import, once per process)")
        fast_concurrent = await grade_concurrently(math_grader, fast, args.concurrency)
        mix = await grade_concurrently(math_grader, mixed, args.concurrency)
        per_cas_ms = mix["worker_s"] / max(1, mix["cas"]) * 1e3
        dispatch_us = (mix["loop_us"] - fast_concurrent["loop_us"]) * args.n / max(1, mix["cas"])
        print(
            f"  math, {args.cas_share:.0%} to the CAS  : {mix['loop_us']:7.1f} us loop CPU per grade; "
            f"{int(mix['cas'])} CAS comparisons at {per_cas_ms:.1f} ms worker CPU each; "
            f"wall {mix['wall_s']:.2f} s at concurrency {args.concurrency} ({args.n / mix['wall_s']:.0f} grades/s)"
        )
        print(
            f"    (the same loop, no CAS: {fast_concurrent['loop_us']:.1f} us per grade; "
            f"so one CAS comparison costs the loop {dispatch_us:.0f} us to send and read back)"
        )

        base = await backend_cpu(TrivialGrader, None, gsm8k, args.concurrency)
        with_exact = await backend_cpu(ExactMatchGrader, None, gsm8k, args.concurrency)
        with_math = await backend_cpu(MathGrader, MathConfig(), fast, args.concurrency)
        print(f"  LocalBackend, trivial grader : {base:7.1f} us CPU per rollout (the backend's own cost)")
        print(f"  LocalBackend + exact-match   : {with_exact:7.1f} us (+{with_exact - base:.1f})")
        print(f"  LocalBackend + math (fast)   : {with_math:7.1f} us (+{with_math - base:.1f})")
        print("  ratios, grading CPU on the loop / the backend's per-rollout CPU:")
        print(f"    exact-match       : {exact_us / base:5.2f}x")
        print(f"    math, fast path   : {fast_us / base:5.2f}x")
        print(f"    math, {args.cas_share:.0%} CAS mix : {mix['loop_us'] / base:5.2f}x on the loop")
        rate = 1000
        cores = rate * args.cas_share * per_cas_ms / 1e3
        print(f"  at {rate} rollouts/s:")
        print(f"    backend            : {rate * base / 1e6:5.2f} CPU-s per s on the loop")
        print(f"    exact-match        : {rate * exact_us / 1e6:5.2f} CPU-s per s on the loop")
        loop_math = rate * mix["loop_us"] / 1e6
        print(f"    math ({args.cas_share:.0%} CAS mix)  : {loop_math:5.2f} CPU-s per s on the loop,")
        print(f"                         {cores:5.2f} CPU-s per s in CAS workers (that many worker processes busy)")
        if not args.no_pebble:
            cas_pool().shutdown()
            await pool_side_by_side(min(args.n, 300), args.concurrency, args.cas_workers)

    try:
        asyncio.run(run())
    finally:
        cas_pool().shutdown()


if __name__ == "__main__":
    main()
