"""Interoperability with osmosis-ai 0.3.8: our client against its server, its client against ours.

Runs when ``OSMOSIS_AI_PYTHON`` names a Python with ``osmosis-ai[server]==0.3.8`` installed
(``uv venv /tmp/ref && uv pip install --python /tmp/ref/bin/python 'osmosis-ai[server]==0.3.8'``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest
from server_helpers import HERE, REFERENCE, TOKEN, reference_validate, run
from workflows import EndsWithLabel, Sleepy

from osmosis_core import LocalBackend
from osmosis_server import RolloutStatus, ServerSettings
from osmosis_trainer import RolloutClient, RolloutConflict, RolloutRequest

pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(not REFERENCE, reason="set OSMOSIS_AI_PYTHON to a Python with osmosis-ai[server]==0.3.8"),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_our_client_drives_the_reference_server(tmp_path):
    port = free_port()
    env = {**os.environ, "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(tmp_path / "artifacts"), "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [REFERENCE, str(HERE / "reference" / "ref_server.py"), str(port), TOKEN],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "ref.log").open("w"),
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)

        async def go():
            client = RolloutClient(url, token=TOKEN)
            requests = [
                RolloutRequest(
                    rollout_id=f"ours-{i}",
                    initial_messages=[{"role": "user", "content": "hi"}],
                    chat_completions_url="http://127.0.0.1:9/v1",
                    label="42" if i % 2 else "7",
                )
                for i in range(20)
            ]
            results = [r async for r in client.run_many(requests, concurrency=8)]
            with pytest.raises(RolloutConflict):
                await client.submit(
                    RolloutRequest(
                        rollout_id="ours-0", initial_messages=[], chat_completions_url="http://127.0.0.1:9/v1"
                    )
                )
            return results, await client.health(), await client.cancel(["nope"])

        results, health, dispositions = run(go)
    finally:
        proc.terminate()
        proc.wait(30)
    assert len(results) == 20
    for result in results:
        assert result.status is RolloutStatus.SUCCESS, (result, (tmp_path / "ref.log").read_text())
        assert result.reward == (1.0 if int(result.rollout_id.split("-")[1]) % 2 else 0.0)
        assert result.sample.messages[-1]["content"] == "#### 42"
    assert health["lifecycle"]["accepting_rollouts"] is True
    assert dispositions == {"nope": "not_found"}


def test_the_reference_client_drives_our_server(serve):
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel), settings=ServerSettings(grace_sec=1, result_wait_sec=2))
    out = subprocess.run(
        [REFERENCE, str(HERE / "reference" / "ref_client.py"), served.url, TOKEN],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["status"] == "success"
    assert got["reward"] == 1.0
    assert got["last"] == "#### 42"
    assert got["cancelled"] == {"ref-client-2": "cancelled_running"}
    assert got["second"] == "cancelled"
    assert got["lifecycle"]["accepting_rollouts"] is True
    assert got["idle"] == 0


def test_results_read_back_from_the_run_folder_are_valid_for_the_reference_client(serve, tmp_path):
    """A result past its retention (or recorded by an earlier server) is rebuilt from its results
    line; osmosis-ai's own models accept it, and the 409 a recorded id gets, as they do the originals."""
    import httpx

    from osmosis_server import LEASE_HEADER

    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel), settings=ServerSettings(grace_sec=1, retention_sec=0.2))
    http = httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    originals, read_back, admissions = [], [], []
    for rid, metadata in (("ok", {}), ("bad", {"fail": "the tool broke"})):
        body = {
            "rollout_id": rid,
            "initial_messages": [{"role": "user", "content": "hi"}],
            "chat_completions_url": "http://127.0.0.1:9/v1",
            "label": "42",
            "metadata": metadata,
        }
        lease = http.post("/rollout", json=body).json()["polling_lease_token"]
        originals.append(http.get(f"/rollout/{rid}/result?wait=final", headers={LEASE_HEADER: lease}).json())
        while served.service.health()["server"]["retained_results"]:
            time.sleep(0.05)
        read_back.append(http.get(f"/rollout/{rid}/result", headers={LEASE_HEADER: lease}).json())
        again = http.post("/rollout", json=body)
        assert again.status_code == 409
        admissions.append(again.json())
    assert read_back == originals
    got = reference_validate(tmp_path, read_back, admissions)
    ok, bad = got["results"]
    assert ok["status"] == "success"
    assert ok["sample"]["reward"] == 1.0
    assert ok["sample"]["label"] == "42"
    assert bad["status"] == "failure"
    assert bad["err_category"] == "validation_error"
    assert [a["rollout_id"] for a in got["admissions"]] == ["ok", "bad"]
