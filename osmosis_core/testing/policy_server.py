"""A scripted, OpenAI-compatible chat-completions server for tests and ``--stub-policy`` runs.

:class:`ScriptedPolicyServer` speaks real HTTP/1.1 on a loopback address and answers
``POST .../v1/chat/completions`` with replies produced by a *script*: a plain function that takes the
parsed request JSON and returns a :class:`Reply`.  It stands in for an LLM on machines that have none.

The server is written directly on :class:`asyncio.Protocol` with a hand-written HTTP/1.1 parser
(keep-alive, pipelining, ``Content-Length`` and ``Transfer-Encoding: chunked`` request bodies) so that
it sustains well over a thousand requests per second on one core even with injected latency, which is
implemented with ``loop.call_later`` rather than threads.

Failures can be injected per request (:class:`Fault`): an HTTP error status, a dropped connection, a
connection aborted in the middle of the response, or an extra delay.  Every chat-completion request is
recorded as a :class:`LoggedRequest`.

The server can run inside the caller's event loop (:meth:`ScriptedPolicyServer.start_async`, ``async
with``) or in a daemon thread with its own loop (:meth:`ScriptedPolicyServer.start`, ``with``).

Run ``python -m osmosis_core.testing.policy_server`` to serve the calculator script from the command line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import http
import ipaddress
import json
import logging
import math
import re
import secrets
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import unquote

import attrs

__all__ = [
    "Fault",
    "FaultKind",
    "LoggedRequest",
    "Reply",
    "Script",
    "ScriptedPolicyServer",
    "ToolCall",
    "main",
]

_log = logging.getLogger(__name__)

FaultKind = Literal["status", "drop", "drop_mid_stream", "delay"]
"""The kinds of failure :class:`Fault` can inject."""

_FAULT_KINDS: Final = ("status", "drop", "drop_mid_stream", "delay")

_MAX_HEAD: Final = 64 * 1024
"""Largest accepted request line plus headers, in bytes."""
_MAX_BODY: Final = 64 * 1024 * 1024
"""Largest accepted request body, in bytes."""
_MAX_CHUNK_LINE: Final = 4096
"""Largest accepted chunk-size or trailer line of a chunked request body."""
_MAX_FAILURE_LOGS: Final = 20
"""Script failures logged with a traceback; later ones are only answered with 500."""
_HIGH_WATER: Final = 1024 * 1024
"""Unprocessed input above which reading pauses while a response is pending."""

_TOKEN_RE: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEX_RE: Final = re.compile(rb"[0-9A-Fa-f]{1,16}")
_ROLLOUT_PATH_RE: Final = re.compile(r"/rollouts/([^/]+)/")


def _new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@attrs.frozen
class ToolCall:
    """A tool call the scripted assistant makes.

    ``arguments`` is JSON-encoded when it is a dict; a string is sent verbatim, which allows sending
    malformed JSON.  ``id=None`` omits the ``"id"`` key entirely (a fault case some servers exhibit).
    """

    name: str
    arguments: dict[str, Any] | str
    id: str | None = attrs.field(factory=_new_call_id)

    def arguments_json(self) -> str:
        """The ``function.arguments`` string as sent on the wire."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


def _to_tool_calls(calls: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(calls)


@attrs.frozen
class Reply:
    """One assistant turn: text content and/or tool calls.

    ``finish_reason`` defaults to ``"tool_calls"`` when there are tool calls and ``"stop"`` otherwise.
    A list of tool calls is accepted and stored as a tuple.
    """

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_to_tool_calls)
    finish_reason: str | None = None

    def effective_finish_reason(self) -> str:
        """The finish reason sent: the explicit one, else derived from the presence of tool calls."""
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


def _check_status(instance: Fault, attribute: attrs.Attribute[int], value: int) -> None:
    if not 400 <= value <= 599:
        raise ValueError(f"Fault.status must be an HTTP error status (400-599), got {value!r}")


