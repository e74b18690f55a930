"""Timeouts and cancellation: the right category, the trial's logs path, and no process left behind."""

from __future__ import annotations

import json
import secrets
import threading
import time
from pathlib import Path

import anyio
from harbor_helpers import sandbox_processes

from osmosis_core import ExecutionRequest, PolicyEndpoint
from osmosis_core.testing import ScriptedPolicyServer


def _request(rollout_id: str, url: str, probe: list, timeout: float) -> ExecutionRequest:
    return ExecutionRequest(
        rollout_id,
        [{"role": "user", "content": "wait"}],
        PolicyEndpoint(url, "osmosis-stub"),
        label="pass",
        metadata={"probe": probe},
        agent_timeout_sec=timeout,
        grader_timeout_sec=30,
    )


class _Watch:
    """Counts the live processes carrying ``marker`` every 50 ms, in a thread."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.counts: list[int] = [0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.counts.append(len(sandbox_processes(self.marker)))

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _backend(probe, tmp_path):
    from osmosis_harbor import HarborBackend

    return HarborBackend(
        probe.workflow_class,
        probe.workflow_config,
        probe.grader_class,
        probe.grader_config,
        rollout_dir=probe.rollout_dir,
        run_dir=tmp_path,
    )


def test_timeouts_are_timeouts_with_the_trials_logs_and_leave_no_process(probe, tmp_path):
    from harbor_helpers import run_all

    marker = f"osmosis-harbor-timeout-{secrets.token_hex(3)}"
    spawn = f"bash -c 'exec -a {marker} sleep 300'"
    with ScriptedPolicyServer() as server, _Watch(marker) as watch:
        blocked, waiting = run_all(
            _backend(probe, tmp_path),
            [
                # blocks its event loop: only Harbor's own agent timeout can stop it
                _request("blocked", server.url, [{"spawn": spawn}, {"spawn": f"({spawn}) &"}, {"block": 120}], 2),
                # awaits: the workflow's own timeout inside the trial stops it first
                _request("waiting", server.url, [{"spawn": spawn}, {"sleep": 120}], 2),
            ],
        )
    for out in (blocked, waiting):
        assert [r.stage.value for r in out.results] == ["workflow"]
        error = out.final.error
        assert error.category.value == "timeout"
        assert "ran past its 2 s timeout" in error.message
        logs = Path(error.message.rsplit("logs: ", 1)[1].rstrip(")"))
        assert (logs / "result.json").is_file()
        assert logs.parent == tmp_path / "harbor-trials"
    result = json.loads(
        (Path(blocked.final.error.message.rsplit("logs: ", 1)[1].rstrip(")")) / "result.json").read_text()
    )
    assert result["exception_info"]["exception_type"] == "AgentTimeoutError"
    time.sleep(0.2)
    assert sandbox_processes(marker) == []
    assert max(watch.counts) >= 3  # the spawned sleeps did run (blocked: 2, waiting: 1) before the timeouts


def test_a_cancelled_rollout_reports_cancelled_and_leaves_no_process(probe, tmp_path):
    marker = f"osmosis-harbor-cancel-{secrets.token_hex(3)}"
    results = []

    async def keep(result):
        results.append(result)

    async def main(url: str) -> None:
        backend = _backend(probe, tmp_path)
        request = _request("cancelled", url, [{"spawn": f"bash -c 'exec -a {marker} sleep 300'"}, {"sleep": 120}], 60)
        async with anyio.create_task_group() as tg:
            tg.start_soon(backend.execute, request, keep, keep)
            with anyio.fail_after(30):
                while not sandbox_processes(marker):
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        await backend.aclose()

    with ScriptedPolicyServer() as server:
        anyio.run(main, server.url)
    [cancelled] = results
    assert (cancelled.stage.value, cancelled.status.value) == ("workflow", "cancelled")
    assert cancelled.error.category.value == "cancelled"
    assert "trial kept" in cancelled.error.message
    time.sleep(0.2)
    assert sandbox_processes(marker) == []
