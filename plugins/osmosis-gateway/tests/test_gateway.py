"""The gateway over real HTTP: what the rollout sees, what the trace holds, who may write to it."""

from __future__ import annotations

import asyncio
import json

import pytest
from gateway_helpers import (
    MULTIPLY_TOOL,
    QUESTION,
    UPSTREAM_KEY,
    call_through,
    post,
    raw_upstream,
    run,
    sse_docs,
    stack,
)

from osmosis_core import PolicyEndpoint
from osmosis_core.testing import Fault, ScriptedPolicyServer
from osmosis_core.testing.stub_tokens import encode, logprob_of, render_prompt
from osmosis_gateway import POLICY_VERSION_HEADER, PolicyGateway, trainer_view


def ask(messages=QUESTION, **extra):
    return {"model": "osmosis-stub", "messages": messages, "tools": [MULTIPLY_TOOL], **extra}


def plain_answer(raw: bytes) -> dict:
    doc = json.loads(raw)
    assert "prompt_token_ids" not in doc
    assert "prompt_logprobs" not in doc
    choice = doc["choices"][0]
    assert "token_ids" not in choice
    assert choice["logprobs"] is None
    return doc


@pytest.mark.parametrize("stream", [False, True])
def test_two_turns_captured_exactly_and_stripped_from_the_answer(stream):
    async def main():
        async with stack() as (server, gateway):
            policy = gateway.open_rollout("r-1", policy_version="v7")
            url = policy.chat_completions_url
            status, raw = await post(url, ask(stream=stream), token=policy.api_key)
            assert status == 200
            if stream:
                docs = sse_docs(raw)
                for doc in docs:
                    assert "prompt_token_ids" not in doc
                    for choice in doc["choices"]:
                        assert "token_ids" not in choice
                        assert choice.get("logprobs") is None
                calls = [c for d in docs for c in d["choices"][0]["delta"].get("tool_calls") or []]
                tool_call = {
                    "id": calls[0]["id"],
                    "type": "function",
                    "function": {"name": "multiply", "arguments": calls[1]["function"]["arguments"]},
                }
                assistant = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
            else:
                assistant = plain_answer(raw)["choices"][0]["message"]
            tool = {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "84"}
            second = [*QUESTION, assistant, tool]
            status, raw = await post(url, ask(second, stream=stream), token=policy.api_key)
            assert status == 200
            # what went upstream: the adapter's fields, and the upstream's key
            sent = server.requests_for("r-1")
            assert [r.body["return_token_ids"] for r in sent] == [True, True]
            assert all(r.body["logprobs"] is True and r.body["top_logprobs"] == 0 for r in sent)
            assert all(r.authorized for r in sent)
            return gateway.pop_trace("r-1"), second

    trace, second = run(main)
    assert trace.complete
    assert trace.incomplete_reason is None
    assert trace.capture == "tokens"
    first, last = trace.calls
    assert [c.index for c in trace.calls] == [0, 1]
    assert first.call_id != last.call_id
    assert list(first.prompt_token_ids) == render_prompt(QUESTION)
    assert list(last.prompt_token_ids) == render_prompt(second)
    assert last.finish_reason == "stop"
    assert first.finish_reason == "tool_calls"
    assert last.response["content"] == "The product is 84.\n#### 84"
    generated = [*encode("The product is 84.\n#### 84"), *encode("<|im_end|>")]
    assert list(last.completion_token_ids) == [i for _, i in generated]
    assert list(last.logprobs) == [logprob_of(n, i) for n, (_, i) in enumerate(generated)]
    assert first.policy_version == last.policy_version == "v7"
    assert isinstance(last._request, bytes)  # held as the JSON text it came as until read
    assert first.request["messages"] == QUESTION
    assert "return_token_ids" not in first.request
    view = trainer_view(trace)
    assert view.prefix_breaks == 0
    assert len(view.sequences) == 1
    assert view.delivered_fraction == 1.0
    sequence = view.sequences[0]
    assert sequence.token_ids == [*last.prompt_token_ids, *last.completion_token_ids]
    assert sum(sequence.loss_mask) == len(first.completion_token_ids) + len(last.completion_token_ids)
    assert UPSTREAM_KEY not in json.dumps(trace.to_json())