def _check_delay(instance: Fault, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"Fault.delay must be a finite number >= 0, got {value!r}")


@attrs.frozen
class Fault:
    """An injected failure.

    * ``"status"``: answer with HTTP ``status`` and an OpenAI-style JSON error body carrying ``message``.
    * ``"drop"``: close the connection without answering.
    * ``"drop_mid_stream"``: send the response headers and the start of the body, then abort the
      connection (for streams: the first SSE chunks and no terminating chunk; otherwise half the body).
    * ``"delay"``: wait ``delay`` extra seconds, then answer normally.
    """

    kind: FaultKind = attrs.field(validator=attrs.validators.in_(_FAULT_KINDS))
    status: int = attrs.field(default=500, validator=_check_status)
    delay: float = attrs.field(default=0.0, validator=_check_delay)
    message: str = "injected fault"


@attrs.frozen
class LoggedRequest:
    """A chat-completion request the server received (the API key itself is never stored)."""

    rollout_id: str | None
    """From the ``X-Osmosis-Rollout-Id`` header, else from a ``/rollouts/<id>/`` path prefix, else None."""
    path: str
    body: dict[str, Any]
    """The parsed JSON request (``{}`` when it could not be parsed)."""
    stream: bool
    authorized: bool
    """Whether an ``Authorization`` header was present."""
    status: int
    """HTTP status sent; 0 when the connection was dropped without a response."""
    fault: str | None
    """The fault kind applied, if any."""


Script = Callable[[dict[str, Any]], Reply]
"""A policy script: takes the parsed request JSON (messages, tools, ...) and returns the reply."""


# ---------------------------------------------------------------------------------------------------
# HTTP plumbing
# ---------------------------------------------------------------------------------------------------

_REASONS: dict[int, str] = {s.value: s.phrase for s in http.HTTPStatus}

