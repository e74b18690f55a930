"""The lean client for a plain-http upstream (whole answers and streams), against a real HTTP server on
127.0.0.1 that answers each way an upstream may (length, chunked, closed, gzip, kept alive or not)."""

from __future__ import annotations

import asyncio
import gzip
from contextlib import asynccontextmanager

import pytest
import uvloop

from osmosis_core.plugin import ResponseTooLarge
from osmosis_gateway import upstream
from osmosis_gateway.upstream import UpstreamClient, UpstreamUnreachable

BODY = b'{"choices":[{"message":{"role":"assistant","content":"84"}}]}'


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request with a Content-Length, head and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
    return head + await reader.readexactly(length)


async def serve(answer):
    """A server that reads each request and writes ``answer(n, request_bytes)`` (bytes, or None to
    close without answering); returns (server, port, seen requests, connections made)."""
    seen: list[bytes] = []
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                request = await read_request(reader)
                seen.append(request)
                out = answer(len(seen), request)
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
                if b"Connection: close" in out or (b"Content-Length" not in out and b"chunked" not in out):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen, connections


def ok(body: bytes = BODY, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n%s"
        % (
            len(body),
            body,
        )
    )


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_run(request):
    return asyncio.run if request.param == "asyncio" else uvloop.run


def test_answers_come_whole_on_one_kept_alive_connection_with_the_headers_sent(loop_run):
    async def main():
        server, port, seen, connections = await serve(lambda n, _: ok(b'{"n":%d}' % n))
        client = UpstreamClient(f"http://127.0.0.1:{port}/v1/chat/completions", {"Authorization": "Bearer k"})
        try:
            answers = [await client.post(f"r-{i}", b'{"i":%d}' % i) for i in range(3)]
        finally:
            client.close()
            server.close()
        return answers, seen, connections

    answers, seen, connections = loop_run(main())
    assert answers == [(200, "application/json", b'{"n":%d}' % n) for n in (1, 2, 3)]
    assert len(connections) == 1  # kept alive
    assert seen[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Authorization: Bearer k\r\n" in seen[0]
    assert b"X-Osmosis-Rollout-Id: r-0\r\n" in seen[0]
    assert seen[2].endswith(b'\r\n\r\n{"i":2}')


def test_chunked_closed_and_gzip_answers_read_the_same(loop_run):
    chunked = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (BODY[:10], BODY[10:])) + b"0\r\n\r\n"
    closed = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + BODY  # ended by the close
    zipped = ok(gzip.compress(BODY), b"Content-Encoding: gzip\r\n")
    answers = {1: chunked, 2: closed, 3: zipped}

    async def main():
        server, port, _, connections = await serve(lambda n, _: answers[n])
        client = UpstreamClient(f"http://127.0.0.1:{port}/v1", {})
        try:
            return [await client.post("r", b"{}") for _ in range(3)], connections
        finally:
            client.close()
            server.close()

    got, connections = loop_run(main())
    assert [content for _, _, content in got] == [BODY, BODY, BODY]
    assert len(connections) == 2  # the close-delimited answer ended its connection


def test_a_kept_alive_connection_closed_before_answering_is_retried_once_on_a_new_one(loop_run):
    async def main():
        # the second request's connection is closed unanswered (an upstream's idle timeout)
        server, port, seen, connections = await serve(lambda n, _: None if n == 2 else ok())
        client = UpstreamClient(f"http://127.0.0.1:{port}/v1", {})
        try:
            first = await client.post("r", b"{}")
            second = await client.post("r", b"{}")
        finally:
            client.close()
            server.close()
        return first, second, len(seen), len(connections)

    first, second, requests, connections = loop_run(main())
    assert first == second == (200, "application/json", BODY)
    assert (requests, connections) == (3, 2)


def test_a_call_the_upstream_had_a_while_before_dropping_it_is_not_sent_twice(loop_run, monkeypatch):
    monkeypatch.setattr(upstream, "RETRY_WINDOW_SEC", 0.1)

    async def script(n, writer):
        if n == 2:  # took the call, worked on it, then dropped the connection
            await asyncio.sleep(0.3)
            return False
        writer.write(ok())
        return True

    async def main():
        async with scripted_client(script) as (client, connections):
            await client.post("r", b"{}")
            with pytest.raises(ConnectionError):
                await client.post("r", b"{}")
        return script.n, len(connections)

    assert loop_run(main()) == (2, 1)  # the second call went once


