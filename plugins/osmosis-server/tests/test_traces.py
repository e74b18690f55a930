"""``osmosis serve`` with traces on: each rollout's model calls go through a policy gateway in front
of the policy its request names, and the result (polled or pushed) carries the trace."""

from __future__ import annotations

import asyncio
import functools
import json

import pytest
from server_helpers import REFERENCE, TOKEN, read_lines, reference_validate, run
from test_push import receiver
from workflows import OneCall

from osmosis_core import LocalBackend
from osmosis_core.testing import ScriptedPolicyServer
from osmosis_server import ServerSettings
from osmosis_trainer import RolloutClient, RolloutRequest

pytestmark = pytest.mark.together  # with osmosis-gateway installed beside this plugin


def _request(rollout_id: str, url: str, **extra: object) -> RolloutRequest:
    return RolloutRequest(
        rollout_id=rollout_id,
        initial_messages=[{"role": "user", "content": f"val1 = 6\nval2 = 7 ({rollout_id})"}],
        chat_completions_url=url,
        **extra,  # type: ignore[arg-type]
    )


def test_each_result_carries_the_trace_of_its_own_upstream(serve):
    """Two upstreams (a trainer may name another per request): each rollout is forwarded to its own,
    and its trace holds the ids that upstream sent; the key a request brings never shows in a trace."""
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    from osmosis_core.testing.stub_tokens import render_prompt

    served = serve(LocalBackend(OneCall), traces={"adapter": "vllm"}, settings=ServerSettings(grace_sec=1))
    with (
        ScriptedPolicyServer(flavor="vllm", api_key="sk-first-9a8b7c6d5e4f3210") as one,
        ScriptedPolicyServer(flavor="vllm") as two,
    ):

        async def go():
            client = RolloutClient(served.url, token=TOKEN)
            return await asyncio.gather(
                client.run(_request("r-one", one.url, llm_api_key="sk-first-9a8b7c6d5e4f3210")),
                client.run(_request("r-two", two.url)),
            )

        results = run(go)
        assert len(one.requests) == 1
        assert len(two.requests) == 1  # each rollout reached its own upstream
    folder = served.service.folder
    folder.flush()
    written = {line["rollout_id"]: line for line in read_lines(folder.path / "traces.jsonl")}
    assert sorted(written) == ["r-one", "r-two"]  # traces.jsonl beside results.jsonl, as osmosis run writes it
    for result in results:
        assert result.ok, result.error
        line = written[result.rollout_id]
        assert line["calls"] == result.trace["calls"]
        assert line["complete"] is True
        trace = result.trace
        assert trace is not None
        assert trace["complete"] is True
        assert trace["rollout_id"] == result.rollout_id
        [call] = trace["calls"]
        assert call["prompt_token_ids"] == render_prompt(call["request"]["messages"])
        assert len(call["completion_token_ids"]) == len(call["logprobs"]) > 0
        assert result.rollout_id in call["request"]["messages"][0]["content"]
        assert "sk-first" not in json.dumps(trace)


def test_a_pushed_result_carries_the_trace(serve):
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    served = serve(LocalBackend(OneCall), traces={}, settings=ServerSettings(grace_sec=1))
    with ScriptedPolicyServer(flavor="vllm") as upstream:

        async def go():
            runner, url, _attempts, accepted = await receiver(fail_first=0)
            try:
                client = RolloutClient(served.url, token=TOKEN)
                await client.submit(_request("pushed", upstream.url, callback_url=url, grade=False))
                for _ in range(200):
                    if any(a.get("final") for a in accepted):
                        break
                    await asyncio.sleep(0.05)
                return accepted
            finally:
                await runner.cleanup()

        accepted = run(go)
    final = next(a for a in accepted if a["final"])
    assert final["status"] == "success"
    assert final["trace"]["complete"] is True
    assert final["trace"]["calls"][0]["completion_token_ids"]


