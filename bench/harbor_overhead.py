"""What an isolated Harbor trial adds per rollout: the same rows through ``local`` and ``harbor``.

The multiply-plain example (a tool-calling workflow: two policy calls and a tool, then the grader)
runs over the same 32 rows at concurrency 8 against the scripted calculator server in its own
process (``osmosis_core.testing.StubPolicyProcess``), once on the in-process ``local`` backend and
once on the ``harbor`` backend (one Harbor trial per rollout in the bubblewrap sandbox: the
workflow runs in the trial, the grader is the trial's verifier). Both go through the run engine
of ``osmosis run`` and write their results like it.

Prints, per backend, wall time, mean latency and rollouts (trials) per second, then the added
seconds per rollout: (harbor wall - local wall) / rows, and the added mean latency. ``harbor`` grades
inside each trial (the default); ``harbor, grade_on_host`` grades in-process as the trial's verifier.

    python bench/harbor_overhead.py [--rows 32] [--concurrency 8] [--repeat 1]

Target: at most 0.5 s added per rollout. (Harbor's own podman environment took 41-55 s per trial
on this 2-core machine; the bubblewrap sketch of the research took about 0.35 s.)
Needs osmosis-harbor installed and bubblewrap (``apt-get install -y bubblewrap``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import anyio

from osmosis_core._engine.config import config_from_dict
from osmosis_core._engine.runner import execute_run, prepare_run
from osmosis_core.records import PolicyEndpoint
from osmosis_core.templates import MULTIPLY_DATASET, examples_root
from osmosis_core.testing import StubPolicyProcess


def dataset(rows: int, folder: Path) -> Path:
    source = MULTIPLY_DATASET
    lines = [line for line in source.read_text().splitlines() if line.strip()]
    path = folder / "rows.jsonl"
    path.write_text("".join(lines[i % len(lines)] + "\n" for i in range(rows)))
    return path


VARIANTS = {
    "local": ("local", {}),
    "harbor": ("harbor", {}),
    "harbor, grade_on_host": ("harbor", {"grade_on_host": True}),
}


def run(variant: str, data: Path, out: Path, concurrency: int, policy: PolicyEndpoint) -> dict:
    backend, table = VARIANTS[variant]
    config = config_from_dict(
        {
            "rollout": {"path": str(examples_root() / "rollouts" / "multiply-plain")},
            "dataset": {"path": str(data)},
            "run": {"backend": backend, "concurrency": concurrency, "output": str(out)},
            "backend": {backend: table} if table else {},
        },
        root=out.parent,
    )
    plan = prepare_run(config, policy_override=policy)
    started = time.perf_counter()
    outcome = anyio.run(execute_run, plan, None)
    wall = time.perf_counter() - started
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    failed = [x for x in lines if x["status"] != "success"]
    if failed or outcome.summary.finished != len(lines):
        raise SystemExit(f"{variant}: {len(failed)} rollouts failed, e.g. {failed[0]['error'] if failed else None}")
    latencies = [sum(v for k, v in x["timings"].items() if k in ("queued", "workflow", "grader")) for x in lines]
    trial = [x["timings"].get("trial") for x in lines if "trial" in x["timings"]]
    return {
        "wall": wall,
        "latency": statistics.mean(latencies),
        "trial": statistics.mean(trial) if trial else None,
        "rate": len(lines) / wall,
        "reward": statistics.mean(x["reward"] for x in lines),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if importlib.util.find_spec("osmosis_harbor") is None or shutil.which("bwrap") is None:
        print("harbor_overhead: skipped (needs osmosis-harbor installed and bubblewrap: apt-get install -y bubblewrap)")
        return
    with tempfile.TemporaryDirectory(prefix="harbor-bench-") as tmp, StubPolicyProcess() as stub:
        folder = Path(tmp)
        data = dataset(args.rows, folder)
        policy = PolicyEndpoint(stub.url, "osmosis-stub")
        results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
        for i in range(args.repeat):
            for n, name in enumerate(VARIANTS):
                results[name].append(run(name, data, folder / f"{n}-{i}", args.concurrency, policy))
    best = {name: min(runs, key=lambda r: r["wall"]) for name, runs in results.items()}
    setup = f"concurrency {args.concurrency}, scripted policy server, best of {args.repeat}"
    print(f"{args.rows} rows (multiply-plain), {setup}")
    for name, r in best.items():
        extra = f", mean trial {r['trial']:.3f} s" if r["trial"] else ""
        print(
            f"  {name:22s}  wall {r['wall']:6.2f} s   mean latency {r['latency']:.3f} s   "
            f"{r['rate']:6.2f} rollouts/s   mean reward {r['reward']:.2f}{extra}"
        )
    for name in ("harbor", "harbor, grade_on_host"):
        added = (best[name]["wall"] - best["local"]["wall"]) / args.rows
        latency = best[name]["latency"] - best["local"]["latency"]
        print(
            f"{name}: added per rollout (wall) {added:.3f} s (target <= 0.5 s); added mean latency {latency:.3f} s; "
            f"{best[name]['rate']:.2f} trials/s"
        )


if __name__ == "__main__":
    main()
