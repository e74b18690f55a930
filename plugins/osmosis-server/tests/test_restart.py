"""A server killed (``kill -9``) and started again on the same run folder: nothing is forgotten,
nothing is recorded twice.

Real ``osmosis serve`` processes, real signals, raw HTTP and the plugin's polling RolloutClient.
A recorded rollout answers its result (read back from results.jsonl) and a resubmit gets 409; one
admitted but never recorded answers 410 "lost" and runs once more when it is submitted again.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from server_helpers import TOKEN, ServeProcess, read_lines, run
from test_serve import serve_config
from workflows import EndsWithLabel, Trivial

from osmosis_core import LocalBackend
from osmosis_server import LEASE_HEADER, RolloutStatus, ServerSettings
from osmosis_trainer import RolloutClient, RolloutLost, RolloutRequest

AUTH = {"Authorization": f"Bearer {TOKEN}"}
POLICY = "http://127.0.0.1:9/v1"  # never called by these workflows


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def request(rid: str, sleep: float) -> RolloutRequest:
    return RolloutRequest(
        rollout_id=rid,
        initial_messages=[{"role": "user", "content": "What is 6 times 7?"}],
        chat_completions_url=POLICY,
        label="42",
        metadata={"sleep": sleep},
    )


def encoded(req: RolloutRequest) -> bytes:
    """The exact bytes RolloutClient sends for ``req`` (so a raw resubmit is recognised as the same)."""
    return json.dumps(req.to_json(), separators=(",", ":")).encode()


def start(tmp_path: Path, port: int, name: str) -> ServeProcess:
    return serve_config(tmp_path, "--port", str(port), server="grace_sec = 1\nresult_wait_sec = 1.0", log=name)


def wait_for_lines(path: Path, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {count} lines")


def recorded_once(path: Path) -> Counter[str]:
    counts = Counter(line["rollout_id"] for line in read_lines(path))
    twice = {rid: n for rid, n in counts.items() if n > 1}
    assert not twice, f"recorded more than once: {twice}"
    return counts


def test_after_kill_9_a_restart_answers_recorded_rollouts_and_reports_lost_ones_once(tmp_path):
    port = free_port()
    results = tmp_path / "run" / "results.jsonl"
    quick = [request(f"q-{i}", 0.05) for i in range(10)]
    slow = [request(f"s-{i}", 3.0) for i in range(14)]  # 8 slots: 8 running, 6 queued when killed
    first = start(tmp_path, port, "first")
    try:
        with httpx.Client(base_url=first.url, headers={**AUTH, "Content-Type": "application/json"}) as http:
            leases = {}
            for req in quick + slow:
                answer = http.post("/rollout", content=encoded(req))
                assert answer.status_code == 202, answer.text
                leases[req.rollout_id] = answer.json()["polling_lease_token"]
        wait_for_lines(results, 10)
        first.terminate(signal.SIGKILL)
        first.wait(30)
    finally:
        first.kill()
    assert {line["rollout_id"] for line in read_lines(results)} == {r.rollout_id for r in quick}

    second = start(tmp_path, port, "second")
    try:
        with httpx.Client(base_url=second.url, headers={**AUTH, "Content-Type": "application/json"}) as http:

            def poll(rid: str, lease: str | None = None) -> httpx.Response:
                return http.get(f"/rollout/{rid}/result", headers={LEASE_HEADER: lease or leases[rid]})

            health = http.get("/health").json()
            finished = poll("q-0")
            lost = poll("s-0")
            wrong_lease = poll("q-1", "x" * 43)
            unknown = poll("never-admitted", leases["q-0"])
            same_again = http.post("/rollout", content=encoded(quick[0]))
            other_body = http.post("/rollout", content=encoded(request("q-1", 9.0)))
            rerun = http.post("/rollout", content=encoded(slow[0]))  # lost: it runs once more
            rerun_again = http.post("/rollout", content=encoded(slow[0]))
            while_running = poll("s-0")
            documented = http.get("/openapi.json").json()["paths"]["/rollout/{rollout_id}/result"]["get"]

        async def polling_trainer():
            client = RolloutClient(second.url, token=TOKEN)
            old = {r.rollout_id: r for r in quick}
            done = {rid: await client.result(_admission(rid, leases[rid])) for rid in old}
            with pytest.raises(RolloutLost) as raised:
                await client.result(_admission("s-1", leases["s-1"]))
            assert raised.value.rerun
            # what a trainer does with a lost rollout: run it again (RolloutClient.run does that by itself)
            for result in await asyncio.gather(*(client.run(r) for r in slow)):
                done[result.rollout_id] = result
            return done

        done = run(polling_trainer)
        second.terminate()
        assert second.wait(60) == 0
    finally:
        second.kill()
    assert health["server"]["recovered"] == {"recorded": 10, "lost": 14}, health["server"]
    assert finished.status_code == 200
    answer = finished.json()
    assert answer["status"] == "success"
    assert answer["reward"] == 1.0
    assert answer["err_category"] is None
    assert answer["sample"]["messages"][-1]["content"] == "#### 42"
    assert answer["sample"]["label"] == "42"
    assert lost.status_code == 410, lost.text
    assert lost.json()["status"] == "lost"
    assert "submit it again" in lost.json()["detail"]
    assert "410" in documented["responses"]
    assert wrong_lease.status_code == 403
    assert unknown.status_code == 404
    assert same_again.status_code == 409
    assert same_again.json()["polling_lease_token"] == leases["q-0"]
    assert other_body.status_code == 409
    assert "polling_lease_token" not in other_body.json()
    assert rerun.status_code == 202
    assert rerun.json()["polling_lease_token"] == leases["s-0"]
    assert rerun_again.status_code == 409  # exactly once
    assert while_running.status_code == 200
    assert while_running.json()["status"] in ("queued", "running", "grading")
    assert sorted(done) == sorted(r.rollout_id for r in quick + slow)
    assert all(r.status is RolloutStatus.SUCCESS and r.reward == 1.0 for r in done.values()), done
    counts = recorded_once(results)
    assert sorted(counts) == sorted(done)
    assert "14 admitted by an earlier server and lost" in (tmp_path / "second.log").read_text()


def _admission(rid: str, lease: str):
    from osmosis_trainer import Admission

    return Admission(rid, lease, result_wait_sec=1.0)


def test_a_polling_trainer_rides_through_a_kill_9_and_restart(tmp_path):
    """run_many keeps polling while the server is killed and started again on its folder: every
    rollout ends once, the finished ones from their record, the lost ones by running again."""
    port = free_port()
    results = tmp_path / "run" / "results.jsonl"
    requests = [request(f"t-{i}", 0.05 if i % 3 == 0 else 2.5) for i in range(24)]
    server = start(tmp_path, port, "first")
    collected: list = []
    failure: list[BaseException] = []

    def trainer() -> None:
        async def go():
            client = RolloutClient(f"http://127.0.0.1:{port}", token=TOKEN, retry_delays=(0.25, 0.5, 1, 2, 4, 8, 8))
            async for result in client.run_many(requests, concurrency=24):
                collected.append(result)

        try:
            run(go)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=trainer, daemon=True)
    try:
        thread.start()
        wait_for_lines(results, 8)  # the quick ones are recorded, the slow ones are running
        server.terminate(signal.SIGKILL)
        server.wait(30)
        server = start(tmp_path, port, "second")
        thread.join(120)
        assert not thread.is_alive(), failure
        assert not failure, failure
        server.terminate()
        assert server.wait(60) == 0
    finally:
        server.kill()
    assert sorted(r.rollout_id for r in collected) == sorted(r.rollout_id for r in requests)
    assert all(r.status is RolloutStatus.SUCCESS and r.reward == 1.0 for r in collected), collected
    assert sorted(recorded_once(results)) == sorted(r.rollout_id for r in requests)


def test_kill_9_at_random_instants_never_records_an_id_twice_nor_forgets_one(tmp_path):
    rng = random.Random(7)
    port = free_port()
    results = tmp_path / "run" / "results.jsonl"
    admitted: dict[str, str] = {}  # id -> lease, for every 202 seen
    unanswered: dict[str, bytes] = {}  # id -> body, for every submit whose answer was lost
    serial = 0
    for restart in range(4):
        server = start(tmp_path, port, f"run{restart}")
        stop = threading.Event()

        def submitter(url: str = server.url, stop: threading.Event = stop) -> None:
            nonlocal serial
            with httpx.Client(base_url=url, headers={**AUTH, "Content-Type": "application/json"}, timeout=5) as http:
                while not stop.is_set():
                    serial += 1
                    req = request(f"k-{serial}", rng.choice([0.0, 0.05, 0.3, 2.0]))
                    body = encoded(req)
                    try:
                        answer = http.post("/rollout", content=body)
                    except httpx.HTTPError:
                        unanswered[req.rollout_id] = body
                        return
                    if answer.status_code == 202:
                        admitted[req.rollout_id] = answer.json()["polling_lease_token"]

        thread = threading.Thread(target=submitter, daemon=True)
        try:
            thread.start()
            time.sleep(rng.uniform(0.3, 1.5))
            server.terminate(signal.SIGKILL)
            server.wait(30)
            stop.set()
            thread.join(30)
        finally:
            server.kill()
    server = start(tmp_path, port, "last")
    try:
        with httpx.Client(base_url=server.url, headers={**AUTH, "Content-Type": "application/json"}) as http:
            health = http.get("/health").json()
            states = {}
            for rid, lease in admitted.items():
                answer = http.get(f"/rollout/{rid}/result", headers={LEASE_HEADER: lease})
                states[rid] = answer.status_code
                if answer.status_code == 200:
                    assert answer.json()["status"] in ("success", "failure", "cancelled"), answer.json()
            resubmitted = {rid: http.post("/rollout", content=body).status_code for rid, body in unanswered.items()}
        server.terminate()
        assert server.wait(60) == 0
    finally:
        server.kill()
    counts = recorded_once(results)
    assert admitted, "nothing was admitted"
    # every admitted id is accounted for: recorded (200, and in results.jsonl) or reported lost (410)
    assert set(states.values()) <= {200, 410}, states
    assert {rid for rid, code in states.items() if code == 200} <= set(counts)
    lost = {rid for rid, code in states.items() if code == 410}
    assert not lost & set(counts)
    assert health["server"]["recovered"]["lost"] >= len(lost)
    # a submit whose answer was lost: admitted (202, now or before) or already recorded (409), never unknown
    assert set(resubmitted.values()) <= {202, 409}, resubmitted


def test_a_result_past_its_retention_is_read_back_from_the_run_folder_and_never_rerun(serve):
    served = serve(LocalBackend(Trivial, grader=EndsWithLabel), settings=ServerSettings(retention_sec=0.2, grace_sec=1))
    http = httpx.Client(base_url=served.url, headers=AUTH, timeout=30)
    body = request("kept", 0.0).to_json()
    lease = http.post("/rollout", json=body).json()["polling_lease_token"]
    fresh = http.get("/rollout/kept/result?wait=final", headers={LEASE_HEADER: lease}).json()
    deadline = time.monotonic() + 10
    while served.service.health()["server"]["retained_results"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.service.health()["server"]["retained_results"] == 0  # memory let go of it
    later = http.get("/rollout/kept/result", headers={LEASE_HEADER: lease})
    again = http.post("/rollout", json=body)
    assert later.status_code == 200
    assert later.json() == fresh
    assert again.status_code == 409
    assert again.json()["polling_lease_token"] == lease
    assert [line["rollout_id"] for line in read_lines(served.service.folder.results_path)] == ["kept"]


def test_a_line_cut_short_by_a_kill_is_removed_and_its_rollout_is_lost(serve, tmp_path):
    folder = tmp_path / "older"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"kind": "serve"}))
    whole = {
        "row": 0,
        "sample_index": 0,
        "rollout_id": "whole",
        "status": "success",
        "stage": "workflow",
        "error": None,
        "reward": None,
        "metrics": {},
        "timings": {"workflow": 0.1},
        "sample": {"messages": [{"role": "assistant", "content": "hi"}], "system_prompt": None, "chat_messages": None},
    }
    (folder / "results.jsonl").write_text(json.dumps(whole) + "\n" + '{"row": 1, "sample_index": 0, "rollout_id": "cu')
    served = serve(LocalBackend(Trivial), run_dir=folder)
    http = httpx.Client(base_url=served.url, headers=AUTH, timeout=30)
    conflict = http.post("/rollout", json=request("whole", 0.0).to_json())
    ok = http.post("/rollout?wait=final", json=request("next", 0.0).to_json())
    assert conflict.status_code == 409  # recorded by a server that kept no ledger: never run again
    assert ok.status_code == 202
    assert ok.json()["result"]["status"] == "success"
    lines = read_lines(folder / "results.jsonl")  # valid JSONL: the cut line is gone
    assert [line["rollout_id"] for line in lines] == ["whole", "next"]
    assert lines[1]["row"] == 1  # rows continue after the folder's lines


CHILD = """
import os, signal, sys
from osmosis_core import ExecutionResult, ExecutionStage, ExecutionStatus
from osmosis_server import RunFolder

