"""The gateway's HTTP server (osmosis_gateway.server) over real sockets: framing, keep-alive,
pipelining, limits, streams, drops, cuts, a failing handler, idle and stalled connections, clients
that do not read, and closing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import uvloop

from osmosis_gateway import server as server_module
from osmosis_gateway.server import HttpServer, Request, Response, StreamResponse

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[None]], None]:
    """Runs a test's coroutine on asyncio's loop, then on uvloop's (``osmosis gateway`` runs on uvloop)."""
    return asyncio.run if request.param == "asyncio" else uvloop.run  # type: ignore[return-value]


Handler = Callable[[Request], Awaitable[Response | StreamResponse]]


async def echo(request: Request) -> Response | StreamResponse:
    if request.path == "/boom":
        raise RuntimeError("the handler broke")
    if request.path == "/stream":
        stream = StreamResponse(200, content_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        await stream.prepare(request)
        for n in range(3):
            await stream.write(b"data: %d\n\n" % n)
        await stream.write_eof()
        return stream
    if request.path == "/cut":
        stream = StreamResponse(200, content_type="text/event-stream")
        await stream.prepare(request)
        await stream.write(b"data: 0\n\n")
        await asyncio.sleep(0.05)
        return stream.cut()
    if request.path == "/half":
        stream = StreamResponse(200)
        await stream.prepare(request)
        await stream.write(b"data: 0\n\n")
        raise RuntimeError("the handler broke mid-stream")
    if request.path == "/drop":
        return request.drop()
    if request.path == "/slow":
        await asyncio.sleep(0.2)
    text = f"{request.method} {request.path}?{request.query} {request.headers.get('x-name', '-')} {len(request.body)}"
    return Response(200, text.encode(), content_type="text/plain")


@asynccontextmanager
async def serving(handler: Handler = echo, max_body: int = 1000) -> AsyncIterator[HttpServer]:
    server = await HttpServer(handler, max_body=max_body).start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.close()


async def exchange(port: int, data: bytes, *, until_close: bool = True, wait: float = 0.5) -> bytes:
    """Send raw bytes; what came back before the server closed (or ``wait`` passed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    received = b""
    try:
        async with asyncio.timeout(wait if not until_close else 10):
            while chunk := await reader.read(65536):
                received += chunk
    except TimeoutError:
        pass
    writer.close()
    return received


def rss_mib() -> float:
    """This process's resident memory."""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def post(path: str, body: bytes = b"", extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def test_keep_alive_pipelining_order_and_connection_close(run: Callable[[Awaitable[None]], None]) -> None:
    async def main() -> None:
        async with serving() as server:
            assert server.port is not None
            # three requests in one write: answered in order; the last asks to close
            data = (
                post("/slow", b"ab") + post("/b?q=1", b"", "X-Name: n\r\n") + post("/c", b"x", "Connection: close\r\n")
            )
            received = await exchange(server.port, data)
            answers = received.split(b"HTTP/1.1 ")[1:]
            assert [a.split(b"\r\n\r\n", 1)[1] for a in answers] == [
                b"POST /slow? - 2",
                b"POST /b?q=1 n 0",
                b"POST /c? - 1",
            ]
            assert b"Connection: close" in answers[2]
            assert b"Connection: close" not in answers[0]
            async with httpx.AsyncClient() as client:  # a client's kept-alive connection serves many calls
                for n in range(5):
                    reply = await client.post(f"http://127.0.0.1:{server.port}/p{n}", content=b"z" * n)
                    assert reply.text == f"POST /p{n}? - {n}"
                    assert reply.headers["date"]
                assert len(server.connections) == 1

    run(main())


def test_chunked_body_expect_continue_head_and_http_1_0(run: Callable[[Awaitable[None]], None]) -> None:
    async def main() -> None:
        async with serving() as server:
            assert server.port is not None
            chunked = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            chunked += b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            assert (await exchange(server.port, chunked)).endswith(b"POST /c? - 5")
            # Expect: 100-continue is answered before the body is sent
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"abc")
            assert (await reader.readuntil(b"POST /e? - 3")).startswith(b"HTTP/1.1 200 OK")
            writer.close()
            head = await exchange(server.port, b"HEAD /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK")
            assert b"Content-Length: 12\r\n" in head
            assert head.endswith(b"\r\n\r\n")
            # an HTTP/1.0 client: the answer closes the connection; a stream is not chunked, the close ends it
            old = await exchange(server.port, b"GET /o HTTP/1.0\r\n\r\n")
            assert b"Connection: close" in old
            assert old.endswith(b"GET /o? - 0")
            streamed = await exchange(server.port, b"GET /stream HTTP/1.0\r\n\r\n")
            assert b"Transfer-Encoding" not in streamed
            assert streamed.endswith(b"data: 0\n\ndata: 1\n\ndata: 2\n\n")

    run(main())