def test_an_upstream_that_echoes_the_key_leaves_none_of_it_in_the_result(serve):
    """A 401 that echoes the key the request brought (whole, and masked as providers do): with
    traces on, the failed result's message, its trace and the files hold no 8 characters of it."""
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    from osmosis_core.testing import Fault

    key = "sk-proj-Zq8wXv3Nk7Rb2Yt6Hm4Jc1Lp"
    served = serve(LocalBackend(OneCall), traces={"adapter": "vllm"}, settings=ServerSettings(grace_sec=1))
    with ScriptedPolicyServer(flavor="vllm") as upstream:
        echo = f"Incorrect API key provided: {key} (or {key[:12]}****{key[-4:]})"
        upstream.inject(Fault("status", status=401, message=echo), rollout_id="leak")
        request = _request("leak", upstream.url, llm_api_key=key, grade=False)
        result = run(lambda: RolloutClient(served.url, token=TOKEN).run(request))
    assert not result.ok
    assert result.error.category == "policy_error"
    assert "401" in result.error.message
    everything = json.dumps({"error": result.error.message, "trace": result.trace})
    folder = served.service.folder
    folder.flush()
    everything += (folder.path / "results.jsonl").read_text() + (folder.path / "traces.jsonl").read_text()
    assert [key[i : i + 8] for i in range(len(key) - 7) if key[i : i + 8] in everything] == []


def test_a_rollout_the_drain_cancels_has_its_call_in_flight_recorded_as_cancelled(serve):
    """The drain cancels a rollout whose model call is in flight: its trace says the call was
    cancelled and is incomplete (it was an empty "ok" call in a complete trace)."""
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    from osmosis_core.testing import Fault

    served = serve(LocalBackend(OneCall), traces={"adapter": "vllm"}, settings=ServerSettings(grace_sec=0.2))
    with ScriptedPolicyServer(flavor="vllm") as upstream:
        upstream.inject(Fault("delay", delay=30), rollout_id="slow")

        async def go():
            client = RolloutClient(served.url, token=TOKEN)
            admission = await client.submit(_request("slow", upstream.url, grade=False))
            for _ in range(200):
                if upstream.requests:
                    break
                await asyncio.sleep(0.02)
            served.call(served.service.drain)
            return await client.poll(admission, until_final=True)

        result = run(go)
    assert result.status.value == "cancelled"
    trace = result.trace
    assert trace is not None
    assert trace["complete"] is False
    [call] = trace["calls"]
    assert call["status"] == "cancelled"
    assert trace["incomplete_reason"].startswith("call 0 cancelled")


def test_without_traces_a_result_has_no_trace_field(serve):
    served = serve(LocalBackend(OneCall), settings=ServerSettings(grace_sec=1))
    with ScriptedPolicyServer() as upstream:
        result = run(lambda: RolloutClient(served.url, token=TOKEN).run(_request("plain", upstream.url)))
    assert result.ok
    assert result.trace is None


@pytest.mark.reference
@pytest.mark.skipif(not REFERENCE, reason="set OSMOSIS_AI_PYTHON to a Python with osmosis-ai[server]==0.3.8")
def test_the_reference_client_still_reads_a_result_with_a_trace(serve, tmp_path):
    """osmosis-ai 0.3.8's own result model accepts a result document that carries ``trace``."""
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    import httpx

    from osmosis_server import LEASE_HEADER

    served = serve(LocalBackend(OneCall), traces={}, settings=ServerSettings(grace_sec=1))
    with ScriptedPolicyServer(flavor="vllm") as upstream:
        http = httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        body = {"rollout_id": "ref", "initial_messages": [{"role": "user", "content": "hi"}],
                "chat_completions_url": upstream.url, "label": "42"}  # fmt: skip
        lease = http.post("/rollout", json=body).json()["polling_lease_token"]
        document = http.get("/rollout/ref/result?wait=final", headers={LEASE_HEADER: lease}).json()
    assert document["trace"]["calls"]
    [read] = reference_validate(tmp_path, [document])["results"]
    assert read["status"] == "success"
    assert read["rollout_id"] == "ref"


def test_osmosis_serve_traces_flag_and_a_missing_plugin_message(tmp_path):
    """``osmosis serve --traces`` serves results with their trace; a bad ``[traces]`` key stops it at start."""
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    from server_helpers import ServeProcess
    from test_serve import config, osmosis

    path = config(tmp_path, workflow="OneCall", grader="EndsWithLabel")
    served = ServeProcess(
        [str(path), "--port", "0", "--output", str(tmp_path / "run"), "--traces"],
        cwd=tmp_path,
        env={"OSMOSIS_SERVER_TOKEN": TOKEN},
        log=tmp_path / "serve.log",
    )
    try:
        with ScriptedPolicyServer(flavor="vllm") as upstream:
            result = run(lambda: RolloutClient(served.url, token=TOKEN).run(_request("cli", upstream.url, label="42")))
        served.terminate()
        assert served.wait(60) == 0
    finally:
        served.kill()
    assert result.trace is not None
    assert result.trace["calls"][0]["prompt_token_ids"]
    path.write_text(path.read_text() + '\n[traces]\nadapter = "nope"\n')
    refused = osmosis("serve", str(path), "--port", "0", cwd=tmp_path, env={"OSMOSIS_SERVER_TOKEN": TOKEN})
    assert refused.returncode != 0, refused.stderr
    assert "$.traces.adapter" in refused.stderr, refused.stderr


