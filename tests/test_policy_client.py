"""The core's policy client (aiohttp) against real servers on 127.0.0.1: never a POST twice, a bounded
response size, no secret in a message (even one a cut would have split), proxies from the environment."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from aiohttp import web

from osmosis_core import PolicyEndpoint, RolloutContext, chat_completion
from osmosis_core.errors import PolicyError
from osmosis_core.http.client import aclose_http, client_session, http_scope
from osmosis_core.testing import Fault, ScriptedPolicyServer

KEY = "sk-KEYSECRET-0123456789abcdef"
USER = [{"role": "user", "content": "6 * 7"}]
REPO = Path(__file__).resolve().parent.parent


def test_a_dropped_post_is_never_sent_again():
    """The server reads the whole request, then drops the (reused, keep-alive) connection: the call fails
    as policy_error and the server saw it once; a POST is not idempotent."""

    async def main() -> None:
        async with ScriptedPolicyServer() as server, http_scope():
            with RolloutContext("r-once", PolicyEndpoint(server.url, "m")):
                assert (await chat_completion(USER))["content"].endswith("#### 42")  # the connection is now pooled
                server.inject(Fault("drop"))
                with pytest.raises(PolicyError, match="Server disconnected"):
                    await chat_completion([{"role": "user", "content": "2 * 3"}])
                bodies = [json.dumps(r.body, sort_keys=True) for r in server.requests_for("r-once")]
                assert len(bodies) == 2
                assert len(set(bodies)) == 2  # each request exactly once

    anyio.run(main)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (Fault("bad_json"), "malformed JSON"),
        (Fault("wrong_shape"), "no choices"),
        (Fault("wrong_shape", document={"choices": [{"index": 0, "message": "42"}]}), "without a message object"),
        (Fault("wrong_shape", document={"choices": [{"message": {"tool_calls": "x"}}]}), "tool_calls is not a list"),
        (Fault("wrong_shape", document={"error": {"message": "model overloaded"}}), "model overloaded"),
    ],
    ids=["bad_json", "hello_world", "message_not_an_object", "tool_calls_not_a_list", "error_at_200"],
)
def test_an_answer_that_is_not_a_chat_completion_is_a_policy_error(fault: Fault, expected: str):
    """The core's own chat helper classifies like the agent integrations' client (issue 16.4)."""

    async def main() -> None:
        async with ScriptedPolicyServer() as server, http_scope():
            with RolloutContext("r-shape", PolicyEndpoint(server.url, "m", api_key=KEY)):
                server.inject(fault)
                with pytest.raises(PolicyError) as caught:
                    await chat_completion(USER)
                message = str(caught.value)
                assert f"policy endpoint {server.url}/chat/completions answered 200 with" in message, message
                assert expected in message
                assert caught.value.status == 200

    anyio.run(main)


def test_one_session_per_loop_closed_by_its_owner():
    async def main() -> None:
        first = client_session()
        assert client_session() is first
        assert not first.closed
        await aclose_http()
        assert first.closed
        await aclose_http()  # idempotent
        async with http_scope():
            second = client_session()
            assert second is not first
        assert second.closed

    anyio.run(main)
    anyio.run(main)  # a new loop gets its own


def test_an_error_body_is_redacted_before_it_is_cut():
    """A key that the 300-character cut would split is still removed whole (not its first characters)."""
    for offset in range(280, 310, 3):
        message = "x" * offset + f" authorization=Bearer {KEY} more"

        async def main(message: str = message) -> PolicyError:
            async with ScriptedPolicyServer(api_key=KEY) as server, http_scope():
                server.inject(Fault("status", status=500, message=message))
                policy = PolicyEndpoint(server.url, "m", api_key=KEY)
                with RolloutContext("r", policy), pytest.raises(PolicyError) as info:
                    await chat_completion(USER)
            return info.value

        error = anyio.run(main)
        assert "answered 500" in str(error), (offset, str(error))
        assert "Bearer ***" in str(error), (offset, str(error))
        assert KEY[:8] not in str(error), (offset, str(error))


def test_a_response_over_the_size_limit_is_a_policy_error_without_reading_it_all():
    async def main() -> None:
        async with ScriptedPolicyServer() as server, http_scope():
            server.inject(Fault("oversize", size=20 << 20))
            policy = PolicyEndpoint(server.url, "m", max_response_bytes=1 << 20)
            with RolloutContext("r", policy):
                with pytest.raises(PolicyError, match=r"over the 1048576-byte limit"):
                    await chat_completion(USER)
                assert (await chat_completion(USER))["content"].endswith("#### 42")  # the next call is fine

    anyio.run(main)


def test_a_compressed_reply_is_held_to_the_limit_as_it_inflates():
    """A gzip body of 50 KB that inflates to 50 MB: its Content-Length says nothing, the decoded bytes count."""
    import gzip

    body = gzip.compress(b'{"choices": [{"message": {"role": "assistant", "content": "' + b"a" * (50 << 20) + b'"}}]}')

    async def bomb(_request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", bomb)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with http_scope():
                policy = PolicyEndpoint(f"http://127.0.0.1:{port}/v1", "m", max_response_bytes=1 << 20)
                with RolloutContext("r", policy), pytest.raises(PolicyError, match=r"over the 1048576-byte limit"):
                    await chat_completion(USER)
        finally:
            await runner.cleanup()

    assert len(body) < 1 << 20
    anyio.run(main)


def test_a_500_mb_reply_does_not_take_the_run_with_it(workspace, osmosis_exe, clean_env):
    """`osmosis run` against a server that answers 500 MB: the rollout fails at the limit (64 MiB by
    default), the run goes on, and its memory stays far below the reply's size."""
    with ScriptedPolicyServer() as server:
        server.inject(Fault("oversize", size=500 << 20))
        proc = subprocess.Popen(
            [osmosis_exe, "run", "configs/eval/multiply-plain.toml", "--policy-url", server.url, "--limit", "3",
             "--concurrency", "1", "--output", "out"],
            cwd=workspace, env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode() if proc.stderr else ""
    peak_mb = usage.ru_maxrss / 1024
    print(f"\npeak RSS of `osmosis run` given a 500 MB reply (limit 64 MiB): {peak_mb:.0f} MB")
    assert proc.returncode == 0, err
    records = [json.loads(x) for x in (workspace / "out" / "results.jsonl").read_text().splitlines()]
    failed = [x for x in records if x["status"] == "failure"]
    assert len(records) == 3
    assert len(failed) == 1
    assert failed[0]["error"]["category"] == "policy_error"
    assert "byte limit" in failed[0]["error"]["message"]
    assert peak_mb < 300


async def _forwarding_proxy(seen: list[str]) -> tuple[web.AppRunner, int]:
    """A plain HTTP forward proxy (absolute-form requests), counting what passes through it."""
    import aiohttp

    async def forward(request: web.Request) -> web.StreamResponse:
        seen.append(str(request.url))
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method, str(request.url), data=await request.read(), headers=request.headers
            ) as upstream,
        ):
            return web.Response(status=upstream.status, body=await upstream.read(), headers=upstream.headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, int(runner.addresses[0][1])


def test_http_proxy_from_the_environment_is_used(workspace, osmosis_exe, clean_env):
    seen: list[str] = []

    async def main() -> subprocess.CompletedProcess:
        runner, port = await _forwarding_proxy(seen)
        try:
            async with ScriptedPolicyServer() as server:
                env = {**clean_env, "HTTP_PROXY": f"http://127.0.0.1:{port}", "NO_PROXY": ""}
                args = [osmosis_exe, "run", "configs/eval/multiply-plain.toml", "--policy-url", server.url,
                        "--limit", "2", "--output", "out"]  # fmt: skip
                proc = await asyncio.create_subprocess_exec(
                    *args, cwd=workspace, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
                )
                out, err = await proc.communicate()
                return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())
        finally:
            await runner.cleanup()

    run = asyncio.run(main())
    assert run.returncode == 0, run.stderr
    assert seen[0].endswith("/v1/models")  # the run's reachability check, through the proxy too
    calls = seen[1:]
    assert len(calls) == 4
    assert all(url.endswith("/v1/chat/completions") for url in calls)  # 2 rollouts x 2 calls