def test_the_plain_route_with_the_rollout_header_and_policy_versions():
    async def main():
        async with stack() as (_server, gateway):
            gateway.policy_version = "global-3"
            policy = gateway.open_rollout("r-h")
            url = gateway.url + "/chat/completions"
            headers = {"X-Osmosis-Rollout-Id": "r-h"}
            assert (await post(url, ask(), token=policy.api_key, headers=headers))[0] == 200
            tagged = {**headers, POLICY_VERSION_HEADER: "step-9"}
            assert (await post(url, ask(), token=policy.api_key, headers=tagged))[0] == 200
            status, _ = await post(url, ask(osmosis_policy_version="step-10"), token=policy.api_key, headers=headers)
            assert status == 200
            return gateway.pop_trace("r-h")

    trace = run(main)
    assert [c.policy_version for c in trace.calls] == ["global-3", "step-9", "step-10"]
    assert all("osmosis_policy_version" not in c.request for c in trace.calls)


def test_the_version_the_upstream_says_answered_is_the_one_recorded():
    """A weight-sync wrapper in front of vLLM names the weights that answered: that version wins over
    the one the call was tagged with, so off-policy calls are seen for what they are."""

    async def versioned(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        doc = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}  # fmt: skip
        body = json.dumps(doc).encode()
        calls.append(1)
        served = b"X-Osmosis-Policy-Version: step-8\r\n" if len(calls) == 1 else b""  # the first call's only
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
            % (served, len(body), body)
        )
        await writer.drain()
        return True

    async def main():
        server, url, _ = await raw_upstream(versioned)
        async with server, PolicyGateway(PolicyEndpoint(url, "m"), adapter="openai") as gateway:
            policy = gateway.open_rollout("r", policy_version="step-9")
            for _ in range(2):
                assert (await post(policy.chat_completions_url, ask(), token=policy.api_key))[0] == 200
            return gateway.pop_trace("r")

    calls: list[int] = []
    trace = run(main)
    assert [c.policy_version for c in trace.calls] == ["step-8", "step-9"]


def test_refusals_missing_bearer_forged_rollout_and_another_rollouts_token():
    async def main():
        async with stack() as (server, gateway):
            mine = gateway.open_rollout("mine")
            other = gateway.open_rollout("other")
            base = gateway.url
            results = {
                "no bearer": await post(mine.chat_completions_url, ask(), token=None),
                "forged id": await post(f"{base}/rollouts/forged/chat/completions", ask(), token=mine.api_key),
                "other's token": await post(mine.chat_completions_url, ask(), token=other.api_key),
                "header disagrees": await post(
                    mine.chat_completions_url, ask(), token=mine.api_key, headers={"X-Osmosis-Rollout-Id": "other"}
                ),
                "upstream key": await post(mine.chat_completions_url, ask(), token=UPSTREAM_KEY),
                "gateway bearer, unopened": await post(
                    f"{base}/rollouts/forged/chat/completions", ask(), token=gateway.bearer
                ),
                "admin with a rollout token": await post(f"{base}/rollouts", {"rollout_id": "x"}, token=mine.api_key),
            }
            upstream_calls = len(server.requests)
            return results, upstream_calls, gateway.trace("mine"), gateway.trace("other")

    results, upstream_calls, mine, other = run(main)
    statuses = {name: status for name, (status, _) in results.items()}
    assert statuses == {
        "no bearer": 401,
        "forged id": 403,
        "other's token": 403,
        "header disagrees": 403,
        "upstream key": 403,
        "gateway bearer, unopened": 404,
        "admin with a rollout token": 403,
    }
    assert upstream_calls == 0
    assert mine.calls == []
    assert other.calls == []


def test_the_plain_route_takes_its_rollout_from_the_header():
    async def main():
        async with stack() as (server, gateway):
            mine = gateway.open_rollout("mine")
            gateway.open_rollout("other")
            plain = f"{gateway.url}/chat/completions"
            results = {
                "header": await post(plain, ask(), token=mine.api_key, headers={"X-Osmosis-Rollout-Id": "mine"}),
                "no header": await post(plain, ask(), token=mine.api_key),
                "another's rollout": await post(
                    plain, ask(), token=mine.api_key, headers={"X-Osmosis-Rollout-Id": "other"}
                ),
            }
            return results, len(server.requests), gateway.pop_trace("mine"), gateway.pop_trace("other")

    results, upstream_calls, mine, other = run(main)
    assert {name: status for name, (status, _) in results.items()} == {
        "header": 200,
        "no header": 400,
        "another's rollout": 403,
    }
    assert b"X-Osmosis-Rollout-Id" in results["no header"][1]
    assert upstream_calls == 1
    assert [c.status for c in mine.calls] == ["ok"]
    assert other.calls == []


