"""The ray backend against the ideal and against ``local``: throughput, and CPU per rollout.

Part 1. One-call rollouts (``bench/one_call``: one policy call, then the grader) against the
scripted server in its own process with 1 s latency, 200 in flight. The ideal is Little's law:
200 rollouts/s. Side by side, each after one untimed wave (imports, connections, actor start):

* ``local``: ``LocalBackend`` in this process (its CPU is everything a rollout costs);
* ``ray``: ``RayBackend`` with 2 actors on a local Ray cluster it starts (and stops), requests
  chunked per actor call (the default ``chunk_size``); and ``ray, chunk_size=1``: one actor call
  per rollout. Driver CPU is this process's (Ray's driver threads included); actor CPU is read
  from /proc.

Part 2. The Strands template (``multiply-local-strands``, two model calls and a tool per rollout)
through the real CLI: ``osmosis run --backend ray`` (2 actors) against ``--backend local
--workers 2``, same rows, ``--stub-latency`` and concurrency; rates from each run's
``summary.json`` (the rollouts' wall time, without start-up).

    python bench/ray_efficiency.py [--rollouts 2000] [--in-flight 200] [--latency 1.0]
                                   [--strands-rows 600] [--strands-concurrency 100] [--strands-latency 0.2]
                                   [--strands-repeat 2]

Targets: ``ray`` at least 0.9 of ideal in part 1; in part 2, ``ray`` not slower than ``local --workers 2``.
Needs osmosis-ray (and osmosis-strands for part 2); Ray's files go to a short temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from osmosis_core import (
    ConcurrencyConfig,
    ExecutionRequest,
    ExecutionResult,
    LocalBackend,
    PolicyEndpoint,
)
from osmosis_core.testing import StubPolicyProcess

ROOT = Path(__file__).resolve().parent.parent
ONE_CALL = ROOT / "bench" / "one_call"

TMP = Path("/tmp")
"""This run's short temporary folder (Ray's files, the Strands workspace), made by :func:`main`."""


def load_one_call() -> tuple[type, type]:
    """bench/one_call/main.py imported as ``main`` with its folder on sys.path, as ``osmosis run`` does."""
    sys.path.insert(0, str(ONE_CALL))
    spec = importlib.util.spec_from_file_location("main", ONE_CALL / "main.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["main"] = module
    spec.loader.exec_module(module)
    return module.OneCall, module.FinalAnswer


def requests(n: int, policy: PolicyEndpoint, tag: str) -> list[ExecutionRequest]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        prompt = [{"role": "user", "content": f"val1 = {a}\nval2 = {b}"}]
        out.append(
            ExecutionRequest(
                f"{tag}-{i}", prompt, policy, label=str(a * b), agent_timeout_sec=120, grader_timeout_sec=30
            )
        )
    return out


def proc_cpu(pids: list[int]) -> float:
    """CPU seconds of other processes (the actors), from /proc, while they run."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def drive(backend: Any, reqs: list[ExecutionRequest], in_flight: int) -> dict[str, Any]:
    """Run ``reqs`` as ``osmosis run`` does (a fixed number of workers pulling the next request)."""
    finals: dict[str, ExecutionResult] = {}

    async def keep(result: ExecutionResult) -> None:
        finals[result.rollout_id] = result

    async def run(batch: list[ExecutionRequest]) -> None:
        pending = iter(batch)

        async def worker() -> None:
            for request in pending:
                await backend.execute(request, keep, keep)

        await asyncio.gather(*(worker() for _ in range(min(in_flight, len(batch)))))

    warm, timed = reqs[:in_flight], reqs[in_flight:]
    await run(warm)
    finals.clear()
    pids = [a["pid"] for a in backend.health().get("actors", [])]
    cpu0, actors0, t0 = time.process_time(), proc_cpu(pids), time.perf_counter()
    await run(timed)
    wall = time.perf_counter() - t0
    cpu, actors = time.process_time() - cpu0, proc_cpu(pids) - actors0
    failed = [r for r in finals.values() if not r.ok]
    health = backend.health()
    return {
        "n": len(timed),
        "rate": len(timed) / wall,
        "driver_ms": cpu / len(timed) * 1000,
        "actor_ms": actors / len(timed) * 1000 if pids else None,
        "failed": len(failed),
        "first_error": failed[0].error if failed else None,
        "calls": health.get("calls"),
        "rewarded": sum(1 for r in finals.values() if r.reward == 1.0),
    }


