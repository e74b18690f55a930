"""What the server refuses at the door, and what it does when something breaks after it admitted.

Raw HTTP with the exact bytes against a real ``osmosis serve`` process: ids that cannot be a path
segment or a header are refused with 422 and nothing is admitted; an empty cancel prefix cancels
nothing; ``--host 0.0.0.0`` prints the address it listens on. A third-party backend that breaks
at odd points after admission: every such rollout ends as a recorded failure and frees its slot.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time

import httpx
from server_helpers import TOKEN, read_lines, run
from test_serve import serve_config

from osmosis_core import ExecutionResult, ExecutionStage, ExecutionStatus, RolloutSample
from osmosis_core.plugin import ExecutionBackend
from osmosis_server import RolloutStatus, ServerSettings
from osmosis_trainer import RolloutClient, RolloutRequest

AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
REST = b'"initial_messages": [{"role": "user", "content": "hi"}], "chat_completions_url": "http://127.0.0.1:9/v1"'
LOG_LINE = re.compile(  # ours, or uvicorn's own (it logs at info under --log-level debug)
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) osmosis-server: |INFO:     \w)"
)


def submit_bytes(rollout_id_json: bytes, more: bytes = b"") -> bytes:
    """A POST /rollout body with the id given as its exact JSON text (escapes kept as written)."""
    return b'{"rollout_id": ' + rollout_id_json + b", " + REST + more + b"}"


BAD_IDS = {
    "lone surrogate": rb'"x\ud800"',
    "lone low surrogate": rb'"\udc00y"',
    "newline": rb'"evil\ninjected line"',
    "carriage return": rb'"cr\rinjected"',
    "tab": rb'"a\tb"',
    "escape char": rb'"a\u001b[31mred"',
    "DEL": rb'"a\u007fb"',
    "line separator": rb'"a\u2028injected"',
    "zero width": rb'"a\u200bb"',
    "slash": rb'"a/b"',
    "dot dot": rb'".."',
    "empty": rb'""',
    "too long in bytes": json.dumps("\u00e9" * 300).encode(),  # 300 characters, 600 bytes of UTF-8
}


def test_ids_that_cannot_be_a_path_segment_or_a_header_are_refused_and_nothing_is_admitted(tmp_path):
    served = serve_config(tmp_path, "--log-level", "debug", server="grace_sec = 2\nresult_wait_sec = 1.0")
    try:
        with httpx.Client(base_url=served.url, headers=AUTH, timeout=30) as http:
            answers = {}
            for name, raw_id in BAD_IDS.items():
                for _ in range(3 if name == "lone surrogate" else 1):
                    answers[name] = http.post("/rollout", content=submit_bytes(raw_id))
            # a lone surrogate anywhere else in the body is refused too, naming its place
            elsewhere = http.post(
                "/rollout",
                content=b'{"rollout_id": "ok-id", "initial_messages": [{"role": "user", "content": "a\\udfffb"}], '
                b'"chat_completions_url": "http://127.0.0.1:9/v1"}',
            )
            health = http.get("/health").json()
            # a good id (printable, non-ASCII, spaces, '?' and '%' included) is served
            good = "r\u00e9sum\u00e9 #1 ?50%"
            result = run(
                lambda: RolloutClient(served.url, token=TOKEN).run(
                    RolloutRequest(
                        rollout_id=good,
                        initial_messages=[{"role": "user", "content": "hi"}],
                        chat_completions_url="http://127.0.0.1:9/v1",
                        label="42",
                    )
                )
            )
            after = http.get("/health").json()
        started = time.monotonic()
        served.terminate(signal.SIGTERM)
        assert served.wait(60) == 0
        stop_took = time.monotonic() - started
    finally:
        served.kill()
    for name, answer in answers.items():
        assert answer.status_code == 422, (name, answer.status_code, answer.text)
        assert "@ $.rollout_id" in answer.json()["detail"], (name, answer.json())
    assert "surrogate" in answers["lone surrogate"].json()["detail"]
    assert "printable" in answers["newline"].json()["detail"]
    assert "bytes" in answers["too long in bytes"].json()["detail"]
    assert elsewhere.status_code == 422
    assert "@ $.initial_messages[0].content" in elsewhere.json()["detail"]
    # nothing was admitted: no rollout counted, none active, none running, none recorded
    assert "admitted" not in health["server"]["counts"], health
    assert health["lifecycle"]["active_rollouts"] == 0
    assert health["server"]["running"] == 0
    assert result.status is RolloutStatus.SUCCESS
    assert result.rollout_id == good
    assert result.reward == 1.0
    assert after["server"]["counts"]["admitted"] == 1
    assert after["lifecycle"]["active_rollouts"] == 0
    assert [line["rollout_id"] for line in read_lines(tmp_path / "run" / "results.jsonl")] == [good]
    assert stop_took < 15  # the drain waits for nothing stuck
    log = (tmp_path / "serve.log").read_text()
    assert "Application shutdown failed" not in log, log
    assert "Traceback" not in log, log
    for line in log.splitlines():  # every log line is whole: no id split one
        assert LOG_LINE.match(line), f"a log line was split or is foreign: {line!r}\n{log}"
    assert "injected" not in log


def test_an_empty_cancel_prefix_is_refused_and_cancels_nothing(tmp_path):
    served = serve_config(tmp_path, server="grace_sec = 1\nresult_wait_sec = 1.0")
    try:
        with httpx.Client(base_url=served.url, headers=AUTH, timeout=30) as http:
            for i in range(3):
                sleep = b', "metadata": {"sleep": 30}'
                assert http.post("/rollout", content=submit_bytes(b'"long-%d"' % i, sleep)).status_code == 202
            empty = http.post("/rollout/cancel", content=b'{"prefix": ""}')
            health = http.get("/health").json()
            everything = http.post("/rollout/cancel", content=b'{"all": true}')
        served.terminate()
        assert served.wait(60) == 0
    finally:
        served.kill()
    assert empty.status_code == 422, empty.text
    assert "@ $.prefix" in empty.json()["detail"], empty.text
    assert health["lifecycle"]["active_rollouts"] == 3
    assert everything.json()["dispositions"] == {f"long-{i}": "cancelled_running" for i in range(3)}


def test_serve_prints_the_address_it_listens_on(tmp_path):
    served = serve_config(tmp_path, "--host", "0.0.0.0")
    try:
        assert re.fullmatch(r"http://0\.0\.0\.0:\d+", served.url), served.stdout
        port = int(served.url.rsplit(":", 1)[1])
        health = httpx.get(f"http://127.0.0.1:{port}/health", headers=AUTH, timeout=30)
        served.terminate()
        assert served.wait(60) == 0
    finally:
        served.kill()
    assert health.status_code == 200


class Clumsy(ExecutionBackend):
    """A third-party backend that breaks at odd points after admission (``metadata["mode"]``);
    one slot, so a slot that is never given back stops every later rollout."""

    @property
    def max_concurrency(self) -> int:
        return 1

    async def execute(self, request, on_workflow_complete, on_grader_complete=None):
        mode = request.metadata.get("mode")
        sample = RolloutSample(messages=[*request.prompt, {"role": "assistant", "content": "done"}])
        ok = ExecutionResult(request.rollout_id, ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS, sample=sample)
        if mode == "not-a-result":
            await on_workflow_complete({"status": "success"})  # a dict, not an ExecutionResult
        elif mode == "bad-timings":
            await on_workflow_complete(
                ExecutionResult(
                    request.rollout_id,
                    ExecutionStage.WORKFLOW,
                    ExecutionStatus.SUCCESS,
                    sample=sample,
                    timings={"workflow": "soon"},
                )
            )
        elif mode == "bad-grader-report":
            await on_workflow_complete(ok)
            await on_grader_complete(42)
        elif mode == "raise-after-report":
            await on_workflow_complete(ok)
            raise KeyError("cleanup failed")
        else:
            await on_workflow_complete(ok)


def test_an_exception_after_admission_ends_the_rollout_as_a_recorded_failure_and_frees_its_slot(serve):
    served = serve(Clumsy(), settings=ServerSettings(grace_sec=1, result_wait_sec=2))
    modes = ["not-a-result", "bad-timings", "bad-grader-report", "raise-after-report"]

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        results = {}
        for mode in [*modes, "fine"]:
            request = RolloutRequest(
                rollout_id=f"odd-{mode}",
                initial_messages=[{"role": "user", "content": "hi"}],
                chat_completions_url="http://127.0.0.1:9/v1",
                metadata={"mode": mode},
            )
            async with asyncio.timeout(20):  # a stuck slot would hang here
                results[mode] = await client.run(request)
        return results, await client.health()

    results, health = run(go)
    for mode in modes:
        result = results[mode]
        assert result.status is RolloutStatus.FAILURE, (mode, result)
        assert result.error is not None, (mode, result)
        assert result.error.category.value == "infra_error", (mode, result)
        assert result.error.message, mode
    assert results["fine"].status is RolloutStatus.SUCCESS  # the one slot was given back each time
    assert health["lifecycle"]["active_rollouts"] == 0
    assert health["server"]["running"] == 0
    lines = {line["rollout_id"]: line for line in read_lines(served.service.folder.results_path)}
    assert sorted(lines) == sorted(f"odd-{m}" for m in [*modes, "fine"])
    for mode in modes:
        assert lines[f"odd-{mode}"]["status"] == "failure"
        assert lines[f"odd-{mode}"]["error"]["category"] == "infra_error"
