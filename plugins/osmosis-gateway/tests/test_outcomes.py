"""How each call ends, and what the trace says of it: a call is recorded when its answer is whole
(``[DONE]`` or the whole body), never ``ok`` before, and a call that did not complete says why."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from gateway_helpers import MULTIPLY_TOOL, QUESTION, answer_json, call_through, raw_upstream, run, stack

from osmosis_core import PolicyEndpoint
from osmosis_core.testing import Fault
from osmosis_gateway import PolicyGateway, trainer_view

pytestmark = pytest.mark.timeout(60)


def ask(**extra):
    return {"model": "osmosis-stub", "messages": QUESTION, "tools": [MULTIPLY_TOOL], **extra}


async def read_to_done(url: str, token: str, *, hang_up: bool) -> bytes:
    """A raw streaming client: reads the events until ``[DONE]``, then returns (closing its connection
    at once with ``hang_up``, else leaving it to the pool), as a rollout that is done with its answer."""
    connector = aiohttp.TCPConnector(force_close=hang_up)
    async with aiohttp.ClientSession(connector=connector) as session:
        headers = {"Authorization": f"Bearer {token}"}
        response = await session.post(url, json=ask(stream=True), headers=headers)
        got = b""
        async for line in response.content:
            got += line
            if line.strip() == b"data: [DONE]":
                break
        if hang_up:
            response.close()  # the connection goes, mid-answer as far as HTTP knows
        else:
            response.release()
        return got


@pytest.mark.parametrize("hang_up", [False, True], ids=["done", "hang-up-after-done"])
def test_a_stream_is_recorded_at_its_done_not_when_the_upstream_closes(hang_up):
    async def main():
        async with stack() as (server, gateway):
            server.latency = 0.0
            results = []
            for n in range(6):
                policy = gateway.open_rollout(f"r{n}")
                server.inject(Fault("linger", delay=0.3), rollout_id=f"r{n}")  # [DONE], then 0.3 s to the end
                got = await read_to_done(policy.chat_completions_url, policy.api_key, hang_up=hang_up)
                assert got.rstrip().endswith(b"data: [DONE]")
                results.append(gateway.pop_trace(f"r{n}"))  # the rollout is over as soon as it has its answer
            return results

    for trace in run(main):
        (call,) = trace.calls
        assert call.status == "ok", call.error
        assert trace.complete
        assert call.completion_token_ids  # the tokens, not an empty "ok"
        assert len(call.logprobs) == len(call.completion_token_ids)
        assert call.finish_reason == "tool_calls"
        view = trainer_view(trace)
        assert view.delivered_fraction == 1.0
        assert view.uncaptured_calls == 0


def test_a_whole_answer_whose_last_chunk_lingers_is_recorded_when_read():
    async def main():
        async with stack() as (server, gateway):
            policy = gateway.open_rollout("r")
            server.inject(Fault("linger", delay=0.3), rollout_id="r")
            async with aiohttp.ClientSession() as session:
                headers = {"Authorization": f"Bearer {policy.api_key}"}
                async with session.post(policy.chat_completions_url, json=ask(), headers=headers) as response:
                    answer = await response.json()
            return answer, gateway.pop_trace("r")

    answer, trace = run(main)
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    assert trace.complete
    assert trace.calls[0].completion_token_ids


async def upstream_that_never_answers(events: list[str]) -> tuple[asyncio.Server, str]:
    """An upstream that reads a call and never answers it; ``events`` gets "call" and "closed" as the
    gateway's connection comes and goes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        events.append("call")
        await reader.read()  # until the gateway closes the connection
        events.append("closed")
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


