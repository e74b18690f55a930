"""Tests of the scripted OpenAI-compatible policy server, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from osmosis_core.testing import scripts  # noqa: E402
from osmosis_core.testing.policy_server import (  # noqa: E402
    Fault,
    LoggedRequest,
    Reply,
    ScriptedPolicyServer,
    ToolCall,
)

MULTIPLY_TOOL = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.fixture(scope="module")
def server():
    with ScriptedPolicyServer() as srv:
        yield srv


@pytest.fixture
def srv(server: ScriptedPolicyServer):
    server.clear()
    server.latency = 0.0
    yield server
    server.clear()
    server.latency = 0.0


@pytest.fixture
def client():
    with httpx.Client(timeout=5.0) as c:
        yield c


def chat(client: httpx.Client, srv: ScriptedPolicyServer, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return client.post(srv.url + "/chat/completions", json=body, **kw)


def sse_chunks(text: str) -> list[Any]:
    """The JSON payloads of an SSE body, with "[DONE]" kept as a string."""
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def assemble(chunks: list[Any]) -> dict[str, Any]:
    """Rebuild a chat.completion message from stream chunks, like an OpenAI client does."""
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for c in chunks:
        if c == "[DONE]" or not c["choices"]:
            continue
        choice = c["choices"][0]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for tc in delta.get("tool_calls") or []:
            slot = calls.setdefault(tc["index"], {"function": {"name": "", "arguments": ""}})
            if "id" in tc:
                slot["id"] = tc["id"]
            if "type" in tc:
                slot["type"] = tc["type"]
            fn = tc.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""
        finish = choice["finish_reason"] or finish
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}


# --------------------------------------------------------------------------------------------------
# scripts
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "a", "b"),
    [
        ("Multiply these.\nval1 = 12\nval2 = 7", 12, 7),
        ("12 * 7", 12, 7),
        ("12 x 7", 12, 7),
        ("multiply 12 and 7", 12, 7),
        ("What is 12 times 7?", 12, 7),
        ("What is -1.5 times 4?", -1.5, 4),
        ("val1 = 0.25\nval2 = -8", 0.25, -8),
    ],
)
def test_calculator_finds_operands(text: str, a: float, b: float) -> None:
    reply = scripts.calculator({"messages": [user(text)], "tools": [MULTIPLY_TOOL]})
    assert reply.content is None
    assert len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    assert call.name == "multiply"
    assert call.arguments == {"a": a, "b": b}
    assert reply.effective_finish_reason() == "tool_calls"


def test_calculator_without_tool_and_edge_cases() -> None:
    assert scripts.calculator({"messages": [user("12 * 7")]}).content == "The product is 84.\n#### 84"
    assert scripts.calculator({"messages": [user("1.5 x 2")]}).content == "The product is 3.\n#### 3"
    assert scripts.calculator({"messages": [user("0.1 * 3")]}).content == (
        "The product is 0.30000000000000004.\n#### 0.30000000000000004"
    )
    nothing = "I could not find two numbers to multiply.\n#### 0"
    assert scripts.calculator({"messages": [user("hello")], "tools": [MULTIPLY_TOOL]}).content == nothing
    assert scripts.calculator({"messages": []}).content == nothing
    tool_turn = {
        "messages": [
            user("12 * 7"),
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "tool_call_id": "x", "content": " 84 \n"},
        ],
        "tools": [MULTIPLY_TOOL],
    }
    assert scripts.calculator(tool_turn).content == "The product is 84.\n#### 84"
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "3 * 4"}]}]}
    assert scripts.calculator(parts).content == "The product is 12.\n#### 12"
    assert scripts.echo({"messages": [user("first"), {"role": "assistant", "content": "x"}]}).content == "first"
    assert scripts.echo({"messages": []}).content == ""


# --------------------------------------------------------------------------------------------------
# completions (thread mode)
# --------------------------------------------------------------------------------------------------


def test_json_completion(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    r = chat(client, srv, {"model": "my-model", "messages": [user("What is 6 times 7?")]})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert doc["object"] == "chat.completion"
    assert doc["id"].startswith("chatcmpl-")
    assert isinstance(doc["created"], int)
    assert doc["model"] == "my-model"
    choice = doc["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "The product is 42.\n#### 42"}
    assert choice["finish_reason"] == "stop"
    usage = doc["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # default model name
    assert chat(client, srv, {"messages": [user("1*1")]}).json()["model"] == "osmosis-stub"


def test_tool_call_then_final_answer(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    messages: list[dict[str, Any]] = [user("Multiply.\nval1 = 12\nval2 = 7")]
    first = chat(client, srv, {"messages": messages, "tools": [MULTIPLY_TOOL]}).json()
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    [call] = message["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"]["name"] == "multiply"
    args = json.loads(call["function"]["arguments"])
    assert args == {"a": 12, "b": 7}

    messages.append(message)
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] * args["b"])})
    second = chat(client, srv, {"messages": messages, "tools": [MULTIPLY_TOOL]}).json()
    assert second["choices"][0]["message"]["content"] == "The product is 84.\n#### 84"
    assert second["choices"][0]["finish_reason"] == "stop"
    assert "tool_calls" not in second["choices"][0]["message"]
    assert [r.status for r in srv.requests] == [200, 200]


def test_custom_script_tool_call_shapes(client: httpx.Client) -> None:
    def script(request: dict[str, Any]) -> Reply:
        return Reply(
            content="thinking",
            tool_calls=(
                ToolCall("f", {"x": 1}, id="call_fixed"),
                ToolCall("g", "{not json", id=None),
            ),
            finish_reason="length",
        )

    with ScriptedPolicyServer(script) as srv:
        msg = chat(client, srv, {"messages": [user("hi")]}).json()["choices"][0]
        assert msg["finish_reason"] == "length"
        calls = msg["message"]["tool_calls"]
        assert calls[0] == {
            "id": "call_fixed",
            "type": "function",
            "function": {"name": "f", "arguments": '{"x": 1}'},
        }
        assert calls[1] == {"type": "function", "function": {"name": "g", "arguments": "{not json"}}
        r = client.post(srv.url + "/chat/completions", json={"messages": [user("hi")], "stream": True})
        streamed = assemble(sse_chunks(r.text))
        assert streamed["content"] == "thinking"
        assert streamed["tool_calls"][0]["id"] == "call_fixed"
        assert "id" not in streamed["tool_calls"][1]
        assert streamed["tool_calls"][1]["function"] == {"name": "g", "arguments": "{not json"}
        assert streamed["finish_reason"] == "length"


def test_script_failure_is_500(client: httpx.Client) -> None:
    def broken(request: dict[str, Any]) -> Reply:
        raise RuntimeError("boom")

    with ScriptedPolicyServer(broken) as srv:
        r = chat(client, srv, {"messages": [user("hi")]})
        assert r.status_code == 500
        assert "boom" in r.json()["error"]["message"]
        assert srv.requests[0].status == 500


# --------------------------------------------------------------------------------------------------
# streaming (in-loop mode)
# --------------------------------------------------------------------------------------------------


def test_streaming_matches_non_streaming_async() -> None:
    async def main() -> None:
        async with ScriptedPolicyServer() as srv, httpx.AsyncClient(timeout=5.0) as ac:
            url = srv.url + "/chat/completions"
            for body in (
                {"messages": [user("12 * 7")]},
                {"messages": [user("12 * 7")], "tools": [MULTIPLY_TOOL]},
            ):
                plain = (await ac.post(url, json=body)).json()["choices"][0]
                async with ac.stream("POST", url, json={**body, "stream": True}) as r:
                    assert r.status_code == 200
                    assert r.headers["content-type"].startswith("text/event-stream")
                    assert r.headers["transfer-encoding"] == "chunked"
                    text = (await r.aread()).decode()
                chunks = sse_chunks(text)
                assert chunks[-1] == "[DONE]"
                assert chunks[0]["object"] == "chat.completion.chunk"
                assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
                assert all(c["choices"] for c in chunks[:-1])  # no usage chunk without include_usage
                got = assemble(chunks)
                assert got["content"] == (plain["message"]["content"] or "")
                assert got["finish_reason"] == plain["finish_reason"]
                want_calls = plain["message"].get("tool_calls", [])
                assert len(got["tool_calls"]) == len(want_calls)
                for g, w in zip(got["tool_calls"], want_calls, strict=True):
                    assert g["type"] == "function"
                    assert g["function"]["name"] == w["function"]["name"]
                    assert json.loads(g["function"]["arguments"]) == json.loads(w["function"]["arguments"])
            content_deltas = [c for c in sse_chunks(text) if c != "[DONE]" and c["choices"]]
            assert len(content_deltas) >= 3
            assert [r.stream for r in srv.requests] == [False, True, False, True]

    asyncio.run(main())


def test_stream_usage_chunk_only_with_include_usage(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    base = {"messages": [user("2 * 3")], "stream": True}
    without = sse_chunks(chat(client, srv, base).text)
    assert not [c for c in without if c != "[DONE]" and not c["choices"]]
    assert all("usage" not in c for c in without if c != "[DONE]")
    for opts in ({"include_usage": False}, {}):
        chunks = sse_chunks(chat(client, srv, {**base, "stream_options": opts}).text)
        assert all(c["choices"] for c in chunks if c != "[DONE]")
    with_usage = sse_chunks(chat(client, srv, {**base, "stream_options": {"include_usage": True}}).text)
    assert with_usage[-1] == "[DONE]"
    usage_chunk = with_usage[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["total_tokens"] > 0
    assert with_usage[-3]["choices"][0]["finish_reason"] == "stop"


# --------------------------------------------------------------------------------------------------
# request log
# --------------------------------------------------------------------------------------------------


def test_request_log_per_rollout(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    chat(client, srv, {"messages": [user("1*2")]}, headers={"X-Osmosis-Rollout-Id": "r1"})
    chat(client, srv, {"messages": [user("3*4")], "stream": True}, headers={"x-osmosis-rollout-id": "r2"})
    chat(
        client,
        srv,
        {"messages": [user("5*6")]},
        headers={"X-OSMOSIS-ROLLOUT-ID": "r1", "Authorization": "Bearer s3"},
    )
    base = f"http://127.0.0.1:{srv.port}"
    client.post(base + "/rollouts/r3/v1/chat/completions", json={"messages": [user("7*8")]})
    client.get(base + "/health")  # not a chat completion: not logged

    log = srv.requests
    assert [r.rollout_id for r in log] == ["r1", "r2", "r1", "r3"]
    assert all(isinstance(r, LoggedRequest) for r in log)
    r1 = srv.requests_for("r1")
    assert [r.body["messages"][0]["content"] for r in r1] == ["1*2", "5*6"]
    assert [r.authorized for r in r1] == [False, True]
    assert "s3" not in repr(log)
    assert srv.requests_for("r2")[0].stream is True
    assert srv.requests_for("r3")[0].path == "/rollouts/r3/v1/chat/completions"
    assert all(r.status == 200 and r.fault is None for r in log)
    assert srv.requests_for("nope") == []
    srv.clear()
    assert srv.requests == []


# --------------------------------------------------------------------------------------------------
# faults
# --------------------------------------------------------------------------------------------------


def test_fault_status(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    srv.inject(Fault("status", status=503, message="overloaded"), times=2)
    for _ in range(2):
        r = chat(client, srv, {"messages": [user("2*2")]})
        assert r.status_code == 503
        assert r.json() == {"error": {"message": "overloaded", "type": "server_error", "param": None, "code": 503}}
    assert chat(client, srv, {"messages": [user("2*2")]}).status_code == 200
    assert [(r.status, r.fault) for r in srv.requests] == [(503, "status"), (503, "status"), (200, None)]


def test_fault_for_one_rollout_and_fifo(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    srv.inject(Fault("status", status=429), rollout_id="b")
    srv.inject(Fault("status", status=502))
    srv.inject(Fault("status", status=504))
    body = {"messages": [user("2*2")]}
    assert chat(client, srv, body, headers={"X-Osmosis-Rollout-Id": "a"}).status_code == 502
    assert chat(client, srv, body, headers={"X-Osmosis-Rollout-Id": "b"}).status_code == 429
    assert chat(client, srv, body, headers={"X-Osmosis-Rollout-Id": "b"}).status_code == 504
    assert chat(client, srv, body, headers={"X-Osmosis-Rollout-Id": "b"}).status_code == 200
    srv.inject(Fault("status"))
    srv.clear()
    assert chat(client, srv, body).status_code == 200


def test_fault_drop(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    srv.inject(Fault("drop"))
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        chat(client, srv, {"messages": [user("2*2")]})
    assert chat(client, srv, {"messages": [user("2*2")]}).status_code == 200
    assert [(r.status, r.fault) for r in srv.requests] == [(0, "drop"), (200, None)]


def test_fault_drop_mid_stream(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    srv.inject(Fault("drop_mid_stream"), times=2)
    body = {"messages": [user("12 * 7")], "stream": True}
    received: list[str] = []

    def read_stream() -> None:
        with client.stream("POST", srv.url + "/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                received.append(line)

    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        read_stream()
    assert any(line.startswith("data: {") for line in received)
    assert "data: [DONE]" not in received
    # a non-stream request gets headers and half the body
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        chat(client, srv, {"messages": [user("12 * 7")]})
    assert [r.fault for r in srv.requests] == ["drop_mid_stream", "drop_mid_stream"]
    assert chat(client, srv, body).status_code == 200


def test_fault_delay_and_latency(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    body = {"messages": [user("2*2")]}
    srv.inject(Fault("delay", delay=0.3))
    t0 = time.perf_counter()
    assert chat(client, srv, body).status_code == 200
    assert time.perf_counter() - t0 >= 0.3
    assert srv.requests[-1].fault == "delay"

    srv.latency = 0.2
    t0 = time.perf_counter()
    assert chat(client, srv, body).status_code == 200
    assert time.perf_counter() - t0 >= 0.2
    t0 = time.perf_counter()
    with client.stream("POST", srv.url + "/chat/completions", json={**body, "stream": True}) as r:
        assert time.perf_counter() - t0 >= 0.2  # nothing, not even headers, before the latency
        r.read()
    srv.latency = 0.0
    t0 = time.perf_counter()
    chat(client, srv, body)
    assert time.perf_counter() - t0 < 0.2


def test_latency_is_concurrent() -> None:
    async def main() -> None:
        async with ScriptedPolicyServer(latency=0.2) as srv, httpx.AsyncClient(timeout=5.0) as ac:
            t0 = time.perf_counter()
            rs = await asyncio.gather(
                *(ac.post(srv.url + "/chat/completions", json={"messages": [user(f"{i}*2")]}) for i in range(20))
            )
            elapsed = time.perf_counter() - t0
            assert all(r.status_code == 200 for r in rs)
            assert 0.2 <= elapsed < 1.5

    asyncio.run(main())


def test_fault_validation() -> None:
    with pytest.raises(ValueError, match="'kind' must be in"):
        Fault("explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Fault.status must be an HTTP error status \(400-599\), got 200"):
        Fault("status", status=200)
    with pytest.raises(ValueError, match="latency must be a finite number >= 0, got -1"):
        ScriptedPolicyServer(latency=-1)
    with pytest.raises(ValueError, match="times must be >= 1, got 0"):
        ScriptedPolicyServer().inject(Fault("drop"), times=0)


# --------------------------------------------------------------------------------------------------
# auth and errors
# --------------------------------------------------------------------------------------------------


def test_api_key(client: httpx.Client) -> None:
    with ScriptedPolicyServer(api_key="sekret") as srv:
        body = {"messages": [user("2*2")]}
        missing = chat(client, srv, body)
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == 401
        assert chat(client, srv, body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = chat(client, srv, body, headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200
        assert client.get(srv.url + "/models").status_code == 401
        models = client.get(srv.url + "/models", headers={"Authorization": "Bearer sekret"}).json()
        assert models["data"][0]["id"] == "osmosis-stub"
        assert client.get(f"http://127.0.0.1:{srv.port}/health").json() == {"status": "ok"}
        assert [(r.status, r.authorized) for r in srv.requests] == [(401, False), (401, True), (200, True)]
        assert "sekret" not in repr(srv.requests)


def test_not_found_bad_request_and_method(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    base = f"http://127.0.0.1:{srv.port}"
    r = client.get(base + "/v2/nothing")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == 404
    assert client.post(base + "/v1/completions", json={}).status_code == 404

    bad = client.post(srv.url + "/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400
    err = bad.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["code"] == 400
    assert client.post(srv.url + "/chat/completions", json=[1, 2]).status_code == 400
    assert client.post(srv.url + "/chat/completions", json={"model": "x"}).status_code == 400
    assert [(r.status, r.body) for r in srv.requests] == [(400, {}), (400, {}), (400, {"model": "x"})]

    assert client.get(srv.url + "/chat/completions").status_code == 405
    assert client.get(base + "/health").json() == {"status": "ok"}
    assert client.get(srv.url + "/models").json()["data"][0]["id"] == "osmosis-stub"


# --------------------------------------------------------------------------------------------------
# HTTP/1.1 details
# --------------------------------------------------------------------------------------------------


def test_chunked_request_body(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    payload = json.dumps({"messages": [user("What is 9 times 9?")]}).encode()

    def pieces():
        for i in range(0, len(payload), 7):
            yield payload[i : i + 7]

    r = client.post(srv.url + "/chat/completions", content=pieces())
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"].endswith("#### 81")
    assert srv.requests[0].body["messages"][0]["content"] == "What is 9 times 9?"


def _raw_request(body: dict[str, Any], *, close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n"
    if close:
        head += "Connection: close\r\n"
    return (head + "\r\n").encode() + data


def _recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def test_pipelining_and_connection_close(srv: ScriptedPolicyServer) -> None:
    srv.latency = 0.05
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
        # three pipelined requests in one write, split mid-request at an odd place, the last asks to close
        data = (
            _raw_request({"messages": [user("1*1")]})
            + _raw_request({"messages": [user("2*2")]})
            + _raw_request({"messages": [user("3*3")]}, close=True)
        )
        sock.sendall(data[:50])
        time.sleep(0.02)
        sock.sendall(data[50:])
        raw = _recv_all(sock)  # returns once the server closes after the third response
    responses = raw.split(b"HTTP/1.1 ")[1:]
    assert len(responses) == 3
    answers = [json.loads(r.split(b"\r\n\r\n", 1)[1])["choices"][0]["message"]["content"] for r in responses]
    assert [a.rsplit(" ", 1)[1] for a in answers] == ["1", "4", "9"]
    assert b"Connection: close" in responses[2].split(b"\r\n\r\n")[0]


def test_http10_stream_is_close_delimited(srv: ScriptedPolicyServer) -> None:
    data = json.dumps({"messages": [user("2*5")], "stream": True}).encode()
    req = f"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
        sock.sendall(req)
        raw = _recv_all(sock)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert b"Transfer-Encoding" not in head
    assert assemble(sse_chunks(body.decode()))["content"].endswith("#### 10")


def test_malformed_http_gets_400(srv: ScriptedPolicyServer) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
        sock.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        raw = _recv_all(sock)
    assert raw.split(b" ", 2)[1] == b"400"


# --------------------------------------------------------------------------------------------------
# lifecycle and CLI
# --------------------------------------------------------------------------------------------------


def test_lifecycle() -> None:
    srv = ScriptedPolicyServer()
    with pytest.raises(RuntimeError):
        _ = srv.url
    assert srv.start() is srv
    assert srv.url == f"http://127.0.0.1:{srv.port}/v1"
    with pytest.raises(RuntimeError):
        srv.start()
    with httpx.Client() as c:  # a kept-alive connection must not block stop()
        assert c.get(f"http://127.0.0.1:{srv.port}/health").status_code == 200
        srv.stop()
    srv.stop()  # idempotent
    with pytest.raises(RuntimeError):
        _ = srv.port

    async def main() -> None:
        await srv.start_async()
        async with httpx.AsyncClient() as ac:
            assert (await ac.get(f"http://127.0.0.1:{srv.port}/health")).status_code == 200
            await srv.stop_async()

    asyncio.run(main())


def _cli_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


def test_cli_serves_and_exits_cleanly_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "osmosis_core.testing.policy_server", "--port", "0", "--latency", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_cli_env(),
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("osmosis stub policy listening on http://127.0.0.1:")
        url = line.split(" on ", 1)[1].strip()
        assert url.endswith("/v1")
        r = httpx.post(url + "/chat/completions", json={"messages": [user("12 * 7")]}, timeout=5)
        assert r.json()["choices"][0]["message"]["content"] == "The product is 84.\n#### 84"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert out == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_refuses_non_loopback_without_key() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "osmosis_core.testing.policy_server", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        env=_cli_env(),
        cwd=REPO,
        timeout=20,
    )
    assert proc.returncode != 0
    assert "non-loopback" in proc.stderr
    assert proc.stdout == ""


def test_fault_truncate_html_and_oversize(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    body = {"messages": [user("12 * 7")]}
    srv.inject(Fault("truncate"), times=2)
    cut = chat(client, srv, body)  # a JSON body cut in half, with a correct length
    assert cut.status_code == 200
    assert len(cut.content) > 20
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.content)
    with client.stream("POST", srv.url + "/chat/completions", json={**body, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]  # a clean end: no finish_reason, no [DONE]
    chunks = sse_chunks("\n".join(lines))
    assert chunks
    assert "[DONE]" not in chunks
    assert assemble(chunks)["finish_reason"] is None
    srv.inject(Fault("html"))
    page = chat(client, srv, body)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    srv.inject(Fault("oversize", size=3 << 20))
    big = chat(client, srv, body)
    assert big.status_code == 200
    assert "content-length" not in big.headers
    assert len(big.content) > 3 << 20
    assert json.loads(big.content)["choices"][0]["message"]["content"] == "a" * (3 << 20)
    assert [r.fault for r in srv.requests] == ["truncate", "truncate", "html", "oversize"]


def test_fault_bad_json_and_wrong_shape(srv: ScriptedPolicyServer, client: httpx.Client) -> None:
    body = {"messages": [user("12 * 7")]}
    srv.inject(Fault("bad_json"))
    bad = chat(client, srv, body)  # a complete body that does not parse
    assert bad.status_code == 200
    assert bad.headers["content-type"].startswith("application/json")
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad.content)
    srv.inject(Fault("wrong_shape"))
    assert chat(client, srv, body).json() == {"hello": "world"}
    for fault, bad_data in (
        (Fault("bad_json"), None),
        (Fault("wrong_shape", document={"choices": {}}), {"choices": {}}),
    ):
        srv.inject(fault)
        with client.stream("POST", srv.url + "/chat/completions", json={**body, "stream": True}) as r:
            data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert data[-1] == "[DONE]"
        assert json.loads(data[-2])["choices"][0]["finish_reason"] == "stop"
        if bad_data is None:  # the second event does not parse; the others are a complete answer
            with pytest.raises(json.JSONDecodeError):
                json.loads(data[1])
        else:
            assert json.loads(data[1]) == bad_data
        assert assemble(sse_chunks("\n".join(f"data: {d}" for d in data[:1] + data[2:])))["content"].endswith("84")
    assert [r.fault for r in srv.requests] == ["bad_json", "wrong_shape", "bad_json", "wrong_shape"]


def test_the_stand_in_of_a_killed_run_exits_too(tmp_path: Path) -> None:
    """kill -9 of `osmosis run --stub-policy` (or of a test that hit its timeout): the stand-in server
    sees its standard input close and stops; nothing is left running."""
    import shutil

    workspace = tmp_path / "ws"
    shutil.copytree(REPO / "rollouts" / "multiply-plain", workspace / "rollouts" / "multiply-plain")
    (workspace / "configs" / "eval").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "eval" / "multiply-plain.toml", workspace / "configs" / "eval")
    exe = Path(sys.executable).parent / "osmosis"
    proc = subprocess.Popen(
        [str(exe), "run", "configs/eval/multiply-plain.toml", "--stub-policy", "--stub-latency", "1"],
        cwd=workspace, env=_cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    stub: list[str] = []
    while time.monotonic() < deadline and not stub:
        stub = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "policy_server"], capture_output=True,
                              text=True).stdout.split()  # fmt: skip
        time.sleep(0.1)
    assert stub, "the stand-in server never started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{stub[0]}").exists():
        status = Path(f"/proc/{stub[0]}/status").read_text() if Path(f"/proc/{stub[0]}").exists() else ""
        if "zombie" in status:
            break
        time.sleep(0.05)
    alive = Path(f"/proc/{stub[0]}").exists() and "zombie" not in Path(f"/proc/{stub[0]}/status").read_text()
    assert not alive, "the stand-in server outlived its run"