def test_idle_gateways_past_the_limit_are_closed(serve, monkeypatch):
    """One gateway per upstream, but not without bound: past the limit an idle one is closed."""
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    from osmosis_server import service as service_module

    monkeypatch.setattr(service_module, "MAX_TRACE_GATEWAYS", 1)
    served = serve(LocalBackend(OneCall), traces={}, settings=ServerSettings(grace_sec=1))
    with ScriptedPolicyServer(flavor="vllm") as one, ScriptedPolicyServer(flavor="vllm") as two:
        client = RolloutClient(served.url, token=TOKEN)
        first = run(lambda: client.run(_request("first", one.url)))
        second = run(lambda: client.run(_request("second", two.url)))
        assert served.service.gateways.upstreams == [two.url]
    assert first.trace["calls"]
    assert second.trace["calls"]
    assert first.trace["complete"]
    assert second.trace["complete"]


def test_a_restarted_server_returns_a_recorded_result_with_its_trace(tmp_path):
    """``osmosis serve --traces`` stopped with SIGTERM and started again on its folder: a result read
    back from the folder carries the trace the live one did (from its line in traces.jsonl), also
    when the second server runs without traces; a rollout recorded without a trace reads back null."""
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    from server_helpers import ServeProcess
    from test_serve import config

    path = config(tmp_path, workflow="OneCall", grader="EndsWithLabel")

    def start(*flags: str, log: str) -> ServeProcess:
        return ServeProcess(
            [str(path), "--port", "0", "--output", str(tmp_path / "run"), *flags],
            cwd=tmp_path,
            env={"OSMOSIS_SERVER_TOKEN": TOKEN},
            log=tmp_path / f"{log}.log",
        )

    def stop(served: ServeProcess) -> None:
        served.terminate()
        assert served.wait(60) == 0, served.output()

    async def run_all(url: str, upstream: str, ids: list[str]):
        client = RolloutClient(url, token=TOKEN)
        admissions = [await client.submit(_request(rid, upstream, label="42")) for rid in ids]
        return admissions, [await client.result(a) for a in admissions]

    async def read_back(url: str, admissions):
        client = RolloutClient(url, token=TOKEN)
        return [await client.result(a) for a in admissions]

    with ScriptedPolicyServer(flavor="vllm") as upstream:
        served = start("--traces", log="first")
        try:
            traced, before = run(lambda: run_all(served.url, upstream.url, ["t-0", "t-1"]))
            stop(served)
        finally:
            served.kill()
        served = start(log="plain")  # a second server without traces records a rollout without one
        try:
            plain, [untraced] = run(lambda: run_all(served.url, upstream.url, ["p-0"]))
            assert untraced.ok
            assert untraced.trace is None
            stop(served)
        finally:
            served.kill()
    for result in before:
        assert result.ok
        assert result.trace is not None
        assert result.trace["calls"][0]["completion_token_ids"]
    for flags in (("--traces",), ()):
        served = start(*flags, log="again" + "".join(flags))
        try:
            after = run(functools.partial(read_back, served.url, traced + plain))
        finally:
            served.kill()
        assert [r.rollout_id for r in after] == ["t-0", "t-1", "p-0"]
        for old, new in zip(before, after, strict=False):
            assert new.ok, flags
            assert new.trace == old.trace, flags  # the same trace, read back from traces.jsonl
        assert after[2].ok
        assert after[2].trace is None
    # traces.jsonl deleted (it is the large file): the results still read back, without their traces
    (tmp_path / "run" / "traces.jsonl").unlink()
    served = start("--traces", log="no-traces-file")
    try:
        lost = run(functools.partial(read_back, served.url, traced))
    finally:
        served.kill()
    assert [r.ok for r in lost] == [True, True]
    assert [r.trace for r in lost] == [None, None]