def test_open_and_pop_over_http_then_the_rollout_is_closed():
    async def main():
        import aiohttp

        async with stack() as (_server, gateway):
            status, raw = await post(gateway.url + "/rollouts", {"rollout_id": "h/1"}, token=gateway.bearer)
            assert status == 201
            opened = json.loads(raw)
            assert opened["base_url"].endswith("/rollouts/h%2F1")
            assert opened["model"] == "osmosis-stub"
            url = opened["base_url"] + "/chat/completions"
            assert (await post(url, ask(), token=opened["api_key"]))[0] == 200
            auth = {"Authorization": f"Bearer {gateway.bearer}"}
            async with aiohttp.ClientSession(headers=auth) as session:
                async with session.get(opened["base_url"] + "/trace") as response:
                    peek = await response.json()
                async with session.delete(opened["base_url"]) as response:
                    popped = await response.json()
                async with session.delete(opened["base_url"]) as response:
                    again = response.status
            after = await post(url, ask(), token=opened["api_key"])
            return peek, popped, again, after[0], gateway.open_rollouts

    peek, popped, again, after, still_open = run(main)
    assert peek == popped
    assert popped["rollout_id"] == "h/1"
    assert popped["complete"] is True
    assert len(popped["calls"]) == 1
    assert popped["calls"][0]["prompt_token_ids"]
    assert again == 404
    assert after == 403
    assert still_open == 0


def test_a_text_only_upstream_is_a_capture_failure_that_never_fails_the_call():
    async def main():
        async with stack(flavor="openai") as (_server, gateway):  # answers without token fields
            policy = gateway.open_rollout("r")
            status, raw = await post(policy.chat_completions_url, ask(), token=policy.api_key)
            return status, raw, gateway.pop_trace("r")

    status, raw, trace = run(main)
    assert status == 200
    assert plain_answer(raw)["choices"][0]["message"]["tool_calls"]
    assert not trace.complete
    assert "no prompt_token_ids" in trace.incomplete_reason
    assert trace.calls[0].status == "capture_failed"
    assert trace.calls[0].response["tool_calls"]


def test_the_openai_adapter_adds_nothing_and_says_text_only():
    async def main():
        async with stack(flavor="vllm", adapter="openai") as (server, gateway):
            policy = gateway.open_rollout("r")
            status, raw = await post(policy.chat_completions_url, ask(), token=policy.api_key)
            return status, raw, gateway.pop_trace("r"), server.requests[0].body

    status, _raw, trace, sent = run(main)
    assert status == 200
    assert "return_token_ids" not in sent
    assert "logprobs" not in sent
    assert trace.complete
    assert trace.capture == "text"
    assert trace.calls[0].prompt_token_ids is None
    with pytest.raises(ValueError, match="text only"):
        trainer_view(trace)


def test_a_rollout_that_asks_for_logprobs_itself_still_gets_them():
    async def main():
        async with stack() as (_server, gateway):
            policy = gateway.open_rollout("r")
            _status, raw = await post(
                policy.chat_completions_url, ask(logprobs=True, top_logprobs=0), token=policy.api_key
            )
            return json.loads(raw), gateway.pop_trace("r")

    doc, trace = run(main)
    entries = doc["choices"][0]["logprobs"]["content"]
    assert entries
    assert not entries[0]["token"].startswith("token_id:")  # as asked: text tokens
    assert "token_ids" not in doc["choices"][0]  # it did not ask for ids
    assert trace.complete
    assert list(trace.calls[0].logprobs) == [e["logprob"] for e in entries]