folder = RunFolder(sys.argv[1]).open()
label = "x" * 1000  # long lines: the admissions log passes its 4 MiB and is emptied on the way
for i in range(6000):
    rid = f"c-{i}"
    folder.admit(rid, bytes([i % 256]) * 32, folder.next_row(), 0, label, auto_row=True)
    if i % 2 == 0:
        result = ExecutionResult(rid, ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS)
        folder.record(i, 0, result, digest=bytes([i % 256]) * 32, label=label)
    if i == 5000:
        folder.flush()
os.kill(os.getpid(), signal.SIGKILL)  # between two batches: the last thousand are in the files only
"""


def test_the_ledger_survives_a_kill_between_its_batches_and_after_emptying_its_log(tmp_path):
    """A process that admits and records through RunFolder, empties its admissions log once on the
    way, and is killed with changes still waiting for their batch: the next open knows every id."""
    import subprocess
    import sys

    from osmosis_server import RunFolder

    folder_path = tmp_path / "run"
    child = subprocess.run([sys.executable, "-c", CHILD, str(folder_path)], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    log_size = (folder_path / "admissions.log").stat().st_size
    assert log_size < 6000 * 1000  # it was emptied once (else it would hold every line)
    folder = RunFolder(folder_path).open()
    try:
        assert folder.recovered == {"recorded": 3000, "lost": 3000}
        for i in (0, 1, 4998, 4999, 5998, 5999):
            known = folder.lookup(f"c-{i}")
            assert known is not None, i
            assert known.digest == bytes([i % 256]) * 32, i
            assert known.recorded == (i % 2 == 0), (i, known)
            assert known.label == "x" * 1000, (i, known)
        assert folder.next_row() == 6000  # rows continue after the last one admitted
    finally:
        folder.close()
    assert sorted(recorded_once(folder_path / "results.jsonl")) == sorted(f"c-{i}" for i in range(0, 6000, 2))


TRACED_CHILD = """
import os, signal, sys
from osmosis_core import ExecutionResult, ExecutionStage, ExecutionStatus
from osmosis_server import RunFolder

