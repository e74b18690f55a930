"""The ray backend on a real two-node cluster: placement, dispatch, Ray's failures, cancellation, health.

Every test runs real actors on the session's cluster, the probe rollout (``rollouts/faults``)
loaded as ``osmosis run`` loads it and shipped to the actors as Ray's working dir, and the
scripted calculator server over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from ray_helpers import DRIVER_ONLY, DRIVER_ONLY_PATH, FAULTS, REPO, backend, load, request, run_all

from osmosis_core import ErrorCategory, ExecutionStage, ExecutionStatus
from osmosis_core.plugin import BackendUnavailable

pytestmark = pytest.mark.usefixtures("cluster")


@pytest.fixture
def faults() -> Any:
    """The probe rollout, imported afresh as ``main`` (as ``osmosis run`` does; other tests import other mains)."""
    return load(FAULTS)


def _ok(outcomes: dict[str, Any]) -> list[str]:
    return [rid for rid, o in outcomes.items() if o.results and o.final.ok and o.final.reward == 1.0]


def _stages(outcome: Any) -> list[tuple[str, str]]:
    return [(r.stage.value, r.status.value) for r in outcome.results]


def test_rollouts_run_on_actors_spread_over_both_nodes_and_report_in_completion_order(faults, policy, cluster):
    import ray

    node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    b = backend(faults, max_concurrent=8)
    health = b.health()
    assert {a["node_id"] for a in health["actors"]} == node_ids, health  # one actor per node (SPREAD)
    assert health["nodes"] == 2
    assert health["address"] == cluster.address
    assert not health["started_cluster"]
    sleeps = {"slow": 1.5, "mid": 0.8, "fast": 0.1}
    reqs = [request(name, policy.url, 3, i + 4, do=f"sleep:{s}") for i, (name, s) in enumerate(sleeps.items())]
    reqs += [request(f"r{i}", policy.url, i + 2, 9) for i in range(12)]
    outcomes = run_all(b, reqs)
    for rid, outcome in outcomes.items():  # each stage once, in order, graded by the rollout's grader
        assert _stages(outcome) == [("workflow", "success"), ("grader", "success")], (rid, outcome.results)
        assert outcome.final.reward == 1.0, outcome.final
    order = [outcomes[n].order for n in ("fast", "mid", "slow")]
    assert order == sorted(order), order  # results arrive as rollouts finish, not as they were sent
    ran_on = {o.final.sample.metrics["node"] for o in outcomes.values()}
    pids = {o.final.sample.metrics["pid"] for o in outcomes.values()}
    assert ran_on == node_ids
    assert os.getpid() not in pids
    assert len(pids) == 2
    assert ray.is_initialized()  # the backend did not start this cluster: it only ended its actors


def test_requests_that_arrive_together_share_an_actor_call_unless_chunk_size_is_one(faults, policy):
    reqs = [request(f"c{i}", policy.url, i + 2, 3, do="sleep:0.3") for i in range(24)]
    chunked = backend(faults, max_concurrent=24, chunk_size=8)
    assert len(_ok(run_all(chunked, reqs))) == 24
    calls = chunked.health()["calls"]
    assert 3 <= calls <= 8, calls  # 24 requests over 2 actors, at most 8 per call
    single = backend(faults, max_concurrent=24, chunk_size=1)
    assert len(_ok(run_all(single, reqs))) == 24
    assert single.health()["calls"] == 24


def test_concurrency_per_actor_sets_the_bound_and_in_flight_never_exceeds_it(faults, policy):
    b = backend(faults, concurrency_per_actor=2)
    assert b.max_concurrency == 4
    reqs = [request(f"b{i}", policy.url, i + 2, 5, do="sleep:0.4") for i in range(12)]
    outcomes = run_all(b, reqs)
    spans = [(o.final.sample.metrics["started"], o.final.sample.metrics["ended"]) for o in outcomes.values()]
    overlap = max(sum(1 for s, e in spans if s <= at < e) for at, _ in spans)
    assert overlap <= 4, spans
    per_pid = Counter(o.final.sample.metrics["pid"] for o in outcomes.values())
    assert len(per_pid) == 2, per_pid


def test_an_actor_killed_mid_run_loses_nothing_and_duplicates_nothing(faults, policy, tmp_path):
    import ray

    b = backend(faults, max_concurrent=16, retry_backoff_sec=0.1)
    victim = b._actors[0]
    reqs = [request(f"k{i}", policy.url, i + 2, 7, do="sleep:1.0") for i in range(40)]

    async def kill(backend_: Any) -> None:
        await anyio.sleep(0.6)  # the first wave is running on both actors
        ray.kill(victim.handle, no_restart=False)

    outcomes = run_all(b, reqs, close=False, during=kill)
    try:
        health = b.health()
    finally:
        anyio.run(b.aclose)
    assert sorted(_ok(outcomes)) == sorted(r.rollout_id for r in reqs), {
        rid: o.results for rid, o in outcomes.items() if rid not in _ok(outcomes)
    }
    assert all(len(o.results) == 2 for o in outcomes.values())  # each stage reported once: no duplicate
    assert health["retried"] >= 1, health
    assert health["actors"][0]["deaths"] >= 1, health


def test_a_poison_row_is_isolated_and_named_while_every_other_row_succeeds(faults, policy):
    b = backend(faults, max_concurrent=8, retry_backoff_sec=0.1)
    reqs = [request(f"p{i}", policy.url, i + 2, 11, do="sleep:0.5") for i in range(16)]
    reqs.insert(5, request("poison", policy.url, 66, 77, do="exit"))
    outcomes = run_all(b, reqs, close=False)
    try:
        health = b.health()
    finally:
        anyio.run(b.aclose)
    poison = outcomes.pop("poison")
    assert [(r.stage, r.status) for r in poison.results] == [(ExecutionStage.WORKFLOW, ExecutionStatus.FAILURE)]
    error = poison.final.error
    assert error.category is ErrorCategory.INFRA_ERROR
    assert "poison row: rollout poison" in error.message, error.message
    assert "val1 = 66" in error.message, error.message
    assert "quarantine actor" in error.message, error.message
    assert sorted(_ok(outcomes)) == sorted(outcomes), {rid: o.results for rid, o in outcomes.items()}
    assert health["poison_rows"] == ["poison"], health
    assert health["quarantine"]["deaths"] >= 1, health


def test_a_hung_actor_hits_the_watchdog_and_its_other_rollouts_move(faults, policy):
    b = backend(faults, max_concurrent=8, watchdog_grace_sec=1.0, retry_backoff_sec=0.1)
    hung = request("hung", policy.url, 2, 2, timeout=1.0, do="block:20")
    others = [request(f"h{i}", policy.url, i + 2, 13, timeout=30, do="sleep:1.5") for i in range(8)]
    started = time.monotonic()
    outcomes = run_all(b, [hung, *others], close=False)
    elapsed = time.monotonic() - started
    try:
        health = b.health()
    finally:
        anyio.run(b.aclose)
    final = outcomes.pop("hung").final
    assert final.error is not None, final
    assert final.error.category is ErrorCategory.TIMEOUT, final
    assert "did not report the rollout within 3 s" in final.error.message, final.error.message
    assert sorted(_ok(outcomes)) == sorted(outcomes), {rid: o.results for rid, o in outcomes.items()}
    assert elapsed < 18, elapsed  # neither the run nor its other rollouts waited for the blocked loop
    assert health["watchdog_timeouts"] == 1, health
    assert sum(a["deaths"] for a in health["actors"]) == 1, health


def test_a_rollout_that_imports_on_the_driver_but_not_on_a_node_fails_naming_the_node_and_the_import(policy, caplog):
    sys.path.insert(0, str(DRIVER_ONLY_PATH))  # on this driver only: the nodes never see it
    try:
        rollout = load(DRIVER_ONLY)
        with caplog.at_level(logging.WARNING, logger="osmosis_ray"):
            b = backend(rollout)
    finally:
        sys.path[:] = [p for p in sys.path if p not in (str(DRIVER_ONLY_PATH), str(DRIVER_ONLY))]
    assert "2 of 2 Ray actors cannot run this rollout" in caplog.text
    outcomes = run_all(b, [request(f"d{i}", policy.url) for i in range(3)])
    for outcome in outcomes.values():
        [failed] = outcome.results
        assert failed.error.category is ErrorCategory.INFRA_ERROR
        message = failed.error.message
        assert "No module named 'osmosis_ray_test_driver_only'" in message
        assert "importing main.py" in message
        assert "node 192." in message or ("node " in message and "node id" in message), message


def test_cancellation_reaches_the_actors_and_every_rollout_in_flight_is_reported_cancelled(faults, policy, tmp_path):
    marks = tmp_path / "marks"
    b = backend(faults, max_concurrent=6)
    reqs = [request(f"x{i}", policy.url, i + 2, 3, do="sleep:30", marks=str(marks)) for i in range(6)]
    seen: dict[str, list[Any]] = {r.rollout_id: [] for r in reqs}
    raised: list[str] = []

    async def main() -> None:
        async def one(req: Any) -> None:
            async def keep(result: Any) -> None:
                seen[req.rollout_id].append(result)

            try:
                await b.execute(req, keep, keep)
            except anyio.get_cancelled_exc_class():
                raised.append(req.rollout_id)
                raise

        async with anyio.create_task_group() as tg:
            for req in reqs:
                tg.start_soon(one, req)
            await anyio.sleep(2.0)
            tg.cancel_scope.cancel()
        with anyio.fail_after(10):  # the actors were told, before anything is closed
            while len(list(marks.glob("*.cancelled"))) < len(reqs):
                await anyio.sleep(0.1)
        await b.aclose()

    anyio.run(main)
    assert sorted(raised) == sorted(seen)
    for rid, results in seen.items():
        assert [(r.stage, r.status) for r in results] == [(ExecutionStage.WORKFLOW, ExecutionStatus.CANCELLED)], rid
    assert sorted(p.name for p in marks.iterdir()) == sorted(f"{rid}.cancelled" for rid in seen)


def test_when_every_actor_is_gone_a_started_rollout_fails_and_a_new_one_raises_backend_unavailable(faults, policy):
    import ray

    b = backend(faults, unavailable_after_sec=1.0, retry_backoff_sec=0.05, max_infra_attempts=2)
    for actor in b._actors:
        ray.kill(actor.handle, no_restart=True)

    async def main() -> tuple[list[Any], BaseException | None]:
        results: list[Any] = []

        async def keep(result: Any) -> None:
            results.append(result)

        await b.execute(request("first", policy.url), keep, keep)
        error = None
        try:
            await b.execute(request("second", policy.url), keep, keep)
        except BackendUnavailable as exc:
            error = exc
        await b.aclose()
        return results, error

    results, error = anyio.run(main)
    [first] = results
    assert first.error.category is ErrorCategory.INFRA_ERROR, first
    assert "Ray" in first.error.message, first
    assert isinstance(error, BackendUnavailable), error
    assert "no Ray actor has been usable" in str(error), error
    assert [r.rollout_id for r in results] == ["first"]  # the second never started: nothing reported


def test_health_reports_the_cluster_the_actors_their_load_and_failures(faults, policy):
    import json

    b = backend(faults, max_concurrent=4)
    seen: dict[str, Any] = {}

    async def look(backend_: Any) -> None:
        await anyio.sleep(0.5)
        seen.update(backend_.health())

    run_all(b, [request(f"l{i}", policy.url, do="sleep:1.5") for i in range(4)], during=look)
    json.dumps(seen)
    assert seen["status"] == "ok", seen
    assert seen["in_flight"] == 4, seen
    assert seen["max_concurrency"] == 4, seen
    assert [a["in_flight"] for a in seen["actors"]] == [2, 2], seen
    for actor in seen["actors"]:
        assert {"node_id", "node_ip", "pid", "capacity", "deaths", "restarts", "state"} <= set(actor)
    assert b.health()["status"] == "failed"  # closed


def test_a_loopback_policy_on_a_multi_node_cluster_is_warned_about_once(faults, policy, caplog):
    b = backend(faults)
    with caplog.at_level(logging.WARNING, logger="osmosis_ray"):
        run_all(b, [request(f"w{i}", policy.url) for i in range(3)])
    warnings = [r for r in caplog.records if "loopback address" in r.getMessage()]
    assert len(warnings) == 1
    assert "2 nodes" in warnings[0].getMessage()


def test_the_rollout_folder_reaches_the_actors_as_rays_working_dir(faults, policy):
    """The actors import the rollout from Ray's copy of its folder (uploaded once, unpacked per node)."""
    outcomes = run_all(backend(faults), [request(f"wd{i}", policy.url, i + 2, 2) for i in range(4)])
    for outcome in outcomes.values():
        metrics = outcome.final.sample.metrics
        assert Path(metrics["file"]).parent == Path(metrics["cwd"]), metrics
        assert not Path(metrics["file"]).is_relative_to(FAULTS), metrics
        assert "working_dir_files" in metrics["file"], metrics