@pytest.mark.parametrize(
    ("fault", "stream", "status", "call_status"),
    [
        (Fault("status", status=503, message="overloaded"), False, 503, "upstream_error"),
        (Fault("status", status=429, message="slow down"), True, 429, "upstream_error"),
        (Fault("drop_mid_stream"), True, None, "cut"),
        (Fault("drop_mid_stream"), False, None, "cut"),
        (Fault("drop"), False, None, "cut"),
        (Fault("drop"), True, None, "cut"),
        (Fault("truncate"), True, 200, "cut"),
        (Fault("truncate"), False, 200, "unreadable"),
        (Fault("html"), False, 200, "unreadable"),
        (Fault("html"), True, 200, "unreadable"),
        (Fault("bad_json"), False, 200, "unreadable"),
        (Fault("bad_json"), True, 200, "unreadable"),
        (Fault("wrong_shape"), False, 200, "unreadable"),
        (Fault("wrong_shape"), True, 200, "unreadable"),
        (Fault("wrong_shape", document={"error": {"message": "out of memory"}}), True, 200, "upstream_error"),
        (Fault("delay", delay=2.0), False, 504, "no_answer"),
        (Fault("delay", delay=2.0), True, 504, "no_answer"),
    ],
)
def test_upstream_faults_reach_the_rollout_as_sent_and_mark_the_trace(fault, stream, status, call_status):
    async def main():
        import aiohttp

        async with stack(read_timeout_sec=1.0) as (server, gateway):
            policy = gateway.open_rollout("r")
            server.inject(fault, rollout_id="r")
            try:
                got, raw = await post(policy.chat_completions_url, ask(stream=stream), token=policy.api_key)
                if stream and got == 200 and fault.kind != "bad_json":
                    sse_docs(raw)
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
                got, raw = None, b""
            # the rollout goes on: its next call is answered and captured
            after, _ = await post(policy.chat_completions_url, ask(), token=policy.api_key)
            return got, raw, after, gateway.pop_trace("r")

    got, raw, after, trace = run(main)
    assert got == status
    assert after == 200
    if fault.kind == "status":
        assert json.loads(raw)["error"]["message"] == fault.message  # the upstream's own body
    assert not trace.complete
    assert trace.incomplete_reason.startswith(f"call 0 {call_status.replace('_', ' ')}")
    assert [c.status for c in trace.calls] == [call_status, "ok"]
    assert UPSTREAM_KEY not in json.dumps(trace.to_json())


def test_an_unreachable_upstream_is_a_502_without_the_key():
    async def main():
        from osmosis_core import PolicyEndpoint
        from osmosis_gateway import PolicyGateway

        upstream = PolicyEndpoint("http://127.0.0.1:9/v1", "m", UPSTREAM_KEY)
        async with PolicyGateway(upstream) as gateway:
            policy = gateway.open_rollout("r")
            status, raw = await post(policy.chat_completions_url, ask(), token=policy.api_key)
            return status, raw, gateway.pop_trace("r")

    status, raw, trace = run(main)
    assert status == 502
    assert b"cannot reach the upstream" in raw
    assert UPSTREAM_KEY.encode() not in raw
    assert trace.calls[0].status == "upstream_error"
    assert not trace.complete


@pytest.mark.parametrize("stream", [False, True])
def test_a_too_large_answer_is_a_502(stream):
    async def main():
        from osmosis_core import PolicyEndpoint
        from osmosis_gateway import PolicyGateway

        async with ScriptedPolicyServer(api_key=UPSTREAM_KEY, flavor="vllm") as server:
            upstream = PolicyEndpoint(server.url, "osmosis-stub", UPSTREAM_KEY, max_response_bytes=1 << 20)
            async with PolicyGateway(upstream) as gateway:
                policy = gateway.open_rollout("r")
                # (a streamed call's event stream has no limit: its error answer, read whole, does)
                big = (
                    Fault("status", status=503, message="x" * (2 << 20)) if stream else Fault("oversize", size=3 << 20)
                )
                server.inject(big, rollout_id="r")
                status, raw = await post(policy.chat_completions_url, ask(stream=stream), token=policy.api_key)
                after, _ = await post(policy.chat_completions_url, ask(stream=stream), token=policy.api_key)
                return status, raw, after, gateway.pop_trace("r")

    status, raw, after, trace = run(main)
    assert status == 502
    assert b"too large" in raw
    assert after == 200
    assert [c.status for c in trace.calls] == ["upstream_error", "ok"]


