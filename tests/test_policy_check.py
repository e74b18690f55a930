"""The policy endpoint is asked once before a run (GET {base_url}/models): unreachable stops `osmosis run`
in one line; an answer that is not a plain yes is a warning; `osmosis validate` says which. Real servers
on 127.0.0.1, real sockets, no secret in any message."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from aiohttp import web

from osmosis_core import PolicyEndpoint
from osmosis_core._engine.policy_check import PolicyCheck, check_policy, check_policy_sync
from osmosis_core.http.client import http_scope
from osmosis_core.http.server import start_http_server
from osmosis_core.testing import ScriptedPolicyServer

KEY = "sk-KEYSECRET-0123456789abcdef"


def free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def answering(status: int, body: object) -> AsyncIterator[str]:
    """An HTTP server whose every answer is ``status`` with ``body`` (JSON, ``$AUTH``: the request's
    Authorization header, as a server that echoes it); the base URL."""

    async def handle(request: web.BaseRequest) -> web.Response:
        text = json.dumps(body).replace("$AUTH", request.headers.get("Authorization", ""))
        return web.Response(status=status, text=text, content_type="application/json")

    runner, port = await start_http_server(handle, "127.0.0.1", 0, max_body=1 << 20)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


def ask(policy: PolicyEndpoint, **kwargs) -> PolicyCheck:
    return check_policy_sync(policy, **kwargs)


def test_nothing_listening_is_unreachable_at_once():
    url = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    check = ask(PolicyEndpoint(url, "m", api_key=KEY))
    assert time.monotonic() - started < 2
    assert check.unreachable == f"connection refused by 127.0.0.1:{url.split(':')[2].split('/')[0]}"
    assert check.status is None


def test_a_name_that_does_not_resolve_is_unreachable():
    check = ask(PolicyEndpoint("http://osmosis-policy.invalid/v1", "m"))
    assert check.unreachable == "the host name 'osmosis-policy.invalid' does not resolve"


@pytest.mark.parametrize("then", ["close", "silence"])
def test_a_host_that_accepts_but_does_not_speak_http(then):
    """A connection closed without an answer (http to a TLS port, a dead app) is unreachable; one that
    stays silent past the timeout is a warning (the host is there: a loaded server may be slow)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            connection.recv(65536)
            if then == "close":
                connection.close()
            else:
                accepted.append(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    try:
        check = ask(PolicyEndpoint(url, "m"), timeout=0.5)
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(5)
        for connection in accepted:
            connection.close()
    if then == "close":
        assert check.unreachable is not None
        assert "closed the connection without answering" in check.unreachable
    else:
        assert check.unreachable is None
        assert check.warning == f"connected, but no answer to GET {url}/models within 0.5 s"


def test_tls_to_a_plain_http_server_is_unreachable():
    with ScriptedPolicyServer() as server:
        check = ask(PolicyEndpoint(server.url.replace("http://", "https://"), "osmosis-stub"))
    assert check.unreachable is not None
    assert "TLS" in check.unreachable


def test_a_server_that_lists_the_model_is_ok_and_one_that_does_not_is_a_warning():
    with ScriptedPolicyServer(api_key=KEY) as server:
        ok = ask(PolicyEndpoint(server.url, "osmosis-stub", api_key=KEY))
        other = ask(PolicyEndpoint(server.url, "Qwen/Qwen3-8B", api_key=KEY))
        no_route = ask(PolicyEndpoint(server.url.replace("/v1", "/other"), "osmosis-stub", api_key=KEY))
        assert server.requests == []  # nothing was generated
    assert ok.ok
    assert (ok.status, ok.models) == (200, ("osmosis-stub",))
    assert other.warning == "it lists no model named 'Qwen/Qwen3-8B' (it lists osmosis-stub); --model sets the name"
    assert no_route.ok  # 404: a server without the route
    assert no_route.status == 404


@pytest.mark.parametrize(
    ("status", "api_key", "expected"),
    [
        (401, KEY, "answered 401 to GET {url}/models: bad key Bearer ***; the key in $MY_KEY is refused or lacks"),
        (401, None, "answered 401 to GET {url}/models: bad key ; it wants a key: name its variable with"),
        (403, KEY, "answered 403 to GET {url}/models: bad key Bearer ***; the key in $MY_KEY is refused"),
        (503, KEY, "answered 503 to GET {url}/models: bad key Bearer ***"),
        (405, KEY, None),
    ],
)
def test_what_an_error_status_means(status, api_key, expected):
    """The host answered: a warning where it helps, with the key redacted even when the server echoes it."""

    async def main() -> None:
        body = {"error": {"message": "bad key $AUTH"}}
        async with answering(status, body) as url, http_scope():
            policy = PolicyEndpoint(url, "m", api_key=api_key)
            check = await check_policy(policy, key_source="$MY_KEY")
            assert check.status == status
            assert check.unreachable is None
            if expected is None:
                assert check.warning is None
            else:
                assert check.warning is not None
                assert check.warning.startswith(expected.format(url=url)), check.warning
                assert KEY[:8] not in check.warning

    anyio.run(main)


def test_osmosis_run_stops_before_the_run_on_an_unreachable_endpoint(workspace, osmosis_exe, clean_env):
    """Before: 20 rollouts failed in a second, and the summary said only `policy_error 20`."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    env = {**clean_env, "MY_KEY": KEY}
    args = ["run", "configs/eval/multiply-plain.toml", "--policy-url", url, "--api-key-env", "MY_KEY"]
    started = time.monotonic()
    r = subprocess.run(
        [osmosis_exe, *args, "--output", "out"], cwd=workspace, env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith(f"Error: the policy endpoint {url} is unreachable: connection refused by 127.0.0.1:")
    assert r.stderr.count("\n") == 1  # one line
    assert r.stdout == ""
    assert not (workspace / "out").exists()  # nothing was started
    assert KEY[:8] not in r.stderr
    assert time.monotonic() - started < 30


def test_osmosis_run_warns_of_a_model_the_endpoint_does_not_list_and_runs(workspace, osmosis_exe, clean_env):
    with ScriptedPolicyServer() as server:
        url = server.url
        args = ["run", "configs/eval/multiply-plain.toml", "--policy-url", url, "--limit", "1"]
        r = subprocess.run(
            [osmosis_exe, *args, "--output", "out"], cwd=workspace, env=clean_env, capture_output=True, text=True
        )
    assert r.returncode == 0, r.stderr
    assert f"policy {url}: it lists no model named 'Qwen/Qwen3-8B' (it lists osmosis-stub)" in r.stderr


def test_osmosis_validate_says_whether_the_endpoint_answers(workspace, osmosis_exe, clean_env):
    def validate(*flags: str) -> subprocess.CompletedProcess:
        args = [osmosis_exe, "validate", "configs/eval/multiply-plain.toml", *flags]
        return subprocess.run(args, cwd=workspace, env=clean_env, capture_output=True, text=True, timeout=60)

    with ScriptedPolicyServer() as server:
        url = server.url
        answered = validate("--policy-url", url, "--model", "osmosis-stub")
    assert answered.returncode == 0, answered.stderr
    assert f"ok    policy {url} model 'osmosis-stub': answers GET /models (200), lists the model" in answered.stdout
    # the config's endpoint with nothing behind it: a warning (the run may happen where it is)
    port = free_port()
    config = workspace / "configs" / "eval" / "multiply-plain.toml"
    config.write_text(config.read_text().replace("127.0.0.1:8000", f"127.0.0.1:{port}"))
    nothing = validate()
    assert nothing.returncode == 0, nothing.stderr
    assert (
        f"warn  policy http://127.0.0.1:{port}/v1 model 'Qwen/Qwen3-8B': unreachable (connection refused by"
        f" 127.0.0.1:{port}); osmosis run here would stop before it starts" in nothing.stdout
    )