folder = RunFolder(sys.argv[1]).open()
for i in range(4):
    rid = f"t-{i}"
    folder.admit(rid, b"d" * 32, i, 0, None)
    trace = {"rollout_id": rid, "complete": True, "incomplete_reason": None, "calls": [{"n": i}]}
    at = folder.record_trace(i, 0, rid, trace) if i != 2 else None  # t-2: recorded without a trace
    folder.record(i, 0, ExecutionResult(rid, ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS), digest=b"d" * 32,
                  trace_offset=at)
    if i == 1:
        folder.flush()
os.kill(os.getpid(), signal.SIGKILL)  # t-2 and t-3 were in no batch yet: in the files only
"""


def test_a_trace_is_found_again_after_a_kill_between_batches_and_in_a_ledger_of_before_traces(tmp_path):
    """Where a rollout's trace line is comes back from traces.jsonl itself: after a kill that left
    it out of the index, and for a ledger written before the index held trace offsets."""
    import sqlite3
    import subprocess
    import sys

    from osmosis_server import RunFolder

    folder_path = tmp_path / "run"
    child = subprocess.run(
        [sys.executable, "-c", TRACED_CHILD, str(folder_path)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stderr

    def traces() -> list[object]:
        folder = RunFolder(folder_path).open()
        try:
            found = []
            for i in range(4):
                known = folder.lookup(f"t-{i}")
                assert known is not None, i
                assert known.recorded, i
                found.append(folder.read_trace(known))
            return found
        finally:
            folder.close()

    expected = [
        None if i == 2 else {"rollout_id": f"t-{i}", "complete": True, "incomplete_reason": None, "calls": [{"n": i}]}
        for i in range(4)
    ]
    assert traces() == expected
    with sqlite3.connect(folder_path / "admissions.db") as db:  # as an older server left it
        db.execute("ALTER TABLE rollouts DROP COLUMN trace_offset")
        db.execute("DELETE FROM meta WHERE key = 'traces_end'")
    db.close()
    assert traces() == expected
