"""A node of the session's two-node cluster removed mid-run: nothing lost, nothing reported twice.

It runs last among the cluster tests (file order) and puts a fresh second node back afterwards.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
from ray_helpers import FAULTS, backend, load, request, run_all


def test_a_node_removed_mid_run_loses_nothing_and_duplicates_nothing(cluster, policy, tmp_path):
    starts = tmp_path / "starts"
    rollout = load(FAULTS)
    b = backend(
        rollout,
        max_concurrent=8,
        retry_backoff_sec=0.1,
        runtime_env={"env_vars": {"OSMOSIS_RAY_TEST_STARTS": str(starts)}},
    )
    lost_node = cluster.worker.node_id
    [lost_actor] = [a for a in b._actors if a.node_id == lost_node]
    reqs = [request(f"n{i}", policy.url, i + 2, 17, do="sleep:1.0") for i in range(32)]

    async def remove(backend_: Any) -> None:
        await anyio.sleep(1.4)  # the second wave is running on both nodes
        await anyio.to_thread.run_sync(cluster.cluster.remove_node, cluster.worker)

    try:
        outcomes = run_all(b, reqs, close=False, during=remove)
        health = b.health()
        anyio.run(b.aclose)
    finally:
        cluster.replace_worker()
    failed = {rid: o.results for rid, o in outcomes.items() if not (o.results and o.final.ok and o.final.reward == 1.0)}
    assert not failed, failed
    assert all(len(o.results) == 2 for o in outcomes.values())  # one workflow and one grader result each
    started = Counter(p.name.rsplit(".", 1)[0] for p in starts.iterdir())
    rerun = [rid for rid, n in started.items() if n > 1]
    assert rerun, started  # some rollouts were on the lost node when it went: they ran again elsewhere ...
    survivors = {o.final.sample.metrics["node"] for rid, o in outcomes.items() if rid in rerun}
    assert survivors == {n for n in survivors if n != lost_node}, survivors
    assert survivors, survivors  # ... on the other node
    report = next(a for a in health["actors"] if a["node_id"] == lost_node)
    assert report["deaths"] >= 1, report
    assert report["state"] != "healthy", report
    assert health["retried"] >= len(rerun), health
    assert health["status"] == "degraded", health
    assert lost_actor.deaths >= 1