def leaks(text: str | bytes) -> list[str]:
    """Every run of 8 characters of the upstream's key that ``text`` holds (the core's rule)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [UPSTREAM_KEY[i : i + 8] for i in range(len(UPSTREAM_KEY) - 7) if UPSTREAM_KEY[i : i + 8] in text]


MASKED = UPSTREAM_KEY[:10] + "****" + UPSTREAM_KEY[-4:]  # as a provider echoes a key in its 401


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("echo", [UPSTREAM_KEY, MASKED], ids=["key", "masked-key"])
def test_an_upstream_error_that_echoes_the_key_reaches_the_rollout_without_it(stream, echo):
    async def main():
        import aiohttp

        async with stack() as (server, gateway):
            policy = gateway.open_rollout("r")
            server.inject(Fault("status", status=401, message=f"Incorrect API key provided: {echo}"), rollout_id="r")
            status, raw = await post(policy.chat_completions_url, ask(stream=stream), token=policy.api_key)
            auth = {"Authorization": f"Bearer {gateway.bearer}"}
            async with (
                aiohttp.ClientSession(headers=auth) as session,
                session.get(f"{gateway.url}/rollouts/r/trace") as response,
            ):
                shown = await response.read()
            return status, raw, shown, gateway.pop_trace("r")

    status, raw, shown, trace = run(main)
    assert status == 401  # passed on as the upstream sent it, without the key
    assert json.loads(raw)["error"]["message"].startswith("Incorrect API key provided: ")
    assert b"***" in raw
    assert leaks(raw) == []
    assert leaks(shown) == []
    assert leaks(json.dumps(trace.to_json())) == []
    assert "***" in trace.calls[0].error


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_that_holds_the_whole_key_has_it_taken_out_and_the_call_says_so(stream):
    from osmosis_core.testing import Reply

    def echoes(request):
        return Reply(content=f"the key is {UPSTREAM_KEY}.")

    async def main():
        async with stack(script=echoes) as (_server, gateway):
            policy = gateway.open_rollout("r")
            status, raw = await post(policy.chat_completions_url, ask(stream=stream), token=policy.api_key)
            return status, raw, gateway.pop_trace("r")

    status, raw, trace = run(main)
    assert status == 200
    if not stream:  # (streamed token by token, no event holds the whole key: see the README)
        assert json.loads(raw)["choices"][0]["message"]["content"] == "the key is ***."
        assert leaks(raw) == []
        (call,) = trace.calls
        assert call.status == "capture_failed"  # the rollout's text is no longer what the tokens say
        assert "taken out" in call.error
        assert call.response["content"] == "the key is ***."
    assert UPSTREAM_KEY not in json.dumps(trace.to_json())


def test_the_policys_words_are_never_rewritten_for_sharing_8_characters_with_a_secret():
    """Header values are secrets too, but the 8-character rule on an answer would rewrite ordinary
    words (a referer's host, a title): an answer loses whole secrets only, and stays ``ok``."""
    from osmosis_core.testing import Reply

    text = "Fetch https://docs.python.org/3/ before training; keys look like sk-Qx7vR2kZp9..."

    async def main():
        async with ScriptedPolicyServer(lambda request: Reply(content=text), flavor="vllm") as server:
            from osmosis_core import PolicyEndpoint
            from osmosis_gateway import PolicyGateway

            headers = {"HTTP-Referer": "https://my-lab.example/", "X-Title": "rl-training"}
            upstream = PolicyEndpoint(server.url, "osmosis-stub", UPSTREAM_KEY, headers=headers)
            async with PolicyGateway(upstream) as gateway:
                policy = gateway.open_rollout("r")
                results = [
                    await post(policy.chat_completions_url, ask(stream=stream), token=policy.api_key)
                    for stream in (False, True)
                ]
                return results, gateway.pop_trace("r")

    (whole, streamed), trace = run(main)
    assert json.loads(whole[1])["choices"][0]["message"]["content"] == text
    assert "".join(d["choices"][0]["delta"].get("content") or "" for d in sse_docs(streamed[1])) == text
    assert [c.status for c in trace.calls] == ["ok", "ok"]
    assert [c.response["content"] for c in trace.calls] == [text, text]
    assert trace.complete


def test_upstream_failure_detail_is_redacted():
    def leaky(request):
        raise RuntimeError(f"bad key {UPSTREAM_KEY}")  # a server that echoes the key in its error

    async def main():
        async with stack(script=leaky) as (_server, gateway):
            policy = gateway.open_rollout("r")
            status, raw = await post(policy.chat_completions_url, ask(), token=policy.api_key)
            return status, raw, gateway.pop_trace("r")

    status, raw, trace = run(main)
    assert status == 500  # passed on as the upstream sent it
    assert leaks(raw) == []
    assert UPSTREAM_KEY not in json.dumps(trace.to_json())
    assert "***" in trace.calls[0].error


@pytest.mark.parametrize("bad", ["", "r\r\nX-Evil: 1", "r\n", "tab\there", "nul\x00", ".", "..", "x" * 1025])
def test_a_rollout_id_that_cannot_travel_in_a_header_is_refused_when_opened(bad):
    async def main():
        async with stack() as (_server, gateway):
            with pytest.raises(ValueError, match=r"empty|control characters|dot segment|at most"):
                gateway.open_rollout(bad)
            status, raw = await post(f"{gateway.url}/rollouts", {"rollout_id": bad}, token=gateway.bearer)
            good = await post(f"{gateway.url}/rollouts", {"rollout_id": "r ok/1"}, token=gateway.bearer)
            return status, raw, good[0], gateway.open_rollouts

    status, raw, good, still_open = run(main)
    assert status == 400
    assert b"rollout id" in raw
    assert good == 201  # (spaces and slashes are fine: the id is quoted in the URL)
    assert still_open == 1


def test_200_concurrent_rollouts_never_mix_traces():
    async def main():
        async with stack() as (server, gateway):
            server.latency = 0.02

            async def rollout(n: int):
                policy = gateway.open_rollout(f"r{n}")
                for turn in range(2):
                    question = [{"role": "user", "content": f"What is {n} times {turn + 2}?"}]
                    status, _ = await post(
                        policy.chat_completions_url, ask(question, stream=n % 2 == 1), token=policy.api_key
                    )
                    assert status == 200
                return gateway.pop_trace(f"r{n}")

            return await asyncio.gather(*(rollout(n) for n in range(200)))

    traces = run(main)
    for n, trace in enumerate(traces):
        assert trace.rollout_id == f"r{n}"
        assert trace.complete
        assert len(trace.calls) == 2
        for turn, call in enumerate(trace.calls):
            question = [{"role": "user", "content": f"What is {n} times {turn + 2}?"}]
            assert call.request["messages"] == question
            assert list(call.prompt_token_ids) == render_prompt(question)
            assert call.completion_token_ids
            assert len(call.completion_token_ids) == len(call.logprobs)


def test_a_client_that_hangs_up_mid_stream_marks_the_trace():
    async def main():
        import aiohttp

        async with stack() as (server, gateway):
            server.latency = 0.0
            policy = gateway.open_rollout("r")
            server.inject(Fault("delay", delay=0.3), rollout_id="r")
            headers = {"Authorization": f"Bearer {policy.api_key}"}

            async def hang_up(session: aiohttp.ClientSession) -> None:
                async with (
                    asyncio.timeout(0.1),
                    session.post(policy.chat_completions_url, json=ask(stream=True), headers=headers) as r,
                ):
                    await r.read()

            async with aiohttp.ClientSession() as session:
                with pytest.raises(asyncio.TimeoutError):
                    await hang_up(session)
            await asyncio.sleep(0.6)
            return gateway.pop_trace("r")

    trace = run(main)
    assert len(trace.calls) == 1
    assert trace.calls[0].status == "client_gone"
    assert trace.incomplete_reason.startswith("call 0 client gone")


def test_the_gateway_binds_loopback_by_default():
    async def main():
        async with stack() as (_server, gateway):
            return gateway.url

    assert run(main).startswith("http://127.0.0.1:")


def test_a_wildcard_host_listens_everywhere_and_hands_out_loopback_urls():
    async def main():
        async with stack(host="0.0.0.0") as (_server, gateway):
            policy = gateway.open_rollout("r")
            status, _ = await post(policy.chat_completions_url, ask(), token=policy.api_key)
            return gateway.url, policy.base_url, status

    url, base_url, status = run(main)
    assert url.startswith("http://127.0.0.1:")
    assert base_url.startswith(url)
    assert status == 200


def test_gateway_and_server_share_nothing_but_http():
    # the stand-in's request log knows the rollout by the header the gateway forwards
    async def main():
        async with ScriptedPolicyServer(flavor="vllm") as server:
            from osmosis_core import PolicyEndpoint
            from osmosis_gateway import PolicyGateway

            async with PolicyGateway(PolicyEndpoint(server.url, "m")) as gateway:
                policy = gateway.open_rollout("abc")
                await post(policy.chat_completions_url, ask(), token=policy.api_key)
                return [r.rollout_id for r in server.requests]

    assert run(main) == ["abc"]


def test_sglang_streams_are_asked_whole_and_streamed_to_the_rollout():
    async def main():
        # (the stand-in answers ids as vLLM does)
        async with stack(adapter="sglang") as (server, gateway):
            policy = gateway.open_rollout("r")
            body = ask(stream=True, stream_options={"include_usage": True})
            status, raw = await post(policy.chat_completions_url, body, token=policy.api_key)
            return status, raw, gateway.pop_trace("r"), server.requests[0].body

    status, raw, trace, sent = run(main)
    assert status == 200
    assert sent["stream"] is False
    assert "stream_options" not in sent
    docs = sse_docs(raw)
    assert raw.endswith(b"data: [DONE]\n\n")
    assert docs[-1]["usage"]["completion_tokens"] > 0
    calls = [c for d in docs for ch in d["choices"] for c in ch["delta"].get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "multiply"
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "a": 12,
        "b": 7,
    }
    assert [ch["finish_reason"] for d in docs for ch in d["choices"]][-1] == "tool_calls"
    assert all("token_ids" not in ch and ch["logprobs"] is None for d in docs for ch in d["choices"])
    assert all("prompt_token_ids" not in d for d in docs)
    assert trace.complete
    assert trace.calls[0].stream is True
    assert list(trace.calls[0].prompt_token_ids) == render_prompt(QUESTION)


def test_a_refused_call_is_refused_from_its_head_and_a_call_still_coming_when_the_trace_is_taken_is_cancelled():
    async def main():
        async with stack() as (server, gateway):
            policy = gateway.open_rollout("r-1")
            port = int(gateway.url.split(":")[2].split("/")[0])
            body = json.dumps(ask()).encode()
            head = (
                f"POST /v1/rollouts/r-1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nAuthorization: Bearer {{}}\r\nConnection: close\r\n\r\n"
            )
            # a forged token: refused before the body is read (it never reaches the upstream)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head.format("forged").encode() + body)
            assert (await reader.read()).startswith(b"HTTP/1.1 403 ")
            writer.close()
            # the rollout's own token, then its trace is taken before the body is all there
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head.format(policy.api_key).encode() + body[:10])
            await writer.drain()
            await asyncio.sleep(0.1)
            trace = gateway.pop_trace("r-1")
            assert await asyncio.wait_for(reader.read(), 5) == b""  # the call is cancelled: no answer
            writer.close()
            assert server.requests_for("r-1") == []
            return trace

    trace = run(main)
    (call,) = trace.calls  # the call had begun: the trace says it was cut short, not complete
    assert call.status == "cancelled"
    assert not trace.complete


def test_an_escaped_key_in_an_error_body_is_found_and_the_body_stays_json():
    escaped = "".join(f"\\u{ord(c):04x}" for c in UPSTREAM_KEY).encode()  # as a JSON encoder may write it

    async def unauthorized(request: bytes, writer: asyncio.StreamWriter) -> bool:
        body = b'{"error": {"message": "bad key ' + escaped + b' given", "code": 401}}'
        head = b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        writer.write(head % len(body) + body)
        await writer.drain()
        return True

    async def main():
        server, url, _ = await raw_upstream(unauthorized)
        try:
            return await call_through(url, ask(), api_key=UPSTREAM_KEY)
        finally:
            server.close()

    status, raw, trace = run(main)
    assert status == 401
    message = json.loads(raw)["error"]["message"]  # the body is still JSON
    assert message.startswith("bad key ")
    assert leaks(message) == []
    assert trace.calls[0].status == "upstream_error"