def test_actors_that_cannot_be_placed_or_code_that_cannot_be_uploaded_stop_the_build_with_one_line(faults):
    import ray

    from osmosis_core import InfraError

    def pending() -> set[str]:  # the GCS's actor table (no dashboard here for ray.util.state)
        table = ray._private.state.actors()
        return {aid for aid, a in table.items() if a["State"] in ("PENDING_CREATION", "DEPENDENCIES_UNREADY")}

    before = pending()
    with pytest.raises(InfraError, match=r"did not start within 2 s \(each reserves cpus_per_actor=4 CPU"):
        backend(faults, actors=1, cpus_per_actor=4, start_timeout_sec=2)
    with pytest.raises(InfraError, match=r"cannot upload the rollout's code to the Ray cluster: .*no-such-folder"):
        backend(faults, runtime_env={"py_modules": ["/no-such-folder/mod"]})
    assert pending() <= before  # the actor that could not be placed was ended, not left pending


@pytest.mark.together
def test_inner_harbor_runs_each_rollout_in_a_harbor_trial_on_the_actors_node(policy, tmp_path):
    """``inner = "harbor"``: each actor hosts a HarborBackend (its table in inner_config); trials run on the nodes."""
    pytest.importorskip("osmosis_harbor")
    import shutil as _shutil

    if _shutil.which("bwrap") is None:
        pytest.skip("Harbor's default sandbox needs bubblewrap")
    from osmosis_ray import RayBackend, RayBackendConfig

    rollout = load(REPO / "rollouts" / "multiply-plain")
    config = RayBackendConfig(
        actors=2, inner="harbor", inner_config={"n_concurrent": 1, "keep_successful_trials": True}
    )
    b = RayBackend(
        rollout.workflow_class,
        rollout.workflow_config,
        rollout.grader_class,
        rollout.grader_config,
        config=config,
        max_concurrent=2,
        rollout_dir=rollout.rollout_dir,
        run_dir=tmp_path / "run",
    )
    assert b.health()["inner"] == "harbor"
    outcomes = run_all(b, [request(f"t{i}", policy.url, i + 3, 4, timeout=120) for i in range(2)])
    for rid, outcome in outcomes.items():
        assert [(r.stage.value, r.status.value) for r in outcome.results] == [
            ("workflow", "success"),
            ("grader", "success"),
        ]
        assert outcome.final.reward == 1.0, (rid, outcome.results)
    trials = [p for p in (tmp_path / "run" / "harbor-trials").iterdir() if p.is_dir()]
    assert len(trials) == 2, trials  # one Harbor trial per rollout, kept where the run's folder is
