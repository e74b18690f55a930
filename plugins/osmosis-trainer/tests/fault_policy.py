"""The scripted policy of ``osmosis_core.testing``, with faults injected into given rollouts' calls.

Run by the Python that runs ``osmosis serve`` (the trainer side has no osmosis-core)::

    python fault_policy.py --flavor vllm --fault '{"rollout_id": "r-1", "times": 9, "kind": "status", "status": 500}'

Each ``--fault`` is a ``Fault``'s fields plus the rollout it hits (the gateway sends the id as
``X-Osmosis-Rollout-Id``) and how many of its calls (``times``, default 1). Prints ``listening on
URL`` and serves until its standard input ends (the test closes it, or died).
"""

from __future__ import annotations

import argparse
import json
import sys

from osmosis_core.testing import Fault, ScriptedPolicyServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flavor", default="vllm")
    parser.add_argument("--fault", action="append", default=[], help="a JSON object: rollout_id, times, Fault's fields")
    args = parser.parse_args()
    server = ScriptedPolicyServer(flavor=args.flavor).start()
    for spec in map(json.loads, args.fault):
        rollout_id = spec.pop("rollout_id")
        times = spec.pop("times", 1)
        server.inject(Fault(**spec), times=times, rollout_id=rollout_id)
    print(f"listening on {server.url}", flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