_ERROR_TYPES: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class _HttpError(Exception):
    """A request that cannot be served; answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def _error_body(status: int, message: str) -> bytes:
    """An OpenAI-style error document."""
    doc = {"error": {"message": message, "type": _error_type(status), "param": None, "code": status}}
    return json.dumps(doc).encode()


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _head(
    status: int,
    content_type: str,
    length: int | None,
    *,
    keep_alive: bool,
    http10: bool = False,
    extra: str = "",
) -> bytes:
    """Status line and headers.  ``length=None`` means chunked (or, for HTTP/1.0, close-delimited)."""
    reason = _REASONS.get(status, "Unknown")
    parts = [f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"]
    if length is not None:
        parts.append(f"Content-Length: {length}\r\n")
    elif not http10:
        parts.append("Transfer-Encoding: chunked\r\n")
    if not keep_alive:
        parts.append("Connection: close\r\n")
    parts.append(extra)
    parts.append("\r\n")
    return "".join(parts).encode("latin-1")


class _Request:
    """A parsed HTTP request."""

    __slots__ = ("body", "headers", "http10", "keep_alive", "method", "path")

    def __init__(self, method: str, path: str, headers: dict[str, str], http10: bool) -> None:
        self.method = method
        self.path = path
        self.headers = headers
        self.http10 = http10
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        self.keep_alive = not http10 and "close" not in tokens  # HTTP/1.0 connections are always closed
        self.body = b""


class _ChunkedReader:
    """Incremental decoder of a ``Transfer-Encoding: chunked`` request body."""

    __slots__ = ("_parts", "_remaining", "_state", "_total")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._total = 0
        self._remaining = 0
        self._state = "size"

    def feed(self, buf: bytearray) -> bytes | None:
        """Consume what it can from ``buf``; return the whole body once the last chunk is in."""
        while True:
            if self._state == "size":
                nl = buf.find(b"\r\n")
                if nl < 0:
                    if len(buf) > _MAX_CHUNK_LINE:
                        raise _HttpError(400, "chunk size line too long")
                    return None
                size_field = bytes(buf[:nl]).split(b";", 1)[0].strip()
                del buf[: nl + 2]
                if not _HEX_RE.fullmatch(size_field):
                    raise _HttpError(400, "invalid chunk size")
                size = int(size_field, 16)
                if size == 0:
                    self._state = "trailer"
                    continue
                self._total += size
                if self._total > _MAX_BODY:
                    raise _HttpError(413, "request body too large")
                self._remaining = size
                self._state = "data"
            elif self._state == "data":
                if not buf:
                    return None
                n = min(self._remaining, len(buf))
                self._parts.append(bytes(buf[:n]))
                del buf[:n]
                self._remaining -= n
                if self._remaining:
                    return None
                self._state = "crlf"
            elif self._state == "crlf":
                if len(buf) < 2:
                    return None
                if buf[:2] != b"\r\n":
                    raise _HttpError(400, "missing CRLF after chunk data")
                del buf[:2]
                self._state = "size"
            else:  # trailer section: lines until an empty one
                nl = buf.find(b"\r\n")
                if nl < 0:
                    if len(buf) > _MAX_CHUNK_LINE:
                        raise _HttpError(400, "trailer line too long")
                    return None
                del buf[: nl + 2]
                if nl == 0:
                    return b"".join(self._parts)


def _parse_head(head: bytes) -> _Request:
    """Parse the request line and header block (without the terminating blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    request_line = lines[0].split(" ")
    if len(request_line) != 3:
        raise _HttpError(400, "malformed request line")
    method, target, version = request_line
    if not _TOKEN_RE.fullmatch(method):
        raise _HttpError(400, "malformed request method")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _HttpError(505, f"unsupported HTTP version {version!r}")
    if not target:
        raise _HttpError(400, "empty request target")
    if target.startswith(("http://", "https://")):  # absolute form
        slash = target.find("/", target.index("//") + 2)
        target = target[slash:] if slash >= 0 else "/"
    path = target.split("?", 1)[0].split("#", 1)[0]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or not _TOKEN_RE.fullmatch(name):
            raise _HttpError(400, "malformed header line")
        key = name.lower()
        value = value.strip(" \t")
        if key in headers and key in ("content-length", "transfer-encoding", "authorization", "host"):
            if key == "transfer-encoding":
                headers[key] = headers[key] + ", " + value
                continue
            if headers[key] != value:
                raise _HttpError(400, f"conflicting {name} headers")
        headers[key] = value
    return _Request(method, path, headers, version == "HTTP/1.0")


Action = Literal["send", "drop", "partial"]


class _Connection(asyncio.Protocol):
    """One client connection: parses requests in order and writes their responses in order."""

    def __init__(self, server: ScriptedPolicyServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._req: _Request | None = None  # headers parsed, body pending
        self._content_length = 0
        self._chunked: _ChunkedReader | None = None
        self._sent_continue = False
        self._busy = False  # a request is being answered
        self._processing = False
        self._closing = False
        self._eof = False
        self._write_paused = False
        self._read_paused = False
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._server._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._server._connections.discard(self)
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._buf += data
        if not self._busy:
            self._process()
        self._update_reading()

    def eof_received(self) -> bool:
        self._eof = True
        if self._busy:
            return True  # keep the transport open to write the pending response
        self._process()
        return self._busy

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if not self._busy:
            self._process()
        self._update_reading()

    def _update_reading(self) -> None:
        """Stop reading while input piles up behind a pending response or a full write buffer."""
        transport = self._transport
        if transport is None or self._closing or transport.is_closing():
            return
        pause = (self._busy or self._write_paused) and len(self._buf) > _HIGH_WATER
        if pause != self._read_paused:
            self._read_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    # -- request handling ---------------------------------------------------------------------------

    def _process(self) -> None:
        """Parse and dispatch complete requests until one is pending or input runs out."""
        if self._processing:
            return
        self._processing = True
        try:
            while not self._busy and not self._closing and not self._write_paused:
                try:
                    req = self._parse()
                except _HttpError as err:
                    self._busy = True
                    self.respond(_error_response(err.status, err.message, keep_alive=False), keep_alive=False)
                    return
                if req is None:
                    if self._eof and not self._busy:
                        self.close()
                    return
                self._busy = True
                try:
                    self._server._dispatch(self, req)
                except Exception:  # pragma: no cover - defensive: never kill the connection silently
                    _log.exception("stub policy server: error handling %s %s", req.method, req.path)
                    if self._busy:
                        self.respond(_error_response(500, "internal server error", keep_alive=False), keep_alive=False)
        finally:
            self._processing = False

    def _parse(self) -> _Request | None:
        buf = self._buf
        if self._req is None:
            while buf[:2] == b"\r\n":  # tolerate stray CRLF between requests
                del buf[:2]
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise _HttpError(431, "request header fields too large")
                return None
            if end > _MAX_HEAD:
                raise _HttpError(431, "request header fields too large")
            req = _parse_head(bytes(buf[:end]))
            del buf[: end + 4]
            te = req.headers.get("transfer-encoding")
            cl = req.headers.get("content-length")
            if te is not None:
                if cl is not None:
                    raise _HttpError(400, "both Content-Length and Transfer-Encoding given")
                if te.strip().lower() != "chunked":
                    raise _HttpError(501, f"unsupported Transfer-Encoding {te!r}")
                self._chunked = _ChunkedReader()
            elif cl is not None:
                if not cl.isdigit() or not cl.isascii():
                    raise _HttpError(400, "invalid Content-Length")
                self._content_length = int(cl)
                if self._content_length > _MAX_BODY:
                    raise _HttpError(413, "request body too large")
            else:
                self._content_length = 0
            self._req = req
            self._sent_continue = False
        req = self._req
        if self._chunked is not None:
            body = self._chunked.feed(buf)
            if body is None:
                self._maybe_continue(req)
                return None
            self._chunked = None
        else:
            n = self._content_length
            if len(buf) < n:
                self._maybe_continue(req)
                return None
            body = bytes(buf[:n])
            del buf[:n]
        req.body = body
        self._req = None
        return req

    def _maybe_continue(self, req: _Request) -> None:
        if (
            not self._sent_continue
            and not req.http10
            and req.headers.get("expect", "").lower() == "100-continue"
            and self._transport is not None
        ):
            self._sent_continue = True
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    # -- responding ---------------------------------------------------------------------------------

    def respond(
        self, data: bytes, *, keep_alive: bool, delay: float = 0.0, action: Action = "send", cut: int = 0
    ) -> None:
        """Answer the pending request, after ``delay`` seconds if positive.

        ``action`` is ``"send"`` (write ``data``), ``"drop"`` (close without writing) or ``"partial"``
        (write ``data[:cut]`` then abort the connection).
        """
        if delay > 0:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(delay, self._do_respond, data, keep_alive, action, cut)
        else:
            self._do_respond(data, keep_alive, action, cut)

    def _do_respond(self, data: bytes, keep_alive: bool, action: Action, cut: int) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or self._closing:
            return
        if action == "drop":
            self.close()
            return
        if action == "partial":
            transport.write(data[:cut])
            self._closing = True
            if transport.get_write_buffer_size():
                transport.close()  # abort() would discard the bytes not yet handed to the kernel
            else:
                transport.abort()
            return
        transport.write(data)
        if not keep_alive or (self._eof and not self._buf):
            self.close()
            return
        self._busy = False
        self._process()
        self._update_reading()

    def close(self) -> None:
        """Close the connection after flushing what was written."""
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Close the connection immediately (server shutdown)."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.abort()


def _error_response(status: int, message: str, *, keep_alive: bool, extra: str = "") -> bytes:
    body = _error_body(status, message)
    return _head(status, "application/json", len(body), keep_alive=keep_alive, extra=extra) + body


def _json_response(status: int, obj: object, *, keep_alive: bool, http10: bool = False) -> bytes:
    body = _dumps(obj)
    return _head(status, "application/json", len(body), keep_alive=keep_alive, http10=http10) + body


# ---------------------------------------------------------------------------------------------------
# Chat-completion documents
# ---------------------------------------------------------------------------------------------------


def _rough_tokens(n_chars: int) -> int:
    return max(1, (n_chars + 3) // 4)


def _usage(reply: Reply, request_bytes: int) -> dict[str, int]:
    completion_chars = len(reply.content or "") + sum(
        len(tc.name) + len(tc.arguments_json()) for tc in reply.tool_calls
    )
    prompt = _rough_tokens(request_bytes)
    completion = _rough_tokens(completion_chars)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _tool_call_doc(tc: ToolCall) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if tc.id is not None:
        doc["id"] = tc.id
    doc["type"] = "function"
    doc["function"] = {"name": tc.name, "arguments": tc.arguments_json()}
    return doc


def _completion_doc(reply: Reply, model: str, request_bytes: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [_tool_call_doc(tc) for tc in reply.tool_calls]
    return {
        "id": "chatcmpl-" + secrets.token_hex(12),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": reply.effective_finish_reason(),
            }
        ],
        "usage": _usage(reply, request_bytes),
    }


def _split_content(content: str, pieces: int = 4) -> list[str]:
    """Split text into up to ``pieces`` consecutive deltas."""
    if not content:
        return []
    step = max(1, -(-len(content) // pieces))
    return [content[i : i + step] for i in range(0, len(content), step)]


def _stream_events(reply: Reply, model: str, request_bytes: int, include_usage: bool) -> list[bytes]:
    """The SSE events (each ``data: ...\\n\\n``) of a streamed reply, ending with ``[DONE]``."""
    cid = "chatcmpl-" + secrets.token_hex(12)
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        doc = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        return b"data: " + _dumps(doc) + b"\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    events.extend(chunk({"content": piece}) for piece in _split_content(reply.content or ""))
    for index, tc in enumerate(reply.tool_calls):
        first: dict[str, Any] = {"index": index}
        if tc.id is not None:
            first["id"] = tc.id
        first["type"] = "function"
        first["function"] = {"name": tc.name, "arguments": ""}
        events.append(chunk({"tool_calls": [first]}))
        events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": tc.arguments_json()}}]}))
    events.append(chunk({}, reply.effective_finish_reason()))
    if include_usage:
        doc = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": _usage(reply, request_bytes),
        }
        events.append(b"data: " + _dumps(doc) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def _chunk_encode(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _is_chat_path(path: str) -> bool:
    return path == "/chat/completions" or path.endswith("/v1/chat/completions")


def _is_models_path(path: str) -> bool:
    return path == "/models" or path.endswith("/v1/models")


def _bearer_ok(header: str | None, api_key: str) -> bool:
    if header is None:
        return False
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), api_key.encode())


def _default_script() -> Script:
    from osmosis_core.testing import scripts  # imported lazily: scripts imports this module

    return scripts.calculator


@attrs.define(eq=False)
class _PendingFault:
    fault: Fault
    remaining: int
    rollout_id: str | None


# ---------------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------------


class ScriptedPolicyServer:
    """A scripted OpenAI-compatible chat-completions server on a loopback address.

    Endpoints: ``POST /v1/chat/completions`` (also under any prefix, e.g.
    ``/rollouts/<id>/v1/chat/completions``), ``GET /v1/models``, ``GET /health``; anything else is a
    JSON 404.  With ``api_key`` set, chat and model requests without ``Authorization: Bearer <api_key>``
    get 401.  ``latency`` seconds pass before each chat-completion response (before the first byte of a
    stream); it may be changed while the server runs.

    Only chat-completion requests are logged (:attr:`requests`).  ``max_logged`` bounds the log (oldest
    entries are discarded) for long-running use; ``None`` keeps everything.
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        latency: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        model: str = "osmosis-stub",
        max_logged: int | None = None,
    ) -> None:
        self._script: Script = script if script is not None else _default_script()
        self.latency = latency
        self._host = "127.0.0.1" if host == "localhost" else host
        self._requested_port = port
        self._api_key = api_key
        self.model = model
        self._lock = threading.Lock()
        self._log: deque[LoggedRequest] = deque(maxlen=max_logged)
        self._faults: list[_PendingFault] = []
        self._connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._script_failures = 0

    # -- configuration and inspection ----------------------------------------------------------------

    @property
    def latency(self) -> float:
        """Seconds to wait before each chat-completion response; applies to subsequent requests."""
        return self._latency

    @latency.setter
    def latency(self, value: float) -> None:
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"latency must be a finite number >= 0, got {value!r}")
        self._latency = float(value)

    @property
    def port(self) -> int:
        """The TCP port the server listens on (raises :class:`RuntimeError` before it is started)."""
        if self._port is None:
            raise RuntimeError("ScriptedPolicyServer is not running")
        return self._port

    @property
    def url(self) -> str:
        """The OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``; clients POST ``{url}/chat/completions``."""
        host = self._host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/v1"

    @property
    def requests(self) -> list[LoggedRequest]:
        """A snapshot of the logged chat-completion requests, in arrival order."""
        with self._lock:
            return list(self._log)

    def requests_for(self, rollout_id: str) -> list[LoggedRequest]:
        """The logged requests of one rollout, in arrival order."""
        with self._lock:
            return [r for r in self._log if r.rollout_id == rollout_id]

    def inject(self, fault: Fault, *, times: int = 1, rollout_id: str | None = None) -> None:
        """Apply ``fault`` to the next ``times`` chat-completion requests (of ``rollout_id`` if given).

        Faults are consumed in injection order; requests rejected for authentication or malformed
        JSON do not consume faults.
        """
        if times < 1:
            raise ValueError(f"times must be >= 1, got {times!r}")
        with self._lock:
            self._faults.append(_PendingFault(fault, times, rollout_id))

    def clear(self) -> None:
        """Forget the request log and all pending faults."""
        with self._lock:
            self._log.clear()
            self._faults.clear()

    def _take_fault(self, rollout_id: str | None) -> Fault | None:
        with self._lock:
            for i, pending in enumerate(self._faults):
                if pending.rollout_id is None or pending.rollout_id == rollout_id:
                    pending.remaining -= 1
                    if pending.remaining <= 0:
                        del self._faults[i]
                    return pending.fault
        return None

    def _record(self, entry: LoggedRequest) -> None:
        with self._lock:
            self._log.append(entry)

    # -- request dispatch (runs on the server's event loop) -----------------------------------------

    def _dispatch(self, conn: _Connection, req: _Request) -> None:
        path = unquote(req.path)
        keep = req.keep_alive
        if _is_chat_path(path):
            if req.method != "POST":
                conn.respond(
                    _error_response(405, f"method {req.method} not allowed", keep_alive=keep, extra="Allow: POST\r\n"),
                    keep_alive=keep,
                )
                return
            self._chat(conn, req, path)
        elif _is_models_path(path) or path == "/health":
            if req.method not in ("GET", "HEAD"):
                conn.respond(
                    _error_response(405, f"method {req.method} not allowed", keep_alive=keep, extra="Allow: GET\r\n"),
                    keep_alive=keep,
                )
                return
            if path == "/health":
                doc: dict[str, Any] = {"status": "ok"}
            elif self._api_key is not None and not _bearer_ok(req.headers.get("authorization"), self._api_key):
                conn.respond(_unauthorized(keep), keep_alive=keep)
                return
            else:
                doc = {
                    "object": "list",
                    "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "osmosis"}],
                }
            data = _json_response(200, doc, keep_alive=keep, http10=req.http10)
            if req.method == "HEAD":
                data = data[: data.index(b"\r\n\r\n") + 4]
            conn.respond(data, keep_alive=keep)
        else:
            conn.respond(_error_response(404, f"not found: {req.method} {req.path}", keep_alive=keep), keep_alive=keep)

    def _chat(self, conn: _Connection, req: _Request, path: str) -> None:
        keep = req.keep_alive
        auth = req.headers.get("authorization")
        rollout_id = req.headers.get("x-osmosis-rollout-id") or None
        if rollout_id is None:
            match = _ROLLOUT_PATH_RE.search(path)
            rollout_id = match.group(1) if match else None

        body: dict[str, Any] = {}
        error: str | None = None
        try:
            parsed = json.loads(req.body)
        except (ValueError, UnicodeDecodeError) as exc:
            error = f"request body is not valid JSON: {exc}"
        else:
            if not isinstance(parsed, dict):
                error = "request body must be a JSON object"
            else:
                body = parsed
                if not isinstance(body.get("messages"), list):
                    error = "'messages' is a required property and must be an array"
        stream = body.get("stream") is True

        def log(status: int, fault: str | None = None) -> None:
            self._record(LoggedRequest(rollout_id, path, body, stream, auth is not None, status, fault))

        if self._api_key is not None and not _bearer_ok(auth, self._api_key):
            log(401)
            conn.respond(_unauthorized(keep), keep_alive=keep)
            return
        if error is not None:
            log(400)
            conn.respond(_error_response(400, error, keep_alive=keep), keep_alive=keep)
            return

        fault = self._take_fault(rollout_id)
        delay = self._latency
        if fault is not None and fault.kind == "status":
            log(fault.status, fault.kind)
            conn.respond(_error_response(fault.status, fault.message, keep_alive=keep), keep_alive=keep, delay=delay)
            return
        if fault is not None and fault.kind == "drop":
            log(0, fault.kind)
            conn.respond(b"", keep_alive=False, delay=delay, action="drop")
            return

        try:
            reply = self._script(body)
            if not isinstance(reply, Reply):
                raise TypeError(f"script returned {type(reply).__name__}, expected Reply")
        except Exception as exc:
            self._script_failures += 1
            if self._script_failures <= _MAX_FAILURE_LOGS:  # bounded: a child's stderr may be an unread pipe
                _log.exception("stub policy script failed")
            log(500)
            conn.respond(
                _error_response(500, f"policy script failed: {exc!r}", keep_alive=keep),
                keep_alive=keep,
                delay=delay,
            )
            return

        model = body.get("model")
        if not isinstance(model, str) or not model:
            model = self.model
        fault_kind = fault.kind if fault is not None else None
        log(200, fault_kind)
        if fault is not None and fault.kind == "delay":
            delay += fault.delay
        if stream:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            events = _stream_events(reply, model, len(req.body), include_usage)
            http10 = req.http10
            keep_stream = keep and not http10  # HTTP/1.0 has no chunked coding: close-delimited body
            head = _head(
                200,
                "text/event-stream; charset=utf-8",
                None,
                keep_alive=keep_stream,
                http10=http10,
                extra="Cache-Control: no-cache\r\n",
            )
            # HTTP/1.0 has no chunked coding: the body is delimited by closing the connection
            chunked = [*(_chunk_encode(e) for e in events), b"0\r\n\r\n"]
            payload = [head, *(events if http10 else chunked)]
            data = b"".join(payload)
            if fault_kind == "drop_mid_stream":
                # headers, the role chunk and the first content/tool chunk; no terminating chunk
                cut = sum(len(p) for p in payload[:3])
                conn.respond(data, keep_alive=False, delay=delay, action="partial", cut=cut)
            else:
                conn.respond(data, keep_alive=keep_stream, delay=delay)
            return
        data = _json_response(200, _completion_doc(reply, model, len(req.body)), keep_alive=keep, http10=req.http10)
        if fault_kind == "drop_mid_stream":
            head_len = data.index(b"\r\n\r\n") + 4
            cut = head_len + (len(data) - head_len) // 2
            conn.respond(data, keep_alive=False, delay=delay, action="partial", cut=cut)
        else:
            conn.respond(data, keep_alive=keep, delay=delay)

    # -- lifecycle -----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the server is listening."""
        return self._server is not None

    async def start_async(self) -> None:
        """Start listening inside the running event loop."""
        if self._server is not None:
            raise RuntimeError("ScriptedPolicyServer is already running")
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Connection(self), self._host, self._requested_port, backlog=1024, reuse_address=True
        )
        self._server = server
        self._port = int(server.sockets[0].getsockname()[1])

    async def stop_async(self) -> None:
        """Stop listening and close every connection (pending responses are abandoned)."""
        server = self._server
        if server is None:
            return
        self._server = None
        server.close()
        for conn in list(self._connections):
            conn.abort()
        await server.wait_closed()
        self._port = None

    def start(self) -> ScriptedPolicyServer:
        """Serve from a daemon thread with its own event loop; returns once listening."""
        if self._thread is not None or self._server is not None:
            raise RuntimeError("ScriptedPolicyServer is already running")
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            try:
                try:
                    loop.run_until_complete(self.start_async())
                except BaseException as exc:
                    failure.append(exc)
                    return
                finally:
                    self._thread_loop = loop
                    ready.set()
                loop.run_forever()
                loop.run_until_complete(self.stop_async())
            finally:
                self._thread_loop = None
                loop.close()

        thread = threading.Thread(target=run, name="osmosis-stub-policy", daemon=True)
        self._thread = thread
        thread.start()
        ready.wait()
        if failure:
            thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Stop a server started with :meth:`start` (no-op when not running)."""
        thread, loop = self._thread, self._thread_loop
        if thread is None:
            if self._server is not None:
                raise RuntimeError("server was started with start_async(); use stop_async()")
            return
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(loop.stop)
        thread.join()
        self._thread = None

    def __enter__(self) -> ScriptedPolicyServer:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> ScriptedPolicyServer:
        await self.start_async()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop_async()

    def __repr__(self) -> str:
        where = self.url if self._port is not None else "stopped"
        return f"<ScriptedPolicyServer {where} latency={self._latency}>"


def _unauthorized(keep_alive: bool) -> bytes:
    return _error_response(
        401,
        "invalid or missing API key",
        keep_alive=keep_alive,
        extra='WWW-Authenticate: Bearer realm="osmosis"\r\n',
    )


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _serve(args: argparse.Namespace) -> None:
    server = ScriptedPolicyServer(
        latency=args.latency, host=args.host, port=args.port, api_key=args.api_key, max_logged=1000
    )
    await server.start_async()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
    print(f"osmosis stub policy listening on {server.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop_async()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the calculator script until SIGTERM/SIGINT; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m osmosis_core.testing.policy_server",
        description="Scripted OpenAI-compatible chat-completions server (calculator script).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default: 0)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each response (default: 0)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    args = parser.parse_args(argv)
    if not _is_loopback(args.host) and not args.api_key:
        parser.error(f"refusing to listen on non-loopback host {args.host!r} without --api-key")
    if not (math.isfinite(args.latency) and args.latency >= 0):
        parser.error("--latency must be a finite number >= 0")
    if not 0 <= args.port <= 65535:
        parser.error("--port must be between 0 and 65535")
    try:
        asyncio.run(_serve(args))
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Delegate to the canonically imported module so that the Reply class the scripts construct is the
    # same one the server checks for (running as __main__ would otherwise create a second copy).
    from osmosis_core.testing.policy_server import main as _main

    raise SystemExit(_main())
