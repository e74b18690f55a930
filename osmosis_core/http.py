"""A lean pooled HTTP/1.1 transport for httpx, built on asyncio streams.

httpx's default ``AsyncClient`` transport (the httpcore connection pool) spends several
milliseconds of CPU per request once a hundred requests are in flight, which caps the
throughput of concurrent agent rollouts well below what the model server can deliver.
:class:`PooledTransport` is a drop-in ``httpx.AsyncBaseTransport`` that speaks plain
HTTP/1.1 over :func:`asyncio.open_connection` with a keep-alive pool, and whose per-request
CPU cost stays roughly flat with concurrency.

:func:`shared_client` hands out one pooled ``httpx.AsyncClient`` per running event loop.

Threading / event loops: a :class:`PooledTransport` (and hence a client built on it)
belongs to the event loop that first uses it. It is not thread-safe, and it must not be
used from two event loops at once; it re-binds to a new loop only once the previous loop
is closed or the pool holds no connection.

Not supported: HTTP/2, proxies, client certificates other than through a custom
``ssl.SSLContext`` passed as ``verify``, ``Expect: 100-continue`` handshakes (the body is
sent straight away) and protocol upgrades (a ``101`` response is returned without a body
and its connection is closed).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import importlib.util
import ssl
import sys
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import httpx

if not TYPE_CHECKING and "__osmosis_httpx__" in globals():
    # This is a copy of the module bound to an httpx-compatible fork (httpx2, which openai 3.x
    # uses); see transport_module(). One source serves both.
    httpx = __osmosis_httpx__  # noqa: F821

__all__ = ["PooledTransport", "aclose_shared_client", "shared_client", "shared_transport", "transport_module"]

_Key = tuple[str, str, int]

_DEFAULT_PORTS: Final[Mapping[str, int]] = {"http": 80, "https": 443}
#: StreamReader limit: the largest accepted response head / chunk-size line. The reader
#: pauses the socket once about twice this much is buffered.
_STREAM_LIMIT: Final = 2**16
#: How much to ask for per read when a body is delimited by the connection closing.
_READ_SIZE: Final = 2**16
_MAX_TRAILER_LINES: Final = 256
_METHODS_WITH_BODY: Final = frozenset({b"POST", b"PUT", b"PATCH"})
_CHUNK_END: Final = b"0\r\n\r\n"

# Body framing of a response.
_NONE: Final = 0
_LENGTH: Final = 1
_CHUNKED: Final = 2
_UNTIL_CLOSE: Final = 3


class _ProtocolError(Exception):
    """The peer sent something that is not valid HTTP/1.1 (mapped to ``RemoteProtocolError``)."""


class _StaleConnection(Exception):
    """A reused keep-alive connection failed before any byte of a response arrived."""

    def __init__(self, error: httpx.TransportError) -> None:
        super().__init__(str(error))
        self.error = error


class _Connection:
    """One TCP (or TLS) connection to an origin, owned by a :class:`PooledTransport`."""

    __slots__ = ("idle_since", "key", "reader", "released", "reused", "writer")

    def __init__(self, key: _Key, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer
        #: True when the connection served a request before (stale keep-alive retry applies).
        self.reused = False
        #: True once the connection's pool slot has been given back (idle, closed or handed on).
        self.released = False
        self.idle_since = 0.0

    def is_usable(self) -> bool:
        """Whether the connection can carry another request (no EOF or error seen)."""
        return not self.reader.at_eof() and self.reader.exception() is None and not self.writer.transport.is_closing()

    def abort(self) -> None:
        """Tear the connection down immediately, discarding anything unsent."""
        with contextlib.suppress(RuntimeError):  # the loop may already be closed
            self.writer.transport.abort()

    def close(self) -> None:
        """Close the connection gracefully (flushes pending writes, TLS close_notify)."""
        with contextlib.suppress(RuntimeError):
            self.writer.close()


def _format_origin(scheme: str, host: str, port: int) -> str:
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def _parse_head(raw: bytes) -> tuple[bytes, int, bytes, list[tuple[bytes, bytes]]]:
    """Parse a response head (status line + header lines, ending in a blank line).

    Returns ``(http_version, status_code, reason_phrase, headers)``. Accepts bare LF line
    endings and obsolete line folding (continuation lines starting with SP/HTAB).
    """
    lines = raw.splitlines()
    if not lines:
        raise _ProtocolError("empty response head")
    version, _, rest = lines[0].partition(b" ")
    status_bytes, _, reason = rest.lstrip(b" ").partition(b" ")
    if not version.startswith(b"HTTP/1.") or len(status_bytes) != 3 or not status_bytes.isdigit():
        raise _ProtocolError("malformed status line")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in (0x20, 0x09):  # obs-fold: continuation of the previous header value
            if not headers:
                raise _ProtocolError("header continuation line without a header")
            name, value = headers[-1]
            headers[-1] = (name, (value + b" " + line.strip(b" \t")).strip(b" \t"))
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name or name[-1] in (0x20, 0x09):
            raise _ProtocolError("malformed header line")
        headers.append((name, value.strip(b" \t")))
    return version, int(status_bytes), reason.strip(), headers


def _parse_chunk_size(line: bytes) -> int:
    size = line.partition(b";")[0].strip()
    if not size or len(size) > 16:
        raise _ProtocolError("malformed chunk size line")
    try:
        return int(size, 16)
    except ValueError:
        raise _ProtocolError("malformed chunk size line") from None


def _tokens(value: bytes) -> set[bytes]:
    return {token.strip() for token in value.lower().split(b",")}


def _map_read_error(exc: BaseException, request: httpx.Request, origin: str, reading: str) -> BaseException:
    """Translate a low-level read failure into the matching httpx exception (or return it)."""
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(f"timed out reading the {reading} from {origin}", request=request)
    if isinstance(exc, asyncio.IncompleteReadError):
        return httpx.RemoteProtocolError(
            f"peer closed the connection while sending the {reading} ({origin})", request=request
        )
    if isinstance(exc, asyncio.LimitOverrunError):
        return httpx.RemoteProtocolError(f"oversized line in the {reading} from {origin}", request=request)
    if isinstance(exc, _ProtocolError):
        return httpx.RemoteProtocolError(f"{exc} in the {reading} from {origin}", request=request)
    if isinstance(exc, OSError):
        return httpx.ReadError(
            f"error reading the {reading} from {origin}: {type(exc).__name__}: {exc}", request=request
        )
    return exc


class _EmptyStream(httpx.AsyncByteStream):
    """The body of a response that has none (HEAD, 1xx, 204, 304, ``Content-Length: 0``)."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Nothing to release: the connection went back to the pool already."""


