"""A scripted, OpenAI-compatible chat-completions server for tests and ``--stub-policy`` runs.

:class:`ScriptedPolicyServer` serves real HTTP on a loopback address (``aiohttp.web``) and answers
``POST .../v1/chat/completions`` with replies produced by a *script*: a plain function that takes the
parsed request JSON and returns a :class:`Reply`. It stands in for an LLM on machines that have none.

>>> from osmosis_core.testing import Reply, ScriptedPolicyServer
>>> with ScriptedPolicyServer(lambda request: Reply(content="#### 42")) as server:   # doctest: +SKIP
...     print(server.url)                  # POST {url}/chat/completions, streaming or not
http://127.0.0.1:40123/v1

Failures can be injected per request (:class:`Fault`): an HTTP error status, a dropped connection,
a connection cut in the middle of the answer, an answer that ends cleanly but early, an HTML page,
malformed JSON (in a body, or in one event of a stream), JSON that is not a chat completion, an
oversized body, or an extra delay. Every chat-completion request is recorded as a
:class:`LoggedRequest`. Latency is an ``asyncio.sleep`` per request, so a thousand concurrent
requests cost the server no threads (``bench/policy_server_rate.py`` measures its own rate).

The server runs inside the caller's event loop (:meth:`ScriptedPolicyServer.start_async`,
``async with``) or in a daemon thread with its own loop (:meth:`ScriptedPolicyServer.start`,
``with``). ``python -m osmosis_core.testing.policy_server`` serves the calculator script from the
command line; with ``--watch-stdin`` it exits when its standard input reaches end-of-file (its
parent holds the other end: ``osmosis run --stub-policy`` does, so the stand-in never outlives it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hmac
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
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import unquote

import attrs

from osmosis_core.http.server import cut_response as _abort
from osmosis_core.http.server import drop_connection as _drop
from osmosis_core.testing.stub_tokens import FLAVORS, THINK_BLOCK, Flavor, TokenAnswer, token_answer

if TYPE_CHECKING:
    from aiohttp import web

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

FaultKind = Literal[
    "status", "drop", "drop_mid_stream", "truncate", "html", "bad_json", "wrong_shape", "oversize", "delay", "linger"
]
"""The kinds of failure :class:`Fault` can inject."""

_FAULT_KINDS: Final = (
    "status", "drop", "drop_mid_stream", "truncate", "html", "bad_json", "wrong_shape", "oversize", "delay", "linger"
)  # fmt: skip
_BAD_JSON: Final = (
    b'{"id":"chatcmpl-bad","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x"}'
)
"""Malformed JSON (an object and a list never closed), as a broken server or proxy sends it."""

_MAX_BODY: Final = 64 * 1024 * 1024
"""Largest accepted request body, in bytes."""
_MAX_FAILURE_LOGS: Final = 20
"""Script failures logged with a traceback; later ones are only answered with 500."""
_ROLLOUT_PATH_RE: Final = re.compile(r"/rollouts/([^/]+)/")
_WRITE_CHUNK: Final = 1 << 20


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


def _check_size(instance: Fault, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"Fault.size must be >= 1, got {value!r}")


@attrs.frozen
class Fault:
    """An injected failure.

    * ``"status"``: answer with HTTP ``status`` and an OpenAI-style JSON error body carrying ``message``.
    * ``"drop"``: read the whole request, then close the connection without answering.
    * ``"drop_mid_stream"``: send the response headers and the start of the body, then abort the
      connection (for streams: the first SSE chunks and no terminating chunk; otherwise half the body).
    * ``"truncate"``: a well-formed HTTP response whose answer stops early: a stream that ends
      after its first chunks with no ``finish_reason`` and no ``[DONE]``; a JSON body cut in half.
    * ``"html"``: status 200 with an HTML page (``text/html``), as a misconfigured proxy sends.
    * ``"bad_json"``: status 200 with malformed JSON: for a stream, one event (after the role
      chunk) whose data does not parse, then the rest of the answer and ``[DONE]``; otherwise a
      complete ``application/json`` body that does not parse.
    * ``"wrong_shape"``: status 200 with well-formed JSON that is not a chat completion:
      ``document`` (default ``{"hello": "world"}``) as the body, or, for a stream, as the event
      after the role chunk (then the rest of the answer and ``[DONE]``). E.g.
      ``document={"choices": {}}`` (choices not a list) or ``{"choices": [{"index": 0}]}`` (no
      message or delta).
    * ``"oversize"``: a completion whose content is ``size`` bytes, sent chunked (no length
      announced), written a megabyte at a time without the server holding it; streamed, as events
      of a megabyte of content each (as a server streams a long answer: a client that stops
      reading holds it back).
    * ``"delay"``: wait ``delay`` extra seconds, then answer normally.
    * ``"linger"``: answer normally, whole, then hold the connection ``delay`` seconds before ending
      the answer, as a busy server or a proxy does: a stream's ``[DONE]`` comes, its last chunk
      ``delay`` later; a whole answer is sent chunked, its last chunk ``delay`` later.
    """

    kind: FaultKind = attrs.field(validator=attrs.validators.in_(_FAULT_KINDS))
    status: int = attrs.field(default=500, validator=_check_status)
    delay: float = attrs.field(default=0.0, validator=_check_delay)
    message: str = "injected fault"
    size: int = attrs.field(default=100 * 1024 * 1024, validator=_check_size)
    document: Any = attrs.field(factory=lambda: {"hello": "world"}, hash=False)
    """The JSON a ``"wrong_shape"`` fault sends."""


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
"""A policy script: takes the parsed chat-completions request (messages, tools, ...) and returns the reply."""


# ---------------------------------------------------------------------------------------------------
# Chat-completion documents
# ---------------------------------------------------------------------------------------------------

_ERROR_TYPES: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def _error_doc(status: int, message: str) -> dict[str, Any]:
    """An OpenAI-style error document."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


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