def test_limits_and_bad_requests_are_refused_and_close_the_connection(run: Callable[[Awaitable[None]], None]) -> None:
    async def main() -> None:
        async with serving(max_body=10) as server:
            assert server.port is not None
            too_large = await exchange(server.port, post("/l", b"x" * 11))
            assert too_large.startswith(b"HTTP/1.1 413 ")
            assert b"over 10 bytes" in too_large
            chunked = b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"8\r\nabcdefgh\r\n" * 2
            assert (await exchange(server.port, chunked)).startswith(b"HTTP/1.1 413 ")
            huge_header = b"GET /h HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n"
            assert (await exchange(server.port, huge_header)).startswith(b"HTTP/1.1 431 ")
            garbage = await exchange(server.port, b"NOT HTTP AT ALL\r\n\r\n")
            assert garbage.startswith(b"HTTP/1.1 400 ")
            assert b"not an HTTP request" in garbage
            # a request before the bad one is answered first
            both = await exchange(server.port, post("/ok") + b"\x00\x01garbage\r\n\r\n")
            assert both.startswith(b"HTTP/1.1 200 OK")
            assert b"HTTP/1.1 400 " in both

    run(main())


def test_a_failing_handler_gets_500_and_the_connection_goes_on(
    run: Callable[[Awaitable[None]], None], caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with serving() as server, httpx.AsyncClient() as client:
            with caplog.at_level(logging.ERROR, logger="osmosis_gateway.server"):
                reply = await client.post(f"http://127.0.0.1:{server.port}/boom")
            assert reply.status_code == 500
            assert reply.json()["error"]["type"] == "server_error"
            assert "the handler broke" in caplog.text
            assert (await client.post(f"http://127.0.0.1:{server.port}/next")).status_code == 200
            assert server.port is not None
            half = await exchange(server.port, post("/half"))  # cut, not a 500 written into the stream
            assert half.endswith(b"data: 0\n\n\r\n")
            assert b" 500 " not in half

    run(main())


def test_streams_drops_and_cuts(run: Callable[[Awaitable[None]], None]) -> None:
    async def main() -> None:
        async with serving() as server, httpx.AsyncClient() as client:
            base = f"http://127.0.0.1:{server.port}"
            async with client.stream("POST", f"{base}/stream") as reply:
                assert reply.headers["transfer-encoding"] == "chunked"
                assert reply.headers["content-type"] == "text/event-stream"
                assert b"".join([part async for part in reply.aiter_bytes()]) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
            assert (await client.post(f"{base}/after")).text == "POST /after? - 0"  # the stream's connection goes on
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post(f"{base}/drop")
            async with client.stream("POST", f"{base}/cut") as reply:
                with pytest.raises(httpx.RemoteProtocolError):
                    await reply.aread()
            assert (await client.post(f"{base}/again")).status_code == 200

    run(main())


def test_writing_to_a_client_that_hung_up_raises_and_back_pressure_waits(
    run: Callable[[Awaitable[None]], None],
) -> None:
    async def main() -> None:
        outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def firehose(request: Request) -> Response | StreamResponse:
            stream = StreamResponse(200)
            await stream.prepare(request)
            try:
                for _ in range(10_000):
                    await stream.write(b"x" * 65536)  # 640 MB: the client stops reading long before
            except ConnectionResetError as exc:
                outcome.set_result(f"hung up: {exc}")
                return stream
            outcome.set_result("wrote it all")
            await stream.write_eof()
            return stream

        async with serving(firehose) as server:
            assert server.port is not None
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(post("/f"))
            await reader.read(65536)
            await asyncio.sleep(0.3)
            assert not outcome.done()  # waiting for the client, not buffering 640 MB
            writer.transport.abort()
            assert (await asyncio.wait_for(outcome, 10)).startswith("hung up")

    run(main())


def test_idle_connections_are_closed_and_close_cuts_calls_in_flight(
    run: Callable[[Awaitable[None]], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        monkeypatch.setattr(server_module, "IDLE_SEC", 0.2)
        started = asyncio.Event()

        async def hang(request: Request) -> Response:
            started.set()
            await asyncio.sleep(60)
            return Response(200)

        server = await HttpServer(hang, max_body=10).start("127.0.0.1", 0)
        assert server.port is not None
        port = server.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # idle, never sent a request: closed
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/h"))
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.sleep(0.4)  # a call in flight is not idle
        assert len(server.connections) == 1
        assert len(server.tasks) == 1
        await asyncio.wait_for(server.close(), 5)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert not server.tasks
        assert not server.connections
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)
        writer.close()

    run(main())


def test_a_client_stalled_mid_request_is_closed(
    run: Callable[[Awaitable[None]], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        monkeypatch.setattr(server_module, "IDLE_SEC", 0.2)
        async with serving() as server:
            assert server.port is not None
            for partial in (b"GET /h HTTP/1.1\r\nHo", post("/b", b"0123456789")[:-5]):  # in the head, in the body
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(partial)
                assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()

    run(main())


def test_an_endless_header_line_or_trailer_is_refused_not_buffered(run: Callable[[Awaitable[None]], None]) -> None:
    async def endless(writer: asyncio.StreamWriter) -> None:
        for _ in range(1024):  # 64 MiB
            writer.write(b"a" * 65536)
            await writer.drain()

    async def main() -> None:
        async with serving() as server:
            assert server.port is not None
            trailer = b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nX-T: "
            for head in (b"GET /h HTTP/1.1\r\nHost: x\r\nX-Big: ", b"GET /h HTTP/1.1\r\nX-", trailer):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(head)
                before = rss_mib()
                await endless(writer)  # refused after 64 KiB: the rest is read and dropped, never held
                assert rss_mib() - before < 32
                assert (await reader.read(65536)).startswith(b"HTTP/1.1 431 ")
                writer.transport.abort()
            # trailers are not headers
            chunked = b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            chunked += b"1\r\na\r\n0\r\nX-Name: trailer\r\n\r\n"
            assert (await exchange(server.port, chunked)).endswith(b"POST /t? - 1")

    run(main())


def test_expect_continue_behind_a_request_being_answered_waits_its_turn(
    run: Callable[[Awaitable[None]], None],
) -> None:
    async def main() -> None:
        async with serving() as server:
            assert server.port is not None
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(post("/slow") + post("/e", b"abc", "Expect: 100-continue\r\n")[:-3])
            first = await asyncio.wait_for(reader.readuntil(b"POST /slow? - 0"), 5)
            assert first.startswith(b"HTTP/1.1 200 OK")  # not the 100 Continue into the answer before it
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"abc")
            assert (await asyncio.wait_for(reader.readuntil(b"POST /e? - 3"), 5)).startswith(b"HTTP/1.1 200 OK")
            writer.close()
            # an HTTP/1.0 client gets no 100 Continue
            old = await exchange(server.port, b"POST /o HTTP/1.0\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\nz")
            assert old.startswith(b"HTTP/1.1 200 OK")

    run(main())


def test_an_answer_that_cannot_be_written_gets_500(
    run: Callable[[Awaitable[None]], None], caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async def euro(request: Request) -> Response:
            return Response(200, b"x", headers={"X-Price": "5 \u20ac"})

        async with serving(euro) as server:
            assert server.port is not None
            with caplog.at_level(logging.ERROR):
                answer = await exchange(server.port, post("/e", extra="Connection: close\r\n"))
            assert answer.startswith(b"HTTP/1.1 500 ")
            assert "cannot be written" in caplog.text
            assert "never retrieved" not in caplog.text

    run(main())


def test_a_client_that_does_not_read_is_not_buffered_for_and_close_ends_it(
    run: Callable[[Awaitable[None]], None],
) -> None:
    async def main() -> None:
        async def big(request: Request) -> Response:
            return Response(200, b"y" * (1 << 20))

        async with serving(big) as server:
            assert server.port is not None
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(post("/b") * 200)  # 200 MiB of answers asked for, none read
            await asyncio.sleep(0.5)
            (connection,) = server.connections
            assert connection.transport is not None
            assert connection.transport.get_write_buffer_size() < 8 << 20
            await asyncio.wait_for(server.close(), 1)  # not waiting on the client
            assert not server.connections
            writer.transport.abort()

    run(main())


def test_a_client_sending_a_body_too_large_reads_the_413(run: Callable[[Awaitable[None]], None]) -> None:
    async def main() -> None:  # (closing at once would reset the connection under the body still coming)
        async with serving(max_body=1 << 20) as server, httpx.AsyncClient() as client:
            for _ in range(3):
                reply = await client.post(f"http://127.0.0.1:{server.port}/big", content=b"x" * (20 << 20))
                assert reply.status_code == 413
                assert "over 1048576 bytes" in reply.json()["error"]["message"]

    run(main())


def test_a_precheck_answers_from_the_head_and_the_body_is_never_held(run: Callable[[Awaitable[None]], None]) -> None:
    handled: list[str] = []

    async def handler(request: Request) -> Response:
        handled.append(request.path)
        return Response(200, b"ok")

    def precheck(method: str, path: str, headers: dict[str, str]) -> Response | None:
        return Response(401, b"no") if path == "/locked" and headers.get("authorization") != "Bearer k" else None

    async def main() -> None:
        server = await HttpServer(handler, max_body=64 << 20, precheck=precheck).start("127.0.0.1", 0)
        try:
            async with httpx.AsyncClient() as client:
                base = f"http://127.0.0.1:{server.port}"
                chunks = iter([b"y" * (1 << 20)] * 8)

                async def body() -> AsyncIterator[bytes]:
                    for piece in chunks:
                        # the body read so far is dropped, not held
                        assert all(len(b"".join(c.body)) == 0 for c in server.connections)
                        yield piece

                assert (await client.post(f"{base}/locked", content=body())).status_code == 401
                assert (await client.post(f"{base}/locked", headers={"Authorization": "Bearer k"})).text == "ok"
                assert (await client.post(f"{base}/open", content=b"z")).text == "ok"
                assert len(server.connections) == 1  # a refusal from the head keeps the connection
        finally:
            await server.close()
        assert handled == ["/locked", "/open"]

    run(main())


def test_http_1_0_keep_alive_utf8_headers_and_a_byte_cap_on_read_ahead(run: Callable[[Awaitable[None]], None]) -> None:
    async def main() -> None:
        async with serving(max_body=4 << 20) as server:
            assert server.port is not None
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\nX-Name: \xc3\xa9t\xc3\xa9\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"Connection: keep-alive\r\n" in head
            assert await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])) == (
                "GET /a? été 0".encode()
            )
            # two 1.5 MiB bodies behind a slow request: reading stops until they are answered
            writer.write(post("/slow") + post("/b", b"b" * (3 << 19)) + post("/c", b"c" * (3 << 19)))
            await asyncio.sleep(0.1)
            assert [c.reading_paused for c in server.connections] == [True]
            writer.write_eof()
            answers = (await reader.read()).split(b"HTTP/1.1 200 OK")
            assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers[1:]] == [
                b"POST /slow? - 0",
                b"POST /b? - 1572864",
                b"POST /c? - 1572864",
            ]
            writer.close()

    run(main())
