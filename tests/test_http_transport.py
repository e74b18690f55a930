"""Tests for osmosis_core.http: PooledTransport and shared_client, against real local servers."""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import socket
import ssl
import subprocess
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from osmosis_core.http import PooledTransport, aclose_shared_client, shared_client

SECRET = "sk-very-secret-api-key-123"


def run(coro_fn: Callable[[], Awaitable[None]], limit: float = 5.0) -> None:
    """Run an async test body on a fresh event loop, with an overall time limit."""

    async def main() -> None:
        async with asyncio.timeout(limit):
            await coro_fn()

    asyncio.run(main())


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes] | None:
    """Read one HTTP/1.1 request; None when the client closed the connection first."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.split(b"\r\n")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
    body = b""
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    elif headers.get(b"transfer-encoding") == b"chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            body += await reader.readexactly(size)
            assert await reader.readexactly(2) == b"\r\n"
    return lines[0], headers, body


def response(body: bytes = b"ok", status: str = "200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s\r\n%s" % (status.encode(), len(body), extra, body)


Handler = Callable[["Server", asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Server:
    """A raw asyncio HTTP server on 127.0.0.1 driven by a per-connection handler."""

    def __init__(self, handler: Handler, ssl_context: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.ssl_context = ssl_context
        self.connections = 0
        self.requests: list[tuple[bytes, dict[bytes, bytes], bytes]] = []
        self.closed_by_client: list[int] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._on_connection, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.connections += 1
        index = self.connections
        try:
            await self.handler(self, reader, writer, index)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a cancelled handler (server shutdown) must not be logged as an error
        finally:
            self.tasks.discard(task)
            writer.transport.abort()

    async def next_request(self, reader: asyncio.StreamReader) -> bool:
        request = await read_request(reader)
        if request is None:
            return False
        self.requests.append(request)
        return True

    async def wait_eof(self, reader: asyncio.StreamReader, index: int) -> None:
        """Wait until the client closes the connection, and record it."""
        while await reader.read(1024):
            pass
        self.closed_by_client.append(index)


async def keepalive_echo(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
    while await server.next_request(reader):
        writer.write(response(server.requests[-1][2] or b"ok"))
        await writer.drain()


async def wait_until(predicate: Callable[[], bool], limit: float = 2.0) -> None:
    async with asyncio.timeout(limit):
        while not predicate():
            await asyncio.sleep(0.005)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- bodies ------------------------------------------------------------------------------------


def test_content_length_body_and_headers() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.next_request(reader):
            body = json.dumps({"echo": json.loads(server.requests[-1][2])}).encode()
            extra = (
                b"Content-Type: application/json\r\nX-Folded: first\r\n  second\r\n"
                b"set-cookie: a=1\r\nSet-Cookie: b=2\r\n"
            )
            writer.write(response(body, "201 Created", extra))
            await writer.drain()

    async def main() -> None:
        transport = PooledTransport()
        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            resp = await client.post(server.url + "/v1/chat?x=1", json={"q": "hi"}, headers={"X-Test": "yes"})
            assert resp.status_code == 201
            assert resp.json() == {"echo": {"q": "hi"}}
            assert resp.headers["x-folded"] == "first second"
            assert resp.headers.get_list("set-cookie") == ["a=1", "b=2"]
            assert resp.extensions["http_version"] == b"HTTP/1.1"
            assert resp.reason_phrase == "Created"
            request_line, headers, _ = server.requests[0]
            assert request_line == b"POST /v1/chat?x=1 HTTP/1.1"
            assert headers[b"host"] == f"127.0.0.1:{server.port}".encode()
            assert headers[b"x-test"] == b"yes"
            assert headers[b"content-length"] == str(len(b'{"q":"hi"}')).encode()
            assert transport.num_idle_connections == 1

    run(main)


def test_chunked_body_streams_incrementally_with_trailers() -> None:
    first_seen = asyncio.Event()

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.next_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"a\r\ndata: one\n\r\n")
            await writer.drain()
            await first_seen.wait()  # the client must see chunk 1 before chunk 2 exists
            first_seen.clear()
            writer.write(b"B;ext=1\r\ndata: two\n\n\r\n0\r\nX-Trailer: t\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        transport = PooledTransport()
        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            for _ in range(2):
                chunks = []
                async with client.stream("GET", server.url + "/sse") as resp:
                    async for chunk in resp.aiter_raw():
                        chunks.append(chunk)
                        first_seen.set()
                assert b"".join(chunks) == b"data: one\ndata: two\n\n"
                assert chunks[0] == b"data: one\n"
                assert transport.num_idle_connections == 1
            assert server.connections == 1

    run(main)


def test_read_until_close_body() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    async def main() -> None:
        transport = PooledTransport()
        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            resp = await client.get(server.url)
            assert resp.content == b"all of it"
            assert transport.num_connections == 0
            assert (await client.get(server.url)).content == b"all of it"
            assert server.connections == 2

    run(main)


def test_head_and_204_have_no_body_and_keep_the_connection() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.next_request(reader):
            line = server.requests[-1][0]
            if line.startswith(b"HEAD"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
            elif b"/empty" in line:
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            else:
                writer.write(response(b"hello"))
            await writer.drain()

    async def main() -> None:
        async with Server(handler) as server, httpx.AsyncClient(transport=PooledTransport()) as client:
            head = await client.head(server.url)
            assert head.status_code == 200 and head.content == b""
            empty = await client.get(server.url + "/empty")
            assert empty.status_code == 204 and empty.content == b""
            assert (await client.get(server.url)).content == b"hello"
            assert server.connections == 1

    run(main)


def test_streaming_request_body_is_sent_chunked() -> None:
    async def main() -> None:
        async def parts() -> AsyncIterator[bytes]:
            yield b"abc"
            yield b""
            yield b"def"

        async with Server(keepalive_echo) as server, httpx.AsyncClient(transport=PooledTransport()) as client:
            resp = await client.post(server.url, content=parts())
            assert resp.content == b"abcdef"
            assert server.requests[0][1][b"transfer-encoding"] == b"chunked"

    run(main)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make a certificate")
def test_https_uses_sni_and_one_lazy_ssl_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
    command += ["-addext", "subjectAltName=DNS:localhost"]
    subprocess.run(command, check=True, capture_output=True)
    real_create_default_context = ssl.create_default_context
    created: list[ssl.SSLContext] = []

    def create_default_context(*args: object, **kwargs: object) -> ssl.SSLContext:
        context = real_create_default_context(cafile=str(cert))  # trust the test certificate
        created.append(context)
        return context

    monkeypatch.setattr(ssl, "create_default_context", create_default_context)
    transport = PooledTransport()
    assert created == []  # nothing built eagerly

    server_names: list[str | None] = []
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)

    def record_sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        server_names.append(name)

    server_context.sni_callback = record_sni

    async def main() -> None:
        async with (
            Server(keepalive_echo, server_context) as server,
            httpx.AsyncClient(transport=transport) as client,
        ):
            url = f"https://localhost:{server.port}/"
            for i in range(3):
                assert (await client.post(url, content=b"tls%d" % i)).content == b"tls%d" % i
            assert server.connections == 1
            assert len(created) == 1
            assert server_names == ["localhost"]

    run(main)


# -- keep-alive -------------------------------------------------------------------------------


def test_keepalive_reuses_one_connection() -> None:
    async def main() -> None:
        transport = PooledTransport()
        async with Server(keepalive_echo) as server, httpx.AsyncClient(transport=transport) as client:
            for i in range(10):
                resp = await client.post(server.url, content=b"n%d" % i)
                assert resp.content == b"n%d" % i
            assert server.connections == 1
            assert transport.num_connections == transport.num_idle_connections == 1
        assert transport.num_connections == 0

    run(main)


def test_idle_connection_closed_by_server_is_replaced() -> None:
    async def one_per_connection(
        server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int
    ) -> None:
        await server.next_request(reader)
        writer.write(response())
        await writer.drain()
        writer.close()  # idle close, without a Connection: close header

    async def main() -> None:
        async with (
            Server(one_per_connection) as server,
            httpx.AsyncClient(transport=PooledTransport()) as client,
        ):
            for pause in (0.05, 0.0, 0.05, 0.0):
                assert (await client.post(server.url, content=b"x")).content == b"ok"
                await asyncio.sleep(pause)
            assert server.connections == 4

    run(main)


def test_stale_reused_connection_is_retried_once() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await server.next_request(reader)
        writer.write(response(b"first"))
        await writer.drain()
        if index == 1:
            await server.next_request(reader)  # reused connection: read the request, then drop it
            return
        while await server.next_request(reader):
            writer.write(response(server.requests[-1][2]))
            await writer.drain()

    async def main() -> None:
        transport = PooledTransport()
        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            assert (await client.post(server.url, content=b"one")).content == b"first"
            assert (await client.post(server.url, content=b"two")).content == b"first"
            assert server.connections == 2
            assert [r[2] for r in server.requests] == [b"one", b"two", b"two"]
            assert transport.num_connections == 1

    run(main)


def test_stale_connection_with_streaming_body_is_not_retried() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await server.next_request(reader)
        writer.write(response())
        await writer.drain()
        await server.next_request(reader)

    async def main() -> None:
        async def body() -> AsyncIterator[bytes]:
            yield b"not replayable"

        transport = PooledTransport()
        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            await client.get(server.url)
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post(server.url, content=body())
            assert server.connections == 1
            assert transport.num_connections == 0

    run(main)


def test_fresh_connection_failure_is_not_retried() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await server.next_request(reader)  # then close without answering

    async def main() -> None:
        transport = PooledTransport()
        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(httpx.RemoteProtocolError) as info:
                await client.post(server.url, content=b"x", headers={"Authorization": f"Bearer {SECRET}"})
            assert server.connections == 1
            assert f"127.0.0.1:{server.port}" in str(info.value)
            assert SECRET not in str(info.value)
            assert transport.num_connections == 0

    run(main)


def test_connection_close_is_honoured_both_ways() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.next_request(reader):  # keeps the socket open regardless
            extra = b"Connection: close\r\n" if b"/server-close" in server.requests[-1][0] else b""
            writer.write(response(extra=extra))
            await writer.drain()

    async def main() -> None:
        transport = PooledTransport()
        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            await client.get(server.url + "/server-close")
            assert transport.num_connections == 0
            await client.get(server.url + "/server-close")
            assert server.connections == 2
            await client.get(server.url, headers={"Connection": "close"})
            assert transport.num_connections == 0
            assert server.connections == 3
            await client.get(server.url)
            await client.get(server.url)
            assert server.connections == 4

    run(main)


# -- errors and timeouts ------------------------------------------------------------------------


async def never_answer(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
    await server.next_request(reader)
    await server.wait_eof(reader, index)


def test_read_timeout() -> None:
    async def main() -> None:
        transport = PooledTransport()
        async with Server(never_answer) as server, httpx.AsyncClient(transport=transport) as client:
            started = time.monotonic()
            with pytest.raises(httpx.ReadTimeout) as info:
                await client.get(server.url, timeout=httpx.Timeout(5.0, read=0.2))
            assert 0.15 < time.monotonic() - started < 2.0
            assert f"http://127.0.0.1:{server.port}" in str(info.value)
            assert transport.num_connections == 0
            await wait_until(lambda: server.closed_by_client == [1])

    run(main)


def test_connect_refused_error_hides_header_values() -> None:
    async def main() -> None:
        port = free_port()
        async with httpx.AsyncClient(transport=PooledTransport()) as client:
            with pytest.raises(httpx.ConnectError) as info:
                await client.get(f"http://127.0.0.1:{port}/x", headers={"Authorization": f"Bearer {SECRET}"})
        message = str(info.value)
        assert f"http://127.0.0.1:{port}" in message
        assert SECRET not in message
        assert info.value.request.headers["authorization"] == f"Bearer {SECRET}"

    run(main)


def test_malformed_response_is_a_protocol_error() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 OK-ish\r\nContent-Length: 2\r\n\r\nhi")
        await writer.drain()
        await server.wait_eof(reader, 0)

    async def main() -> None:
        async with Server(handler) as server, httpx.AsyncClient(transport=PooledTransport()) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get(server.url)

    run(main)


def test_truncated_body_is_a_protocol_error() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        await writer.drain()

    async def main() -> None:
        transport = PooledTransport()
        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get(server.url)
            assert transport.num_connections == 0

    run(main)


# -- pool limits -------------------------------------------------------------------------------


def test_max_connections_makes_third_request_wait() -> None:
    release = asyncio.Event()

    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.next_request(reader):
            body = server.requests[-1][2]
            await release.wait()
            writer.write(response(body))
            await writer.drain()

    async def main() -> None:
        transport = PooledTransport(max_connections=2)
        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            tasks = [asyncio.create_task(client.post(server.url, content=b"r%d" % i)) for i in range(3)]
            await wait_until(lambda: len(server.requests) == 2)
            await asyncio.sleep(0.1)
            assert len(server.requests) == 2 and server.connections == 2
            assert transport.num_connections == 2
            release.set()
            results = await asyncio.gather(*tasks)
            assert sorted(r.content for r in results) == [b"r0", b"r1", b"r2"]
            assert server.connections == 2
            # Pool timeout when every slot stays busy.
            release.clear()
            hold = [asyncio.create_task(client.get(server.url)) for _ in range(2)]
            await wait_until(lambda: len(server.requests) == 5)
            with pytest.raises(httpx.PoolTimeout):
                await client.get(server.url, timeout=httpx.Timeout(5.0, pool=0.1))
            release.set()
            await asyncio.gather(*hold)
            assert transport.num_connections == 2

    run(main)


def test_partially_read_stream_close_does_not_pool_connection() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        if index > 1:
            return await keepalive_echo(server, reader, writer, index)
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await writer.drain()
        await server.wait_eof(reader, index)

    async def main() -> None:
        transport = PooledTransport()
        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            async with client.stream("GET", server.url) as resp:
                async for chunk in resp.aiter_raw():
                    assert chunk == b"0123456789"
                    break
            assert transport.num_connections == 0
            assert transport.num_idle_connections == 0
            await wait_until(lambda: server.closed_by_client == [1])
            assert (await client.get(server.url)).content == b"ok"
            assert server.connections == 2

    run(main)


def test_cancellation_mid_request_closes_connection() -> None:
    async def main() -> None:
        transport = PooledTransport()
        async with Server(never_answer) as server, httpx.AsyncClient(transport=transport) as client:
            task = asyncio.create_task(client.post(server.url, content=b"x"))
            await wait_until(lambda: len(server.requests) == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert transport.num_connections == 0
            await wait_until(lambda: server.closed_by_client == [1])

    run(main)


def test_cancellation_mid_body_closes_connection() -> None:
    async def handler(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await server.wait_eof(reader, index)

    async def main() -> None:
        transport = PooledTransport()
        got_first = asyncio.Event()

        async def consume() -> None:
            async with client.stream("GET", server.url) as resp:
                async for _ in resp.aiter_raw():
                    got_first.set()

        async with Server(handler) as server, httpx.AsyncClient(transport=transport) as client:
            task = asyncio.create_task(consume())
            await got_first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert transport.num_connections == 0
            await wait_until(lambda: server.closed_by_client == [1])

    run(main)


# -- shared client ----------------------------------------------------------------------------


def test_shared_client_per_loop() -> None:
    with pytest.raises(RuntimeError, match="running event loop"):
        shared_client()

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def in_loop() -> tuple[httpx.AsyncClient, float]:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        started = time.perf_counter()
        client = shared_client()
        elapsed = time.perf_counter() - started
        assert shared_client() is client
        assert isinstance(client._transport, PooledTransport)
        async with Server(keepalive_echo) as server:
            assert (await client.get(server.url)).content == b"ok"
        return client, elapsed

    first, first_elapsed = asyncio.run(in_loop())
    second, _ = asyncio.run(in_loop())
    assert first is not second
    assert first_elapsed < 0.005, f"shared_client() construction took {first_elapsed * 1000:.1f} ms"
    # asyncio.run finalizes async generators before closing the loop, which closes the client
    # and forgets it, so the closed loops can be garbage-collected.
    assert first.is_closed and second.is_closed
    del first, second
    gc.collect()
    assert [ref() for ref in loops] == [None, None]


def test_aclose_shared_client() -> None:
    async def main() -> None:
        client = shared_client()
        await aclose_shared_client()
        assert client.is_closed
        replacement = shared_client()
        assert replacement is not client and not replacement.is_closed
        await replacement.aclose()  # closed by its user: replaced on the next call
        assert shared_client() is not replacement
        await aclose_shared_client()
        await aclose_shared_client()  # no client: a no-op

    run(main)