class _ResponseStream(httpx.AsyncByteStream):
    """A response body read straight off the connection, yielding bytes as they arrive.

    The connection goes back to the pool as soon as the last byte of the body has been read
    (and only then); closing the stream earlier closes the connection instead.
    """

    def __init__(
        self,
        transport: PooledTransport,
        conn: _Connection,
        request: httpx.Request,
        origin: str,
        framing: int,
        length: int,
        keep_alive: bool,
        read_timeout: float | None,
    ) -> None:
        self._transport = transport
        self._conn: _Connection | None = conn
        self._request = request
        self._origin = origin
        self._framing = framing
        #: Bytes left in the body (``_LENGTH``) or in the current chunk (``_CHUNKED``).
        self._remaining = length
        self._need_crlf = False
        self._complete = False
        self._keep_alive = keep_alive
        self._read_timeout = read_timeout

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        if conn is None:
            raise StopAsyncIteration
        try:
            if self._read_timeout is None:
                data = await self._read_step(conn.reader)
            else:
                async with asyncio.timeout(self._read_timeout):
                    data = await self._read_step(conn.reader)
        except BaseException as exc:  # including cancellation: the connection is unusable
            self._conn = None
            self._transport._discard(conn)
            mapped = _map_read_error(exc, self._request, self._origin, "response body")
            if mapped is exc:
                raise
            raise mapped from exc
        if self._complete:
            self._conn = None
            self._transport._release(conn, self._keep_alive)
        if not data:
            raise StopAsyncIteration
        return data

    async def _read_step(self, reader: asyncio.StreamReader) -> bytes:
        """Read the next piece of body; ``b""`` (with ``_complete`` set) at its end."""
        framing = self._framing
        if framing == _LENGTH:
            data = await reader.read(self._remaining)
            if not data:
                raise _ProtocolError(f"peer closed the connection with {self._remaining} bytes of the body missing")
            self._remaining -= len(data)
            if self._remaining == 0:
                self._complete = True
            return data
        if framing == _CHUNKED:
            while True:
                if self._remaining:
                    data = await reader.read(self._remaining)
                    if not data:
                        raise _ProtocolError("peer closed the connection in the middle of a chunk")
                    self._remaining -= len(data)
                    self._need_crlf = self._remaining == 0
                    return data
                if self._need_crlf:
                    if await reader.readexactly(2) != b"\r\n":
                        raise _ProtocolError("malformed chunk terminator")
                    self._need_crlf = False
                size = _parse_chunk_size(await reader.readuntil(b"\r\n"))
                if size == 0:
                    for _ in range(_MAX_TRAILER_LINES):
                        if await reader.readuntil(b"\r\n") == b"\r\n":
                            break
                    else:
                        raise _ProtocolError("too many trailer lines")
                    self._complete = True
                    return b""
                self._remaining = size
        # _UNTIL_CLOSE
        data = await reader.read(_READ_SIZE)
        if not data:
            self._complete = True
        return data

    async def aclose(self) -> None:
        """Close the body; a connection whose body was not read to the end is closed."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            self._transport._discard(conn)


class PooledTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 transport with a keep-alive connection pool, on plain asyncio streams.

    * One pool of idle keep-alive connections per ``(scheme, host, port)``; at most
      ``max_idle_per_host`` idle connections are kept per origin, and an idle connection
      older than ``keepalive_expiry`` seconds is dropped when it would be checked out.
    * At most ``max_connections`` connections exist at once (idle, in use or connecting).
      Further requests wait, first come first served, for a connection or a free slot;
      an idle connection to another origin is closed to make room if needed.
    * ``https`` uses one ``ssl.SSLContext`` per transport, created on first use. ``verify``
      is ``True`` (certifi's CA bundle when installed, else the system store), ``False``
      (no verification) or a ready ``ssl.SSLContext``.
    * Timeouts come from ``request.extensions["timeout"]`` (httpx fills ``connect``,
      ``read``, ``write`` and ``pool`` from the client's ``timeout``); ``read`` applies to
      every read, ``pool`` to the wait for a free connection slot.
    * A reused keep-alive connection that fails before any byte of the response arrived
      (the server closed it while idle) is replaced by a fresh connection and the request
      is sent once more, if its body is replayable (non-streaming). Fresh connections are
      never retried.

    Error messages name the origin (``scheme://host:port``) but never header values.

    A transport belongs to one event loop (see the module docstring) and is not
    thread-safe. Always close streamed responses (``async with client.stream(...)``):
    a response that is never closed keeps its connection slot.
    """

    def __init__(
        self,
        *,
        max_connections: int = 1000,
        max_idle_per_host: int = 256,
        keepalive_expiry: float = 30.0,
        verify: bool | ssl.SSLContext = True,
    ) -> None:
        """Create an empty pool; no connection, SSL context or event loop is touched yet."""
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if max_idle_per_host < 0:
            raise ValueError("max_idle_per_host must not be negative")
        self._max_connections = max_connections
        self._max_idle_per_host = max_idle_per_host
        self._keepalive_expiry = keepalive_expiry
        self._verify = verify
        self._ssl_context: ssl.SSLContext | None = None
        self._idle: dict[_Key, collections.deque[_Connection]] = {}
        #: Connections that exist or are being opened (each holds one slot).
        self._n_connections = 0
        self._waiters: collections.deque[tuple[_Key, asyncio.Future[_Connection | None]]] = collections.deque()
        self._loop_ref: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._closed = False

    # -- public API ---------------------------------------------------------------------

    @property
    def num_connections(self) -> int:
        """Connections currently open or being opened (idle ones included)."""
        return self._n_connections

    @property
    def num_idle_connections(self) -> int:
        """Idle keep-alive connections currently in the pool."""
        return sum(len(idle) for idle in self._idle.values())

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and return its response, whose body streams off the connection."""
        if self._closed:
            raise RuntimeError("PooledTransport.handle_async_request() called after aclose()")
        self._bind_loop()
        url = request.url
        scheme = url.scheme
        default_port = _DEFAULT_PORTS.get(scheme)
        if default_port is None:
            raise httpx.UnsupportedProtocol(
                f"unsupported URL scheme {scheme!r}: PooledTransport speaks http and https only",
                request=request,
            )
        host = url.host
        if not host:
            raise httpx.UnsupportedProtocol("the request URL has no host", request=request)
        port = url.port or default_port
        key = (scheme, host, port)
        origin = _format_origin(scheme, host, port)
        timeouts: Mapping[str, float | None] = request.extensions.get("timeout") or {}
        method = request.method.encode("ascii")

        try:
            content: bytes | None = request.content
        except httpx.RequestNotRead:
            content = None

        parts = [method, b" ", url.raw_path, b" HTTP/1.1\r\n"]
        has_length = chunked = has_te = close_requested = False
        for name, value in request.headers.raw:
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name or b":" in name:
                raise httpx.LocalProtocolError(
                    f"invalid character in request header {name[:64]!r} (value withheld)", request=request
                )
            lowered = name.lower()
            if lowered == b"content-length":
                has_length = True
            elif lowered == b"transfer-encoding":
                has_te = True
                chunked = b"chunked" in value.lower()
            elif lowered == b"connection" and b"close" in _tokens(value):
                close_requested = True
            parts += (name, b": ", value, b"\r\n")

        body = b""
        if content is not None:
            if chunked:
                body = (b"%x\r\n%b\r\n" % (len(content), content) if content else b"") + _CHUNK_END
            else:
                if not has_length and (content or method in _METHODS_WITH_BODY):
                    parts.append(b"Content-Length: %d\r\n" % len(content))
                body = content
        elif not has_length and not has_te:
            parts.append(b"Transfer-Encoding: chunked\r\n")
            chunked = True
        parts.append(b"\r\n")
        head = b"".join(parts)
        if body and len(body) <= 2**16:
            # One write (and usually one segment) for small requests; big bodies go separately.
            head, body = head + body, b""

        conn = await self._checkout(key, origin, request, timeouts)
        try:
            try:
                return await self._exchange(
                    conn, request, origin, head, body, content is None, chunked, close_requested, timeouts
                )
            except _StaleConnection as stale:
                # The slot stays ours: reconnect with it and send the request once more.
                conn.abort()
                conn.released = True
                if content is None:
                    self._free_slot()
                    raise stale.error from stale.__cause__
                try:
                    conn = await self._open(key, origin, request, timeouts)
                except BaseException:
                    self._free_slot()
                    raise
                return await self._exchange(
                    conn, request, origin, head, body, False, chunked, close_requested, timeouts
                )
        except BaseException:
            self._discard(conn)
            raise

    async def aclose(self) -> None:
        """Close every pooled idle connection; later requests raise ``RuntimeError``.

        Connections still carrying a response are closed when that response is finished.
        Waits (at most a second) for the closed connections to finish closing.
        """
        self._closed = True
        closing: list[_Connection] = []
        for idle in self._idle.values():
            closing.extend(idle)
        self._idle.clear()
        for conn in closing:
            conn.released = True
            conn.close()
            self._n_connections -= 1
        if closing:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await asyncio.gather(*(conn.writer.wait_closed() for conn in closing), return_exceptions=True)

    # -- request / response exchange -----------------------------------------------------

    async def _exchange(
        self,
        conn: _Connection,
        request: httpx.Request,
        origin: str,
        head: bytes,
        body: bytes,
        streaming: bool,
        chunked: bool,
        close_requested: bool,
        timeouts: Mapping[str, float | None],
    ) -> httpx.Response:
        reader, writer = conn.reader, conn.writer
        write_timeout = timeouts.get("write")
        write_error: OSError | None = None
        try:
            writer.write(head)
            if body:
                writer.write(body)
            await self._drain(writer, write_timeout)
            if streaming:
                request_stream = request.stream
                if isinstance(request_stream, httpx.AsyncByteStream):
                    async for part in request_stream:
                        await self._write_part(writer, part, chunked, write_timeout)
                else:
                    for part in request_stream:
                        await self._write_part(writer, part, chunked, write_timeout)
                if chunked:
                    writer.write(_CHUNK_END)
                    await self._drain(writer, write_timeout)
        except TimeoutError:
            raise httpx.WriteTimeout(f"timed out sending the request to {origin}", request=request) from None
        except OSError as exc:
            # The server may have answered early (and closed); try to read that response.
            write_error = exc

        read_timeout = timeouts.get("read")
        while True:
            try:
                if read_timeout is None:
                    raw = await reader.readuntil(b"\r\n\r\n")
                else:
                    async with asyncio.timeout(read_timeout):
                        raw = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, OSError) as exc:
                nothing_received = not isinstance(exc, asyncio.IncompleteReadError) or not exc.partial
                if nothing_received and not isinstance(exc, TimeoutError):
                    error: httpx.TransportError
                    if write_error is not None:
                        error = httpx.WriteError(
                            f"error sending the request to {origin}: {type(write_error).__name__}: {write_error}",
                            request=request,
                        )
                    elif isinstance(exc, asyncio.IncompleteReadError):
                        error = httpx.RemoteProtocolError(
                            f"server disconnected without sending a response ({origin})", request=request
                        )
                    else:
                        error = httpx.ReadError(
                            f"connection to {origin} failed before a response arrived: {type(exc).__name__}: {exc}",
                            request=request,
                        )
                    if conn.reused:
                        raise _StaleConnection(error) from exc
                    raise error from exc
                raise _map_read_error(exc, request, origin, "response head") from exc
            except asyncio.LimitOverrunError as exc:
                raise _map_read_error(exc, request, origin, "response head") from exc
            try:
                version, status, reason, headers = _parse_head(raw)
            except _ProtocolError as exc:
                raise _map_read_error(exc, request, origin, "response head") from None
            if 100 <= status < 200 and status != 101:
                continue  # informational response (100 Continue, 103 Early Hints): skip it
            break

        keep_alive = not close_requested and write_error is None
        if version == b"HTTP/1.0":
            keep_alive = False  # HTTP/1.0 keep-alive is opt-in and rarely right: do not reuse
        framing = _NONE
        length = 0
        content_lengths: list[bytes] = []
        transfer_encoding = b""
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"content-length":
                content_lengths.append(value)
            elif lowered == b"transfer-encoding":
                transfer_encoding = (transfer_encoding + b"," + value) if transfer_encoding else value
            elif lowered == b"connection" and b"close" in _tokens(value):
                keep_alive = False

        if status == 101:
            keep_alive = False
        elif request.method == "HEAD" or status in (204, 304):
            pass
        elif transfer_encoding:
            codings = [c.strip() for c in transfer_encoding.lower().split(b",")]
            if codings[-1] == b"chunked":
                framing = _CHUNKED
            else:
                framing = _UNTIL_CLOSE
                keep_alive = False
        elif content_lengths:
            values = {v.strip() for cl in content_lengths for v in cl.split(b",")}
            if len(values) != 1:
                raise httpx.RemoteProtocolError(f"conflicting Content-Length from {origin}", request=request)
            value = values.pop()
            if not value.isdigit() or len(value) > 18:
                raise httpx.RemoteProtocolError(f"invalid Content-Length from {origin}", request=request)
            length = int(value)
            if length:
                framing = _LENGTH
        else:
            framing = _UNTIL_CLOSE
            keep_alive = False

        stream: httpx.AsyncByteStream
        if framing == _NONE:
            stream = _EmptyStream()
        else:
            stream = _ResponseStream(self, conn, request, origin, framing, length, keep_alive, read_timeout)
        response = httpx.Response(
            status,
            headers=headers,
            stream=stream,
            extensions={"http_version": version, "reason_phrase": reason},
            request=request,
        )
        if framing == _NONE:
            self._release(conn, keep_alive)
        return response

    @staticmethod
    async def _drain(writer: asyncio.StreamWriter, write_timeout: float | None) -> None:
        if write_timeout is not None and writer.transport.get_write_buffer_size():
            async with asyncio.timeout(write_timeout):
                await writer.drain()
        else:
            await writer.drain()

    async def _write_part(
        self, writer: asyncio.StreamWriter, part: bytes, chunked: bool, write_timeout: float | None
    ) -> None:
        if not part:
            return
        if chunked:
            writer.write(b"%x\r\n" % len(part))
            writer.write(part)
            writer.write(b"\r\n")
        else:
            writer.write(part)
        await self._drain(writer, write_timeout)

    # -- the pool --------------------------------------------------------------------------

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        ref = self._loop_ref
        if ref is not None:
            bound = ref()
            if bound is loop:
                return
            if bound is not None and not bound.is_closed() and (self._n_connections or self._waiters):
                raise RuntimeError(
                    "this PooledTransport is in use by another event loop; "
                    "a transport (and its httpx client) belongs to one event loop"
                )
            # The previous loop is gone: its connections cannot be used (nor closed) from here.
            self._idle.clear()
            self._waiters.clear()
            self._n_connections = 0
        self._loop_ref = weakref.ref(loop)

    def _get_ssl_context(self) -> ssl.SSLContext:
        context = self._ssl_context
        if context is None:
            if isinstance(self._verify, ssl.SSLContext):
                context = self._verify
            elif self._verify:
                try:
                    import certifi  # an httpx dependency; mirrors httpx's default trust store
                except ImportError:  # pragma: no cover
                    context = ssl.create_default_context()
                else:
                    context = ssl.create_default_context(cafile=certifi.where())
                context.set_alpn_protocols(["http/1.1"])
            else:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                context.set_alpn_protocols(["http/1.1"])
            self._ssl_context = context
        return context

    async def _checkout(
        self, key: _Key, origin: str, request: httpx.Request, timeouts: Mapping[str, float | None]
    ) -> _Connection:
        """Get a connection for ``key``: an idle one, or a new one once a slot is free."""
        conn: _Connection | None = None
        if not self._waiters:
            conn = self._take_idle(key)
            if conn is not None:
                return conn
            if self._n_connections < self._max_connections:
                self._n_connections += 1
            elif not self._evict_idle():
                conn = await self._wait_for_slot(key, origin, request, timeouts.get("pool"))
        else:
            conn = await self._wait_for_slot(key, origin, request, timeouts.get("pool"))
        if conn is not None:
            return conn
        # We hold a slot: open a connection with it.
        try:
            return await self._open(key, origin, request, timeouts)
        except BaseException:
            self._free_slot()
            raise

    async def _wait_for_slot(
        self, key: _Key, origin: str, request: httpx.Request, pool_timeout: float | None
    ) -> _Connection | None:
        """Queue up until a connection (for ``key``) or a free slot is handed to us."""
        future: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
        waiter = (key, future)
        self._waiters.append(waiter)
        try:
            if pool_timeout is None:
                return await future
            async with asyncio.timeout(pool_timeout):
                return await future
        except BaseException as exc:
            if future.done() and not future.cancelled():
                # We were handed something just as we gave up: pass it on.
                handed = future.result()
                if handed is None:
                    self._free_slot()
                else:
                    handed.released = False
                    self._release(handed, True)
            else:
                future.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise httpx.PoolTimeout(
                    f"timed out waiting for a free connection to {origin} (max_connections={self._max_connections})",
                    request=request,
                ) from None
            raise

    async def _open(
        self, key: _Key, origin: str, request: httpx.Request, timeouts: Mapping[str, float | None]
    ) -> _Connection:
        """Open a new connection (the caller holds a slot for it)."""
        scheme, host, port = key
        ssl_context: ssl.SSLContext | None = None
        server_hostname: str | None = None
        if scheme == "https":
            ssl_context = self._get_ssl_context()
            sni = request.extensions.get("sni_hostname")
            server_hostname = sni.decode("ascii") if isinstance(sni, bytes) else (sni or host)
        connect_timeout = timeouts.get("connect")
        try:
            async with asyncio.timeout(connect_timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=ssl_context, server_hostname=server_hostname, limit=_STREAM_LIMIT
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"timed out connecting to {origin}", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(
                f"failed to connect to {origin}: {type(exc).__name__}: {exc}", request=request
            ) from exc
        return _Connection(key, reader, writer)

    def _take_idle(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        expiry = self._keepalive_expiry
        while idle and now - idle[0].idle_since > expiry:  # oldest first
            self._drop_idle(idle.popleft())
        while idle:
            conn = idle.pop()  # most recently used first
            if conn.is_usable():
                conn.released = False
                conn.reused = True
                return conn
            self._drop_idle(conn)
        return None

    def _drop_idle(self, conn: _Connection) -> None:
        conn.close()
        self._free_slot()

    def _evict_idle(self) -> bool:
        """Close the oldest idle connection of any origin, keeping its slot; False if none."""
        for idle in self._idle.values():
            if idle:
                idle.popleft().close()
                return True
        return False

    def _next_waiter(self) -> tuple[_Key, asyncio.Future[_Connection | None]] | None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter[1].done():
                return waiter
        return None

    def _free_slot(self) -> None:
        """Give up one slot: hand it to the first waiter, else return it."""
        waiter = self._next_waiter()
        if waiter is None:
            self._n_connections -= 1
        else:
            waiter[1].set_result(None)

    def _release(self, conn: _Connection, keep_alive: bool) -> None:
        """Return a connection whose response is complete: reuse, pool or close it."""
        if conn.released:
            return
        conn.released = True
        if not keep_alive or self._closed or not conn.is_usable():
            conn.close()
            self._free_slot()
            return
        waiter = self._next_waiter()
        if waiter is not None:
            waiter_key, future = waiter
            if waiter_key == conn.key:
                conn.released = False
                conn.reused = True
                future.set_result(conn)
            else:
                conn.close()
                future.set_result(None)
            return
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = collections.deque()
        if len(idle) >= self._max_idle_per_host:
            conn.close()
            self._n_connections -= 1
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _discard(self, conn: _Connection) -> None:
        """Abort a connection that is broken or mid-response, freeing its slot."""
        if conn.released:
            return
        conn.released = True
        conn.abort()
        self._free_slot()


# -- one shared client per event loop ------------------------------------------------------


class _LoopClient:
    """The shared client of one event loop, and the guard that closes it at loop shutdown."""

    __slots__ = ("client", "detached", "guard")

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.detached = False
        self.guard: AsyncGenerator[None, None] | None = None


_shared_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = weakref.WeakKeyDictionary()


async def _shutdown_guard(entry: _LoopClient) -> AsyncGenerator[None, None]:
    """Async generator parked at its first ``yield`` for the life of the loop.

    ``asyncio.run`` / ``asyncio.Runner`` (and uvloop) call ``loop.shutdown_asyncgens()``
    before closing the loop, which closes this generator *on the loop*: its ``finally``
    then closes the shared client gracefully.
    """
    try:
        yield
    finally:
        if not entry.detached:
            entry.detached = True
            loop = asyncio.get_running_loop()
            if _shared_clients.get(loop) is entry:
                del _shared_clients[loop]
            with contextlib.suppress(Exception):
                await entry.client.aclose()


def _drive(awaitable: Any) -> None:
    """Run a coroutine that completes without suspending, synchronously."""
    with contextlib.suppress(StopIteration, StopAsyncIteration, RuntimeError):
        awaitable.send(None)


def _detach(entry: _LoopClient) -> None:
    """Finish an entry's guard without touching its (possibly dead) loop."""
    entry.detached = True
    guard, entry.guard = entry.guard, None
    if guard is not None:
        _drive(guard.aclose())


