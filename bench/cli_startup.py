"""Start-up time of the CLI: `osmosis --help` and `osmosis plugins`, median of several runs.

    python bench/cli_startup.py [--runs 7]

Target: each under 0.3 s on these machines (the reference SDK's --help took 0.7 s). Printed with
the time of a bare `python -c pass` in the same run, the floor no Python CLI can beat.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def seconds(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    exe = str(Path(sys.executable).parent / "osmosis")
    floor = seconds([sys.executable, "-c", "pass"], args.runs)
    print(f"cli_startup: median of {args.runs} runs")
    print(f"  python -c pass    : {floor:.3f} s (floor)")
    for argv in (["--help"], ["plugins"], ["template", "list"]):
        took = seconds([exe, *argv], args.runs)
        print(f"  osmosis {' '.join(argv):14s}: {took:.3f} s ({took / floor:.1f}x the floor; target < 0.3 s)")


if __name__ == "__main__":
    main()
