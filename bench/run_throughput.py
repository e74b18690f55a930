"""`osmosis run` throughput against the scripted server: achieved rollouts/s over the ideal.

Runs the real CLI (`osmosis run --stub-policy --stub-latency L --concurrency C`) over N generated
rows: a one-call rollout (ideal = C / L) and the multiply-plain example, whose rollouts make two
calls (ideal = C / (2 L)); then the one-call rollout at a thousand in flight against a 1 s latency
(ideal 1,000 rollouts/s), where a client that falls apart under concurrency shows. The rate is
taken from the run's own summary.json (wall time of the rollouts, without interpreter start-up).

    python bench/run_throughput.py [--rows 1000] [--concurrency 100] [--latency 0.1] [--wide-rows 6000]

Target: at least 0.9 of ideal at concurrency 100; the wide run must not fall apart.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dataset(path: Path, rows: int) -> None:
    rng = random.Random(1)
    with path.open("w") as handle:
        for _ in range(rows):
            a, b = rng.randint(2, 999), rng.randint(2, 999)
            handle.write(json.dumps({"user_prompt": f"val1 = {a}\nval2 = {b}", "ground_truth": str(a * b)}) + "\n")


def run(rollout: Path, data: Path, out: Path, concurrency: int, latency: float) -> dict:
    exe = Path(sys.executable).parent / "osmosis"
    cmd = [
        str(exe),
        "run",
        "--rollout",
        str(rollout),
        "--dataset",
        str(data),
        "--stub-policy",
        "--stub-latency",
        str(latency),
        "--concurrency",
        str(concurrency),
        "--output",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"osmosis run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--wide-rows", type=int, default=6000, help="rows of the run at concurrency 1000, 1 s")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="osmosis-bench-"))
    try:
        data = tmp / "rows.jsonl"
        dataset(data, args.rows)
        print(
            f"run_throughput: osmosis run, {args.rows} rows, concurrency {args.concurrency}, "
            f"scripted server latency {args.latency * 1000:.0f} ms"
        )
        for name, rollout, calls in (
            ("one call per rollout", ROOT / "bench" / "one_call", 1),
            ("multiply-plain (2 calls)", ROOT / "rollouts" / "multiply-plain", 2),
        ):
            summary = run(rollout, data, tmp / name.split()[0], args.concurrency, args.latency)
            assert summary["finished"] == args.rows, summary
            assert summary["failed"] == 0, summary
            rate = summary["finished"] / summary["wall_sec"]
            ideal = args.concurrency / (calls * args.latency)
            print(
                f"  {name:26s}: {rate:7.1f} rollouts/s, ideal {ideal:6.1f}, ratio {rate / ideal:.3f} "
                f"(target >= 0.9); mean reward {summary['mean_reward']:.3f}"
            )
        if args.wide_rows:
            wide = tmp / "wide.jsonl"
            dataset(wide, args.wide_rows)
            summary = run(ROOT / "bench" / "one_call", wide, tmp / "wide", 1000, 1.0)
            assert summary["finished"] == args.wide_rows, summary
            assert summary["failed"] == 0, summary
            rate = summary["finished"] / summary["wall_sec"]
            print(
                f"  {'concurrency 1000, 1 s':26s}: {rate:7.1f} rollouts/s, ideal 1000.0, ratio {rate / 1000:.3f} "
                f"({args.wide_rows} rows)"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