@pytest.fixture(autouse=True)
def _no_proxy_from_the_machine(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_the_openai_extra_is_not_needed_by_the_core():
    """The core's client is aiohttp alone: `import osmosis_core.policy` pulls in neither httpx nor openai."""
    code = (
        "import sys, osmosis_core.policy, osmosis_core.http.client; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('httpx', 'httpx2', 'openai')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


LOOP_END_SCRIPT = r"""
import asyncio, gc, sys
import anyio
from osmosis_core import ExecutionRequest, LocalBackend, PolicyEndpoint
from osmosis_core.http import client_session, http_request, on_close
from osmosis_core.testing import ScriptedPolicyServer

sys.path.insert(0, sys.argv[1])
from main import MultiplyGrader, MultiplyWorkflow

sessions, closed, alive = {}, [], []


async def rollout(name, url):
    results = []

    async def keep(result):
        results.append(result)

    prompt = [{"role": "user", "content": "val1 = 6\nval2 = 7"}]
    request = ExecutionRequest(name, prompt, PolicyEndpoint(url, "m"), label="42")
    await LocalBackend(MultiplyWorkflow, grader=MultiplyGrader).execute(request, keep, keep)
    assert [r.ok for r in results] == [True, True], results
    sessions[name] = client_session()

    async def closer():
        closed.append(name)

    on_close(closer)


async def stream(url):
    try:
        yield
    finally:  # still calls the server while the loop shuts its generators down
        await asyncio.sleep(0.05)
        async with http_request("GET", url + "/models") as response:
            assert response.status == 200
        print("the generator's last request: 200")


async def with_a_live_generator(url):
    await rollout("a generator alive at the end", url)
    generator = stream(url)
    await anext(generator)
    alive.append(generator)


with ScriptedPolicyServer() as server:
    asyncio.run(rollout("asyncio.run", server.url))
    with asyncio.Runner() as runner:
        runner.run(rollout("asyncio.Runner", server.url))
    anyio.run(rollout, "anyio.run", server.url)
    asyncio.run(with_a_live_generator(server.url))
gc.collect()
for name, session in sessions.items():
    print(f"{name}: session {'closed' if session.closed else 'OPEN'}, closer {'ran' if name in closed else 'NOT run'}")
"""


def test_a_loops_http_clients_close_when_it_shuts_down(tmp_path, clean_env):
    """A script that runs LocalBackend with chat_completion under asyncio.run (or asyncio.Runner,
    anyio.run) and never closes anything ends with the loop's session and its on_close closers
    closed, and without "Unclosed client session"; a generator the loop closes at its end may still
    send a request from its finally."""
    script = tmp_path / "script.py"
    script.write_text(LOOP_END_SCRIPT)
    rollout = REPO / "rollouts" / "multiply-plain"
    env = {**clean_env, "PYTHONDEVMODE": "1"}  # ResourceWarnings shown, asyncio's debug checks on
    proc = subprocess.run(
        [sys.executable, str(script), str(rollout)], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "the generator's last request: 200",
        "asyncio.run: session closed, closer ran",
        "asyncio.Runner: session closed, closer ran",
        "anyio.run: session closed, closer ran",
        "a generator alive at the end: session closed, closer ran",
    ], proc.stdout + proc.stderr
    for unwanted in ("Unclosed", "unclosed", "Traceback", "exception"):
        assert unwanted not in proc.stderr, proc.stderr