def test_an_upstream_url_with_credentials_is_left_to_aiohttps_client():
    with pytest.raises(ValueError, match="without credentials"):
        UpstreamClient("http://user:secret@127.0.0.1:8000/v1/chat/completions", {})


def test_refusals_unreachable_too_large_cut_and_a_line_break_in_an_id():
    async def main():
        dead = UpstreamClient("http://127.0.0.1:9/v1", {})
        with pytest.raises(UpstreamUnreachable, match=r"cannot connect to 127\.0\.0\.1:9"):
            await dead.post("r", b"{}")
        cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"  # promised 100 bytes, sends 18
        server, port, _, _ = await serve(lambda n, _: ok(b"x" * 2000) if n == 1 else cut + b"Connection: close")
        small = UpstreamClient(f"http://127.0.0.1:{port}/v1", {}, max_bytes=1000)
        try:
            with pytest.raises(ResponseTooLarge):
                await small.post("r", b"{}")
            with pytest.raises(ConnectionError):
                await small.post("r", b"{}")
            with pytest.raises(ValueError, match="line break"):
                await small.post("r\r\nX-Evil: 1", b"{}")
        finally:
            small.close()
            server.close()

    asyncio.run(main())


# -- streamed answers ------------------------------------------------------------------------------

EVENTS = [b'data: {"n":%d}\n\n' % i for i in range(4)] + [b"data: [DONE]\n\n"]
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@asynccontextmanager
async def scripted_client(script, **options):
    """A server that reads each request and runs ``await script(n, writer)`` (n counts requests;
    a false result closes the connection), and a client of it; yields (client, connections made)
    and closes both."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                await read_request(reader)
                script.n += 1
                if not await script(script.n, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    script.n = 0
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    client = UpstreamClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", {}, **options)
    try:
        yield client, connections
    finally:
        client.close()
        server.close()


async def take_all(answer, got: list[bytes]) -> None:
    """Each piece of a streamed answer into ``got`` (what came before a failure stays there)."""
    async for piece in answer:
        got.append(piece)


async def events_slowly(writer: asyncio.StreamWriter, *, end: bool = True, pause: float = 0.03) -> None:
    writer.write(STREAM_HEAD)
    for event in EVENTS:
        writer.write(chunk(event))
        await writer.drain()
        await asyncio.sleep(pause)
    if end:
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def test_a_stream_comes_in_pieces_in_order_and_its_connection_is_kept_after_a_clean_end(loop_run):
    async def script(n, writer):
        if n == 1:
            await events_slowly(writer)
        else:
            writer.write(ok())
        return True

    async def main():
        async with scripted_client(script) as (client, connections):
            answer = await client.stream("r", b"{}")
            try:
                head = (answer.status, answer.content_type)
                pieces = [piece async for piece in answer]
            finally:
                answer.close()
            after = await client.post("r", b"{}")
        return head, pieces, after, len(connections)

    head, pieces, after, connections = loop_run(main())
    assert head == (200, "text/event-stream")
    assert b"".join(pieces) == b"".join(EVENTS)
    assert len(pieces) >= 3  # as they came, not whole at the end
    assert after == (200, "application/json", BODY)
    assert connections == 1  # kept alive after the clean end


def test_a_stream_cut_mid_answer_raises_and_an_abandoned_one_is_not_reused(loop_run):
    async def script(n, writer):
        if n == 1:
            await events_slowly(writer, end=False)
            return False  # cut: the close before the last chunk
        if n == 2:
            await events_slowly(writer, pause=0.1)  # abandoned by the client after its first piece
            return True
        writer.write(ok())
        return True

    async def main():
        got: list[bytes] = []
        async with scripted_client(script) as (client, connections):
            answer = await client.stream("r", b"{}")
            try:
                with pytest.raises(ConnectionError, match="mid-answer"):
                    await take_all(answer, got)
            finally:
                answer.close()
            abandoned = await client.stream("r", b"{}")
            try:
                first = await anext(aiter(abandoned))
            finally:
                abandoned.close()
            after = await client.post("r", b"{}")
        return got, first, after, len(connections)

    got, first, after, connections = loop_run(main())
    assert b"".join(got) == b"".join(EVENTS)  # all that came, then the error
    assert first == EVENTS[0]
    assert after == (200, "application/json", BODY)
    assert connections == 3  # the cut one and the abandoned one were not reused


def test_a_slow_consumer_pauses_the_reading_and_gets_the_whole_stream(loop_run):
    big = [bytes([65 + i % 26]) * 65536 for i in range(48)]  # 3 MiB of pieces

    async def script(n, writer):
        writer.write(STREAM_HEAD)
        for piece in big:
            writer.write(chunk(piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def main():
        async with scripted_client(script) as (client, connections):
            answer = await client.stream("r", b"{}")
            try:
                await asyncio.sleep(0.3)  # the consumer falls behind
                waiting, paused = answer._buffered, answer._paused
                body = b"".join([piece async for piece in answer])
            finally:
                answer.close()
            again = await client.stream("r", b"{}")
            again_body = await again.read()
        return waiting, paused, body, again_body, len(connections)

    waiting, paused, body, again_body, connections = loop_run(main())
    assert paused
    assert upstream.PAUSE_BYTES < waiting <= upstream.PAUSE_BYTES + 512 * 1024  # not the whole 3 MiB
    assert body == again_body == b"".join(big)
    assert connections == 1


def test_a_streamed_call_answered_otherwise_is_read_whole_within_the_limit():
    refusal = b'{"error":{"message":"overloaded"}}'

    async def script(n, writer):
        if n == 1:
            writer.write(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(refusal), refusal)
            )
        elif n == 2:
            writer.write(ok(b"x" * 5000))
        else:
            zipped = gzip.compress(b"".join(EVENTS))
            writer.write(STREAM_HEAD.replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n"))
            writer.write(chunk(zipped[:20]) + chunk(zipped[20:]) + b"0\r\n\r\n")
        return True

    async def main():
        async with scripted_client(script, max_bytes=1000) as (client, _):
            refused = await client.stream("r", b"{}")
            got = (refused.status, refused.content_type, await refused.read())
            large = await client.stream("r", b"{}")
            with pytest.raises(ResponseTooLarge):
                await large.read()
            zipped = await client.stream("r", b"{}")
            try:
                inflated = b"".join([piece async for piece in zipped])  # (a stream has no size limit)
            finally:
                zipped.close()
        return got, inflated

    got, inflated = asyncio.run(main())
    assert got == (503, "application/json", refusal)
    assert inflated == b"".join(EVENTS)


def test_a_stream_times_out_between_pieces_not_over_the_whole_answer(monkeypatch):
    monkeypatch.setattr(upstream, "READ_TIMEOUT_SEC", 0.25)

    async def script(n, writer):
        await events_slowly(writer, end=False, pause=0.1)  # 0.5 s in all, a piece each 0.1 s
        await asyncio.sleep(2)  # then nothing
        return False

    async def main():
        got: list[bytes] = []
        async with scripted_client(script) as (client, _):
            answer = await client.stream("r", b"{}")
            try:
                with pytest.raises(TimeoutError):
                    await take_all(answer, got)
            finally:
                answer.close()
        return got

    assert b"".join(asyncio.run(main())) == b"".join(EVENTS)


def test_a_stream_on_a_kept_alive_connection_closed_before_answering_is_retried_once():
    async def script(n, writer):
        if n == 2:
            return False  # the upstream's idle timeout: closed unanswered
        await events_slowly(writer, pause=0)
        return True

    async def main():
        async with scripted_client(script) as (client, connections):
            bodies = []
            for _ in range(2):
                answer = await client.stream("r", b"{}")
                bodies.append(await answer.read())
        return bodies, script.n, len(connections)

    bodies, requests, connections = asyncio.run(main())
    assert bodies == [b"".join(EVENTS)] * 2
    assert (requests, connections) == (3, 2)