def _stream_events(
    reply: Reply, model: str, request_bytes: int, include_usage: bool, tokens: TokenAnswer | None = None
) -> list[bytes]:
    """The SSE events (each ``data: ...\\n\\n``) of a streamed reply, ending with ``[DONE]``.

    With ``tokens``, each chunk carries the token fields of what it adds (vLLM's stream shape)."""
    cid = "chatcmpl-" + secrets.token_hex(12)
    created = int(time.time())
    position = 0

    def chunk(
        delta: dict[str, Any], finish_reason: str | None = None, pairs: list[tuple[str, int]] | None = None
    ) -> bytes:
        nonlocal position
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        doc = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
        if tokens is not None:
            if position == 0 and tokens.return_ids and "role" in delta:
                doc["prompt_token_ids"] = tokens.prompt_ids
            choice.update(tokens.fields(pairs or [], position))
            position += len(pairs or [])
        return b"data: " + _dumps(doc) + b"\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    if tokens is None:
        events.extend(chunk({"content": piece}) for piece in _split_content(reply.content or ""))
    else:  # token-aligned deltas
        step = max(1, -(-len(tokens.content) // 4))
        for i in range(0, len(tokens.content), step):
            group = tokens.content[i : i + step]
            events.append(chunk({"content": "".join(piece for piece, _ in group)}, pairs=group))
    for index, tc in enumerate(reply.tool_calls):
        first: dict[str, Any] = {"index": index}
        if tc.id is not None:
            first["id"] = tc.id
        first["type"] = "function"
        first["function"] = {"name": tc.name, "arguments": ""}
        events.append(chunk({"tool_calls": [first]}))
        arguments = {"tool_calls": [{"index": index, "function": {"arguments": tc.arguments_json()}}]}
        events.append(chunk(arguments, pairs=tokens.tool_calls[index] if tokens is not None else None))
    events.append(chunk({}, reply.effective_finish_reason(), pairs=tokens.end if tokens is not None else None))
    if include_usage:
        usage = _usage(reply, request_bytes)
        if tokens is not None:
            tokens.count(usage)
        doc = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
        events.append(b"data: " + _dumps(doc) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


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
        flavor: Flavor = "openai",
    ) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"flavor must be one of {', '.join(FLAVORS)}, got {flavor!r}")
        self.flavor: Flavor = flavor
        """How token requests are answered (:mod:`osmosis_core.testing.stub_tokens`): ``openai`` (text
        only, the default), ``vllm`` (prompt ids, generated ids, logprobs), ``drifting`` (``vllm`` over
        a template that strips past ``<think>`` blocks)."""
        self._script: Script = script if script is not None else _default_script()
        self.latency = latency
        self._host = "127.0.0.1" if host == "localhost" else host
        self._requested_port = port
        self._api_key = api_key
        self.model = model
        self._lock = threading.Lock()
        self._log: deque[LoggedRequest] = deque(maxlen=max_logged)
        self._faults: list[_PendingFault] = []
        self._runner: web.BaseRunner | None = None
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

    # -- request handling (on the server's event loop) -----------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        from aiohttp import web

        path = unquote(request.path)
        if _is_chat_path(path):
            if request.method != "POST":
                return _error(405, f"method {request.method} not allowed", headers={"Allow": "POST"})
            return await self._chat(request, path)
        if _is_models_path(path) or path == "/health":
            if request.method not in ("GET", "HEAD"):
                return _error(405, f"method {request.method} not allowed", headers={"Allow": "GET"})
            if path == "/health":
                return web.json_response({"status": "ok"})
            if self._api_key is not None and not _bearer_ok(request.headers.get("Authorization"), self._api_key):
                return _unauthorized()
            models = [{"id": self.model, "object": "model", "created": 0, "owned_by": "osmosis"}]
            return web.json_response({"object": "list", "data": models})
        return _error(404, f"not found: {request.method} {request.path}")

    async def _chat(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        from aiohttp import web

        auth = request.headers.get("Authorization")
        rollout_id = request.headers.get("X-Osmosis-Rollout-Id") or None
        if rollout_id is None:
            match = _ROLLOUT_PATH_RE.search(path)
            rollout_id = match.group(1) if match else None
        raw = await request.read()
        body: dict[str, Any] = {}
        problem: str | None = None
        try:
            parsed = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            problem = f"request body is not valid JSON: {exc}"
        else:
            if not isinstance(parsed, dict):
                problem = "request body must be a JSON object"
            else:
                body = parsed
                if not isinstance(body.get("messages"), list):
                    problem = "'messages' is a required property and must be an array"
        stream = body.get("stream") is True

        def log(status: int, fault: str | None = None) -> None:
            self._record(LoggedRequest(rollout_id, path, body, stream, auth is not None, status, fault))

        if self._api_key is not None and not _bearer_ok(auth, self._api_key):
            log(401)
            return _unauthorized()
        if problem is not None:
            log(400)
            return _error(400, problem)

        fault = self._take_fault(rollout_id)
        kind = fault.kind if fault is not None else None
        delay = self._latency + (fault.delay if fault is not None and kind == "delay" else 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        if fault is not None and kind == "status":
            log(fault.status, kind)
            return _error(fault.status, fault.message)
        if kind == "drop":
            log(0, kind)
            return _drop(request)
        if kind == "html":
            log(200, kind)
            page = "<!DOCTYPE html><html><head><title>Welcome</title></head><body>It works!</body></html>"
            return web.Response(status=200, text=page, content_type="text/html")

        try:
            reply = self._script(body)
            if not isinstance(reply, Reply):
                raise TypeError(f"script returned {type(reply).__name__}, expected Reply")
        except Exception as exc:
            self._script_failures += 1
            if self._script_failures <= _MAX_FAILURE_LOGS:  # bounded: a child's stderr may be an unread pipe
                _log.exception("stub policy script failed")
            log(500)
            return _error(500, f"policy script failed: {exc!r}")

        model = body.get("model")
        if not isinstance(model, str) or not model:
            model = self.model
        tokens = None
        if self.flavor != "openai":
            if self.flavor == "drifting":
                reply = attrs.evolve(reply, content=THINK_BLOCK + (reply.content or ""))
            calls = [(tc.name, tc.arguments_json()) for tc in reply.tool_calls]
            tokens = token_answer(body, reply.content, calls, self.flavor)
        log(200, kind)
        if kind == "oversize":
            assert fault is not None
            return await _oversize(request, fault.size, model, stream)
        if stream:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            events = _stream_events(reply, model, len(raw), include_usage, tokens)
            response = web.StreamResponse(status=200, headers={"Cache-Control": "no-cache"})
            response.content_type = "text/event-stream"
            response.charset = "utf-8"
            await response.prepare(request)
            if kind is None:
                await response.write(b"".join(events))
            elif kind == "linger":
                assert fault is not None
                await response.write(b"".join(events))
                await asyncio.sleep(fault.delay)
            elif kind in ("drop_mid_stream", "truncate"):
                await response.write(b"".join(events[:2]))  # the role chunk and the first content or tool chunk
                if kind == "drop_mid_stream":
                    return _abort(request, response)
            elif kind in ("bad_json", "wrong_shape"):
                assert fault is not None
                bad = _BAD_JSON if kind == "bad_json" else _dumps(fault.document)
                await response.write(b"".join([events[0], b"data: " + bad + b"\n\n", *events[1:]]))
            else:
                await response.write(b"".join(events))
            await response.write_eof()
            return response
        if kind in ("bad_json", "wrong_shape"):
            assert fault is not None
            bad = _BAD_JSON if kind == "bad_json" else _dumps(fault.document)
            return web.Response(status=200, body=bad, content_type="application/json")
        document = _completion_doc(reply, model, len(raw))
        if tokens is not None:
            tokens.decorate(document)
        data = _dumps(document)
        if kind == "truncate":
            return web.Response(status=200, body=data[: len(data) // 2], content_type="application/json")
        if kind == "linger":
            assert fault is not None
            response = web.StreamResponse(status=200)
            response.content_type = "application/json"
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(data)
            await asyncio.sleep(fault.delay)
            await response.write_eof()
            return response
        if kind == "drop_mid_stream":
            response = web.StreamResponse(status=200)
            response.content_type = "application/json"
            response.content_length = len(data)
            await response.prepare(request)
            await response.write(data[: len(data) // 2])
            return _abort(request, response)
        return web.Response(status=200, body=data, content_type="application/json")

    # -- lifecycle -----------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the server is listening."""
        return self._runner is not None

    async def start_async(self) -> None:
        """Start listening inside the running event loop."""
        from osmosis_core.http.server import start_http_server

        if self._runner is not None:
            raise RuntimeError("ScriptedPolicyServer is already running")
        # aiohttp's low-level server: the benches share their two cores with this stand-in
        self._runner, self._port = await start_http_server(
            self._handle, self._host, self._requested_port, max_body=_MAX_BODY
        )

    async def stop_async(self) -> None:
        """Stop listening and close every connection (pending responses are abandoned)."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        await runner.cleanup()
        self._port = None

    def start(self) -> ScriptedPolicyServer:
        """Serve from a daemon thread with its own event loop; returns once listening."""
        if self._thread is not None or self._runner is not None:
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
            if self._runner is not None:
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


def _error(status: int, message: str, *, headers: dict[str, str] | None = None) -> web.Response:
    from aiohttp import web

    body = _dumps(_error_doc(status, message))
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def _unauthorized() -> web.Response:
    return _error(401, "invalid or missing API key", headers={"WWW-Authenticate": 'Bearer realm="osmosis"'})


async def _oversize(request: web.BaseRequest, size: int, model: str, stream: bool) -> web.StreamResponse:
    """A completion of ``size`` content bytes, chunked, written a megabyte at a time."""
    from aiohttp import web

    response = web.StreamResponse(status=200)
    response.content_type = "text/event-stream" if stream else "application/json"
    response.enable_chunked_encoding()
    await response.prepare(request)
    block = b"a" * _WRITE_CHUNK
    if stream:
        head = b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":' + _dumps(model)
        head += b',"choices":[{"index":0,"delta":{"content":"'
        tail = b'"},"finish_reason":null}]}\n\n'
    else:
        head = b'{"id":"x","object":"chat.completion","created":0,"model":' + _dumps(model)
        head += b',"choices":[{"index":0,"message":{"role":"assistant","content":"'
        tail = b'"},"finish_reason":"stop"}]}'
    sent = 0
    try:
        if stream:  # one event a megabyte: what a relay forwards as it comes
            while sent < size:
                piece = block[: min(_WRITE_CHUNK, size - sent)]
                await response.write(head + piece + tail)
                sent += len(piece)
            await response.write(b"data: [DONE]\n\n")
        else:
            await response.write(head)
            while sent < size:
                piece = block[: min(_WRITE_CHUNK, size - sent)]
                await response.write(piece)
                sent += len(piece)
            await response.write(tail)
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the client stopped reading, as it should
    return response


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
        latency=args.latency, host=args.host, port=args.port, api_key=args.api_key, max_logged=1000, flavor=args.flavor
    )
    await server.start_async()
    gc.freeze()  # start-up's objects live as long as the server: its collections need not scan them
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
    if args.watch_stdin:  # the parent holds the other end of our stdin: end-of-file is a SIGTERM
        from osmosis_core._engine.lifeline import signal_when_parent_gone

        signal_when_parent_gone(sys.stdin.fileno())
    print(f"osmosis stub policy listening on {server.url}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop_async()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the calculator script until SIGTERM/SIGINT (or end-of-file on stdin); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m osmosis_core.testing.policy_server",
        description="Scripted OpenAI-compatible chat-completions server (calculator script).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default: 0)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each response (default: 0)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    parser.add_argument(
        "--flavor", choices=FLAVORS, default="openai", help="how token requests are answered (default: openai)"
    )
    parser.add_argument(
        "--watch-stdin", action="store_true", help="exit when standard input reaches end-of-file (the parent died)"
    )
    args = parser.parse_args(argv)
    if not _is_loopback(args.host) and not args.api_key:
        parser.error(f"refusing to listen on non-loopback host {args.host!r} without --api-key")
    if not (math.isfinite(args.latency) and args.latency >= 0):
        parser.error("--latency must be a finite number >= 0")
    if not 0 <= args.port <= 65535:
        parser.error("--port must be between 0 and 65535")
    if args.watch_stdin:
        from osmosis_core._engine.lifeline import set_parent_death_signal

        set_parent_death_signal(signal.SIGTERM)
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
