"""The lean client for whole answers from a plain-http upstream, against a real HTTP server on
127.0.0.1 that answers each way an upstream may (length, chunked, closed, gzip, kept alive or not)."""

from __future__ import annotations

import asyncio
import gzip

import pytest
import uvloop

from osmosis_core.plugin import ResponseTooLarge
from osmosis_gateway.upstream import UpstreamUnreachable, WholeAnswerClient

BODY = b'{"choices":[{"message":{"role":"assistant","content":"84"}}]}'


async def serve(answer):
    """A server that reads each request and writes ``answer(n, request_bytes)`` (bytes, or None to
    close without answering); returns (server, port, seen requests, connections made)."""
    seen: list[bytes] = []
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
                )
                request = head + await reader.readexactly(length)
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
        client = WholeAnswerClient(f"http://127.0.0.1:{port}/v1/chat/completions", {"Authorization": "Bearer k"})
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
        client = WholeAnswerClient(f"http://127.0.0.1:{port}/v1", {})
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
        client = WholeAnswerClient(f"http://127.0.0.1:{port}/v1", {})
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


def test_refusals_unreachable_too_large_cut_and_a_line_break_in_an_id():
    async def main():
        dead = WholeAnswerClient("http://127.0.0.1:9/v1", {})
        with pytest.raises(UpstreamUnreachable, match=r"cannot connect to 127\.0\.0\.1:9"):
            await dead.post("r", b"{}")
        cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"  # promised 100 bytes, sends 18
        server, port, _, _ = await serve(lambda n, _: ok(b"x" * 2000) if n == 1 else cut + b"Connection: close")
        small = WholeAnswerClient(f"http://127.0.0.1:{port}/v1", {}, max_bytes=1000)
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