def shared_client(*, timeout: float | httpx.Timeout = 600.0) -> httpx.AsyncClient:
    """Return the pooled ``httpx.AsyncClient`` of the running event loop, creating it lazily.

    The client uses a :class:`PooledTransport` and ``trust_env=False`` (no proxy or
    ``.netrc`` settings from the environment). ``timeout`` only applies when this call creates
    the client; pass ``timeout=`` per request to override it. The client is closed by
    :func:`aclose_shared_client`, or automatically when the loop shuts down through
    ``asyncio.run`` / ``asyncio.Runner`` (which finalize async generators); a client closed
    by its user is replaced on the next call.

    Raises:
        RuntimeError: when called with no running event loop.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "osmosis_core.http.shared_client() needs a running event loop: call it from async code"
        ) from None
    entry = _shared_clients.get(loop)
    if entry is not None and not entry.detached and not entry.client.is_closed:
        return entry.client
    for other in [other for other in _shared_clients if other.is_closed()]:
        dead = _shared_clients.pop(other, None)
        if dead is not None:
            _detach(dead)
    if entry is not None:
        _detach(entry)
    # Passing the transport keeps httpx from building its own SSL context (~50 ms).
    client = httpx.AsyncClient(transport=PooledTransport(), timeout=timeout, trust_env=False)
    entry = _LoopClient(client)
    guard = _shutdown_guard(entry)
    _drive(guard.asend(None))  # registers it with the loop's asyncgen hooks, parks at `yield`
    entry.guard = guard
    _shared_clients[loop] = entry
    return client


def shared_transport() -> PooledTransport:
    """The :class:`PooledTransport` behind :func:`shared_client` (same pool, same event loop).

    Sending an ``httpx.Request`` straight to it skips the client's per-request machinery
    (URL and header merging, auth and redirect loops): about 40% less CPU per request, which is
    what the core's own chat helper does.
    """
    transport = shared_client()._transport  # the client was built with a PooledTransport
    assert isinstance(transport, PooledTransport)
    return transport


async def aclose_shared_client() -> None:
    """Close the running loop's shared client (if any); the next :func:`shared_client` makes a new one."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError("aclose_shared_client() needs a running event loop") from None
    entry = _shared_clients.pop(loop, None)
    if entry is None:
        return
    _detach(entry)
    await entry.client.aclose()


_copies: dict[str, Any] = {}


def transport_module(httpx_module: str = "httpx") -> Any:
    """This module, bound to ``httpx`` (itself) or to an API-identical fork such as ``httpx2``.

    openai 3.x sends its requests through ``httpx2``, whose ``Response`` only accepts streams of
    its own classes; this returns a copy of this module built on that package, so the same
    :class:`PooledTransport` (and :func:`shared_client`) serves both::

        pooled = transport_module("httpx2")
        client = openai.AsyncOpenAI(http_client=pooled.shared_client(), ...)
    """
    if httpx_module == "httpx":
        return sys.modules[__name__]
    copy = _copies.get(httpx_module)
    if copy is None:
        hx = importlib.import_module(httpx_module)
        spec = importlib.util.spec_from_file_location(f"{__name__}_{httpx_module}", __file__)
        assert spec is not None and spec.loader is not None
        copy = importlib.util.module_from_spec(spec)
        copy.__osmosis_httpx__ = hx  # type: ignore[attr-defined]
        sys.modules[spec.name] = copy
        spec.loader.exec_module(copy)
        _copies[httpx_module] = copy
    return copy