def part1(args: argparse.Namespace) -> None:
    from osmosis_ray import RayBackend, RayBackendConfig

    workflow, grader = load_one_call()
    ideal = args.in_flight / args.latency
    print(
        f"ray_efficiency part 1: {args.rollouts} one-call rollouts, {args.in_flight} in flight, scripted server "
        f"latency {args.latency:g} s: ideal {ideal:.0f} rollouts/s"
    )
    with StubPolicyProcess(latency=args.latency) as stub:
        policy = PolicyEndpoint(stub.url, "osmosis-stub")
        config = attrs.evolve(workflow.config_type(), concurrency=ConcurrencyConfig(max_concurrent=args.in_flight))
        variants: list[tuple[str, Any]] = [
            ("local", lambda: LocalBackend(workflow, config, grader)),
            ("ray", lambda: RayBackend(workflow, config, grader, rollout_dir=ONE_CALL, config=ray_config())),
            (
                "ray, chunk_size=1",
                lambda: RayBackend(workflow, config, grader, rollout_dir=ONE_CALL, config=ray_config(chunk_size=1)),
            ),
        ]

        def ray_config(**more: Any) -> Any:
            if args.window_ms is not None:
                more.setdefault("batch_window_ms", args.window_ms)
            return RayBackendConfig(actors=args.actors, log_to_driver=False, **more)

        for label, build in variants:
            started = time.perf_counter()
            backend = build()
            ready = time.perf_counter() - started

            async def measure(backend: Any = backend, label: str = label) -> dict[str, Any]:
                try:
                    reqs = requests(args.rollouts + args.in_flight, policy, label.split(",")[0])
                    return await drive(backend, reqs, args.in_flight)
                finally:
                    await backend.aclose()

            m = asyncio.run(measure())
            note = f", {m['failed']} failed (first: {m['first_error']})" if m["failed"] else ""
            actor = f", actors {m['actor_ms']:.2f} ms" if m["actor_ms"] is not None else ""
            calls = f", {m['calls']} actor calls" if m["calls"] is not None else ""
            start = f", started in {ready:.1f} s" if label.startswith("ray") else ""
            print(
                f"  {label:18s}: {m['rate']:6.1f} rollouts/s, achieved/ideal {m['rate'] / ideal:.3f}, "
                f"driver CPU {m['driver_ms']:.2f} ms/rollout{actor}{calls}{start}{note}",
                flush=True,
            )


def part2(args: argparse.Namespace) -> None:
    from osmosis_core.plugin import get_registry

    try:
        get_registry().template("multiply-local-strands")
    except Exception:
        print("ray_efficiency part 2: skipped (osmosis-strands is not installed)")
        return
    exe = str(Path(sys.executable).parent / "osmosis")
    workspace = TMP / "strands"
    subprocess.run(
        [exe, "template", "apply", "multiply-local-strands", str(workspace)], check=True, capture_output=True
    )
    rng = random.Random(1)
    rows = workspace / "rows.jsonl"
    with rows.open("w") as handle:
        for _ in range(args.strands_rows):
            a, b = rng.randint(2, 999), rng.randint(2, 999)
            handle.write(json.dumps({"user_prompt": f"val1 = {a}\nval2 = {b}", "ground_truth": str(a * b)}) + "\n")
    config = workspace / "configs" / "eval" / "multiply-local-strands.toml"
    with config.open("a") as handle:
        window = "" if args.window_ms is None else f"batch_window_ms = {args.window_ms}\n"
        handle.write(
            f"\n[backend.ray]\nactors = 2\nlog_to_driver = false\n{window}\n"
            f'[backend.ray.local_cluster]\ntemp_dir = "{TMP}/s"\n'
        )
    ideal = args.strands_concurrency / (2 * args.strands_latency)
    print(
        f"ray_efficiency part 2: the Strands template through osmosis run, {args.strands_rows} rows, concurrency "
        f"{args.strands_concurrency}, latency {args.strands_latency * 1000:.0f} ms per call (ideal {ideal:.0f}/s)"
    )
    rates: dict[str, list[float]] = {"local --workers 2": [], "ray": []}
    variants = [("local --workers 2", ["--backend", "local", "--workers", "2"]), ("ray", ["--backend", "ray"])]
    for round_ in range(args.strands_repeat):
        for label, flags in variants if round_ % 2 == 0 else variants[::-1]:
            rates[label].append(
                strands_run(exe, config, rows, workspace / "runs" / f"{label.split()[0]}-{round_}", flags, args)
            )
            print(
                f"  {label:18s}: {rates[label][-1]:6.1f} rollouts/s, ratio to ideal {rates[label][-1] / ideal:.3f}",
                flush=True,
            )
    best = {label: max(values) for label, values in rates.items()}
    ratio = best["ray"] / best["local --workers 2"]
    print(f"  ray / local --workers 2 (best of {args.strands_repeat} each): {ratio:.3f} (target >= 1.0)")


def strands_run(exe: str, config: Path, rows: Path, out: Path, flags: list[str], args: argparse.Namespace) -> float:
    """One ``osmosis run`` of the Strands template; its rollouts per second (summary.json's wall time)."""
    cmd = [
        exe, "run", str(config), "--stub-policy", "--stub-latency", str(args.strands_latency),
        "--concurrency", str(args.strands_concurrency), "--dataset", str(rows), "--output", str(out), *flags,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=config.parent, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(flags)}: osmosis run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == args.strands_rows, summary
    assert summary["failed"] == 0, summary
    return float(summary["finished"] / summary["wall_sec"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument(
        "--window-ms", type=float, default=None, help="[backend.ray] batch_window_ms (default: its own)"
    )
    parser.add_argument("--strands-rows", type=int, default=600)
    parser.add_argument("--strands-concurrency", type=int, default=100)
    parser.add_argument("--strands-latency", type=float, default=0.2)
    parser.add_argument("--strands-repeat", type=int, default=2, help="runs of each, alternating which goes first")
    parser.add_argument("--skip", choices=["1", "2"], help="skip one part")
    args = parser.parse_args()
    if importlib.util.find_spec("osmosis_ray") is None:
        print("ray_efficiency: skipped (osmosis-ray is not installed)")
        return
    global TMP
    TMP = Path(tempfile.mkdtemp(prefix="osr-bench-", dir="/tmp"))  # short: unix socket paths are limited
    os.environ.setdefault("RAY_TMPDIR", str(TMP))  # before Ray is imported (by part 1) or started (part 2)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.pop("RAY_ADDRESS", None)
    try:
        if args.skip != "1":
            part1(args)
        if args.skip != "2":
            part2(args)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