async def until(condition, timeout: float = 5.0) -> None:
    """Wait (polling) until ``condition()`` holds."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - what is watched has no event to wait on
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("ending", ["rollout hangs up", "trace taken", "delete over http", "gateway stops"])
def test_a_call_in_flight_that_the_rollout_abandons_is_cancelled_upstream_and_recorded(ending):
    async def main():
        events: list[str] = []
        upstream, url = await upstream_that_never_answers(events)
        gateway = await PolicyGateway(PolicyEndpoint(url, "m")).start()
        try:
            policy = gateway.open_rollout("r")
            session = aiohttp.ClientSession()
            headers = {"Authorization": f"Bearer {policy.api_key}"}
            call = asyncio.ensure_future(session.post(policy.chat_completions_url, json=ask(), headers=headers))
            await until(lambda: events == ["call"])
            assert gateway.trace("r").calls[0].status == "pending"
            assert not gateway.trace("r").complete
            trace = None
            if ending == "rollout hangs up":
                call.cancel()
                await session.close()
                await until(lambda: events == ["call", "closed"])  # the upstream call is cancelled
                trace = gateway.pop_trace("r")
            elif ending == "trace taken":
                trace = gateway.pop_trace("r")
                await until(lambda: events == ["call", "closed"])
            elif ending == "delete over http":
                auth = {"Authorization": f"Bearer {gateway.bearer}"}
                async with session.delete(f"{gateway.url}/rollouts/r", headers=auth) as response:
                    assert response.status == 200
                    trace = await response.json()
                await until(lambda: events == ["call", "closed"])
            else:
                trace = gateway.trace("r")
                await gateway.aclose()
                await until(lambda: events == ["call", "closed"])
            with pytest.raises((aiohttp.ClientError, asyncio.CancelledError)):
                await call  # the rollout's own call got no answer
            await session.close()
            return trace
        finally:
            await gateway.aclose()
            upstream.close()

    trace = run(main)
    data = trace if isinstance(trace, dict) else trace.to_json()
    (call,) = data["calls"]
    expected = "client_gone" if ending == "rollout hangs up" else "cancelled"
    assert call["status"] == expected
    assert data["complete"] is False
    assert data["incomplete_reason"].startswith(f"call 0 {expected.replace('_', ' ')}")
    assert call["completion_token_ids"] is None


def test_a_trace_read_while_a_call_is_in_flight_says_so():
    async def main():
        async with stack() as (server, gateway):
            policy = gateway.open_rollout("r")
            server.inject(Fault("delay", delay=0.5), rollout_id="r")
            async with aiohttp.ClientSession() as session:
                headers = {"Authorization": f"Bearer {policy.api_key}"}
                call = asyncio.ensure_future(session.post(policy.chat_completions_url, json=ask(), headers=headers))
                await until(lambda: bool(gateway.trace("r").calls))
                during = gateway.trace("r").to_json()
                async with await call as response:
                    assert response.status == 200
            return during, gateway.pop_trace("r")

    during, after = run(main)
    assert during["complete"] is False
    assert during["incomplete_reason"] == "call 0 is still in flight"
    assert during["calls"][0]["status"] == "pending"
    assert after.complete
    assert json.dumps(after.to_json())  # (the trace taken out holds no pending call)


def test_an_upstream_that_answers_no_http_is_unreadable_and_a_502():
    async def main():
        async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"GARBAGE, NOT HTTP\r\n\r\n")
            await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(garbage, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{upstream.sockets[0].getsockname()[1]}/v1"
        try:
            async with PolicyGateway(PolicyEndpoint(url, "m")) as gateway:
                policy = gateway.open_rollout("r")
                async with aiohttp.ClientSession() as session:
                    headers = {"Authorization": f"Bearer {policy.api_key}"}
                    async with session.post(policy.chat_completions_url, json=ask(), headers=headers) as response:
                        status, body = response.status, await response.json()
                return status, body, gateway.pop_trace("r")
        finally:
            upstream.close()

    status, body, trace = run(main)
    assert status == 502
    assert "not HTTP" in body["error"]["message"]
    assert trace.calls[0].status == "unreadable"
    assert not trace.complete


def test_a_call_the_gateway_cannot_handle_is_recorded_and_never_left_pending():
    deep = b'{"model":"m","messages":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}"  # (RecursionError in json)

    async def odd_choices(request: bytes, writer: asyncio.StreamWriter) -> bool:
        return await answer_json(writer, {"id": "x", "object": "chat.completion", "choices": [1]})

    async def main():
        server, url, _ = await raw_upstream(odd_choices)
        try:
            request_side = await call_through(url, deep)
            answer_side = await call_through(url, ask(stream=True))  # (a stream answered whole: read as events)
            return request_side, answer_side
        finally:
            server.close()

    (status, _raw, trace), (answer_status, answer_raw, answer_trace) = run(main)
    assert status == 400
    assert trace.calls[0].status == "bad_request"
    assert not trace.complete
    assert answer_status == 502  # (an answer the gateway could not turn into events: a choice that is a number)
    assert b"cannot handle its answer" in answer_raw
    assert answer_trace.calls[0].status == "unreadable"
    assert not answer_trace.complete


def test_a_stream_asked_and_answered_whole_reaches_the_rollout_as_a_stream():
    async def whole(request: bytes, writer: asyncio.StreamWriter) -> bool:
        doc = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
               "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                            "message": {"role": "assistant", "content": "84"}}],
               "prompt_token_ids": [1, 2], }  # fmt: skip
        doc["choices"][0]["token_ids"] = [7]
        doc["choices"][0]["logprobs"] = {"content": [{"token": "token_id:7", "logprob": -0.5}]}
        return await answer_json(writer, doc)

    async def main():
        server, url, _ = await raw_upstream(whole)
        try:
            return await call_through(url, ask(stream=True))
        finally:
            server.close()

    status, raw, trace = run(main)
    assert status == 200
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in raw.decode().splitlines()
        if line.startswith("data: {")
    )
    assert text == "84"  # the rollout got its answer as the events it asked for
    assert raw.rstrip().endswith(b"data: [DONE]")
    assert trace.calls[0].status == "ok"
    assert trace.complete


def test_a_redirect_is_not_followed_and_is_the_upstreams_error():
    async def main():
        elsewhere, other_url, other_seen = await raw_upstream(lambda request, writer: asyncio.sleep(0, False))

        async def redirect(request: bytes, writer: asyncio.StreamWriter) -> bool:
            where = f"{other_url}/chat/completions".encode()
            writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % where)
            await writer.drain()
            return True

        server, url, _ = await raw_upstream(redirect)
        try:
            return await call_through(url, ask()), other_seen
        finally:
            server.close()
            elsewhere.close()

    (status, _raw, trace), other_seen = run(main)
    assert status == 307
    assert other_seen == []  # (the headers, secrets among them, never went to the other origin)
    assert trace.calls[0].status == "upstream_error"


def test_an_answer_whose_body_stalls_after_its_head_is_cut_not_unanswered():
    async def stall(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        await asyncio.sleep(3)
        return False

    async def main():
        server, url, _ = await raw_upstream(stall)
        try:
            return await call_through(url, ask(), read_timeout_sec=0.5)
        finally:
            server.close()

    status, _raw, trace = run(main)
    assert status is None  # dropped toward the rollout, as the upstream's answer broke off
    assert trace.calls[0].status == "cut"
    assert "stalled" in trace.calls[0].error


def test_a_nan_in_a_request_is_recorded_as_its_spelling_and_the_trace_line_is_written(tmp_path):
    from osmosis_core.frontend import RunFiles

    async def main():
        async with stack() as (_server, gateway):
            policy = gateway.open_rollout("r")
            body = json.dumps(ask(temperature=float("nan"))).encode()  # (json writes NaN; msgspec refuses it)
            headers = {"Authorization": f"Bearer {policy.api_key}", "Content-Type": "application/json"}
            async with (
                aiohttp.ClientSession() as session,
                session.post(policy.chat_completions_url, data=body, headers=headers) as response,
            ):
                assert response.status == 200
            return gateway.pop_trace("r")

    trace = run(main)
    with RunFiles(tmp_path) as files:
        files.write_trace(0, 0, "r", trace.to_json())
        broken = trace.to_json()
        broken["calls"][0]["request"]["messages"][0]["content"] = "\ud800 not UTF-8"
        files.write_trace(1, 0, "r2", broken)  # (what a gateway never records, a writer still writes)
    first, second = [json.loads(text) for text in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert first["calls"][0]["request"]["temperature"] == "NaN"
    assert first["complete"] is True
    assert second["complete"] is False
    assert "cannot be written as JSON" in second["incomplete_reason"]
