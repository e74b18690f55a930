"""The policy gateway: an OpenAI-compatible proxy that records every model call of every rollout.

>>> async def main(upstream):                                            # doctest: +SKIP
...     async with PolicyGateway(upstream, adapter="vllm") as gateway:
...         policy = gateway.open_rollout("r-1")      # a PolicyEndpoint for that rollout alone
...         ...                                       # the rollout calls policy.chat_completions_url
...         trace = gateway.pop_trace("r-1")          # its RolloutTrace; the gateway forgets it

Routes (:mod:`osmosis_gateway.server`, loopback by default):

* ``POST /v1/rollouts/{rollout_id}/chat/completions``: the per-rollout route (what
  :meth:`PolicyGateway.open_rollout` hands out), also ``POST /v1/chat/completions`` with the
  ``X-Osmosis-Rollout-Id`` header. The caller needs ``Authorization: Bearer`` with that rollout's
  token (or the gateway's bearer); a rollout id that was not opened is refused (404), a token of
  another rollout too (403), no token at all with 401.
* ``POST /v1/rollouts`` ``{"rollout_id": ..., "policy_version": ...}`` opens a rollout over HTTP
  (gateway bearer): it answers ``{"rollout_id", "base_url", "api_key", "model"}``.
* ``GET /v1/rollouts/{rollout_id}/trace`` shows a trace; ``DELETE /v1/rollouts/{rollout_id}``
  takes it out (the gateway forgets the rollout). ``PUT /v1/policy_version`` sets the version
  recorded on later calls. ``GET /health`` needs no token.

Each call is forwarded with the upstream's key, which no rollout, trace, log line or error ever
holds. The adapter (:mod:`osmosis_gateway.adapters`) asks the upstream for token ids and logprobs
and takes them out of the answer again. A capture failure never fails the call; an upstream error
reaches the rollout as the upstream sent it. Either marks the rollout's trace incomplete.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator
from types import TracebackType
from typing import Any, Final
from urllib.parse import quote, unquote

import msgspec

from osmosis_core import PolicyEndpoint
from osmosis_core.plugin import (
    ResponseTooLarge,
    client_session,
    clip,
    proxy_options,
    read_limited,
)
from osmosis_gateway.adapters import (
    ADAPTERS,
    AdapterName,
    CallCapture,
    completion_events,
    json_bytes,
    json_bytes_kept,
    json_read,
    prepare_request,
)
from osmosis_gateway.server import HttpServer, Request, Response, StreamResponse
from osmosis_gateway.trace import RolloutTrace, TraceCall
from osmosis_gateway.upstream import UpstreamClient, UpstreamUnreachable

__all__ = ["POLICY_VERSION_FIELD", "POLICY_VERSION_HEADER", "ROLLOUT_ID_HEADER", "PolicyGateway"]

ROLLOUT_ID_HEADER: Final = "X-Osmosis-Rollout-Id"
POLICY_VERSION_HEADER: Final = "X-Osmosis-Policy-Version"
"""A trainer tags a call with the policy version that serves it (recorded per call)."""
POLICY_VERSION_FIELD: Final = "osmosis_policy_version"
"""The same as a request field (taken out before the request goes upstream)."""

_ROLLOUT_ROUTE: Final = re.compile(r"^/v1/rollouts/([^/]+)(/.*)?$")
_CHAT_PATHS: Final = ("/v1/chat/completions", "/chat/completions")
"""The model call's paths: after ``/v1/rollouts/{id}``, or alone with the rollout id header."""
_MAX_BODY: Final = 64 * 1024 * 1024
_ROLLOUT_ID_KEY: Final = ROLLOUT_ID_HEADER.lower()
_POLICY_VERSION_KEY: Final = POLICY_VERSION_HEADER.lower()
_EVENT_STREAM: Final = "text/event-stream; charset=utf-8"
_NO_CACHE: Final = {"Cache-Control": "no-cache"}
_ERROR_CHARS: Final = 500


_dumps: Final = json_bytes
_decode: Final = json_read


def _loads(raw: bytes) -> tuple[Any, bool]:
    """A JSON document and whether json read it: msgspec reads what an OpenAI client sends, and
    json what msgspec refuses (NaN, Infinity), with json's error for what is no JSON.

    :raises ValueError: not JSON.
    """
    try:
        return _decode(raw), False
    except msgspec.DecodeError:
        return json.loads(raw), True


_REQUEST: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_READ_FIELDS: Final = (
    "model",
    "stream",
    "stream_options",
    "n",
    "return_token_ids",
    "logprobs",
    "return_tokens_as_token_ids",
    POLICY_VERSION_FIELD,
)
"""The request fields the gateway reads (the adapters' too); the rest (``messages``, ``tools``) stays JSON text."""
_LIST_START: Final = ord("[")


def _read_request(raw: bytes) -> tuple[dict[str, Any], bool]:
    """A chat-completions request and whether json read it. msgspec reads its fields as JSON text
    and decodes only :data:`_READ_FIELDS` (the messages go on, and into the trace, as the text they
    are); json reads what msgspec refuses, whole.

    :raises ValueError: not JSON, not an object, or no ``messages`` array.
    """
    try:
        body: dict[str, Any] = _REQUEST.decode(raw)
    except msgspec.DecodeError:  # not an object of JSON fields, or JSON msgspec refuses: json decides
        body, by_json = json.loads(raw), True
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise ValueError("expected a JSON object with a 'messages' array") from None
        return body, by_json
    messages = body.get("messages")
    if messages is None or memoryview(messages)[0] != _LIST_START:
        raise ValueError("expected a JSON object with a 'messages' array")
    for key in _READ_FIELDS:
        value = body.get(key)
        if value is not None:
            body[key] = _decode(value)
    return body, False


def _error(status: int, message: str, **headers: str) -> Response:
    kind = "authentication_error" if status == 401 else "invalid_request_error" if status < 500 else "server_error"
    body = _dumps({"error": {"message": message, "type": kind, "param": None, "code": status}})
    return Response(status, body, content_type="application/json", headers=headers or None)


def _json(data: object, status: int = 200) -> Response:
    return Response(status, _dumps(data), content_type="application/json")


def _bearer(headers: dict[str, str]) -> str | None:
    header = headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _detail(content: bytes) -> str:
    """What an upstream error body says (its ``error.message`` when it is OpenAI-shaped)."""
    try:
        data = json.loads(content[:65536])
    except ValueError:
        return content[:2000].decode("utf-8", "replace").strip() or "(empty body)"
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


async def _aiohttp_pieces(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """aiohttp's stream of an answer's pieces, its failures as the lean client's (``ConnectionError``)."""
    from aiohttp import ClientError

    try:
        async for piece in pieces:
            yield piece
    except ClientError as exc:
        if isinstance(exc, OSError):
            raise
        raise ConnectionResetError(f"{type(exc).__name__}: {exc}") from exc


class _Slot:
    """One open rollout: its token, its trace, its policy version."""

    __slots__ = ("next_index", "policy_version", "token", "trace")

    def __init__(self, rollout_id: str, token: str, capture: str, policy_version: str | None) -> None:
        self.token = token
        self.trace = RolloutTrace(rollout_id, capture="text" if capture == "openai" else "tokens")
        self.policy_version = policy_version
        self.next_index = 0


class PolicyGateway:
    """An OpenAI-compatible proxy in front of ``upstream`` that records each rollout's calls.

    :param upstream: the inference server (its key and headers stay in the gateway).
    :param adapter: how to ask it for tokens: ``vllm``, ``sglang`` or ``openai`` (text only).
    :param host: the address to listen on; anything but loopback needs an explicit ``bearer``
        (it is required on every route but ``/health`` anyway).
    :param bearer: the gateway's own token (the run's); made up when not given.
    :param policy_version: recorded on calls that name none (settable later: :attr:`policy_version`).
    :param lean_client: call a plain-http upstream without a proxy with the small keep-alive client
        of :mod:`osmosis_gateway.upstream` (whole answers and streams; a fraction of aiohttp's CPU
        per call); False sends every call through aiohttp's client, as https and proxies go.
    """

    def __init__(
        self,
        upstream: PolicyEndpoint,
        *,
        adapter: AdapterName = "vllm",
        host: str = "127.0.0.1",
        port: int = 0,
        bearer: str | None = None,
        policy_version: str | None = None,
        lean_client: bool = True,
    ) -> None:
        if adapter not in ADAPTERS:
            raise ValueError(f"adapter must be one of {', '.join(ADAPTERS)}, got {adapter!r}")
        self.upstream = upstream
        self.adapter: AdapterName = adapter
        self.policy_version = policy_version
        self.bearer = bearer or secrets.token_urlsafe(24)
        self._host = host
        self._requested_port = port
        self._slots: dict[str, _Slot] = {}
        self._secrets = (*upstream.secrets(), self.bearer)
        self._upstream_url = upstream.chat_completions_url
        self._proxy: dict[str, Any] = {}
        self._upstream_headers = {"Content-Type": "application/json", **upstream.headers}
        if upstream.api_key:
            self._upstream_headers["Authorization"] = f"Bearer {upstream.api_key}"
        self._server: HttpServer | None = None
        self._lean_client = lean_client
        self._lean: UpstreamClient | None = None
        self._port: int | None = None

    def __repr__(self) -> str:
        where = self.url if self._port is not None else "stopped"
        return f"<PolicyGateway {where} adapter={self.adapter} upstream={self.upstream.base_url}>"

    # -- the in-process API ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The gateway's OpenAI base URL, ``http://127.0.0.1:PORT/v1``."""
        if self._port is None:
            raise RuntimeError("the gateway is not running")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}/v1"

    def open_rollout(self, rollout_id: str, *, policy_version: str | None = None) -> PolicyEndpoint:
        """Register a rollout; return the endpoint its model calls go to (its own URL and token).

        :raises ValueError: the rollout is already open (an id names one rollout).
        """
        if not rollout_id:
            raise ValueError("a rollout id must not be empty")
        if rollout_id in self._slots:
            raise ValueError(f"rollout {rollout_id!r} is already open on this gateway")
        token = secrets.token_urlsafe(18)
        self._slots[rollout_id] = _Slot(rollout_id, token, self.adapter, policy_version)
        return PolicyEndpoint(
            f"{self.url}/rollouts/{quote(rollout_id, safe='')}",
            self.upstream.model,
            token,
            max_response_bytes=self.upstream.max_response_bytes,
        )

    def trace(self, rollout_id: str) -> RolloutTrace | None:
        """The trace of an open rollout so far (None when it is not open)."""
        slot = self._slots.get(rollout_id)
        return slot.trace if slot is not None else None

    def pop_trace(self, rollout_id: str) -> RolloutTrace | None:
        """Take a rollout's trace out and close the rollout (later calls of it are refused)."""
        slot = self._slots.pop(rollout_id, None)
        return slot.trace if slot is not None else None

    @property
    def open_rollouts(self) -> int:
        """Rollouts opened and not yet popped."""
        return len(self._slots)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> PolicyGateway:
        """Listen (inside the running event loop)."""
        if self._server is not None:
            raise RuntimeError("the gateway is already running")
        # the upstream is fixed: its proxy (HTTP(S)_PROXY, NO_PROXY) is worked out once, not per call
        proxy = proxy_options(self._upstream_url)
        self._proxy = proxy or {"proxy": None}
        if not proxy and self._lean_client:
            # a plain-http upstream: the lean client (a fraction of aiohttp's CPU per call)
            limit = self.upstream.max_response_bytes
            try:
                self._lean = UpstreamClient(self._upstream_url, self._upstream_headers, limit)
            except ValueError:  # not plain http, or a header it cannot write (not latin-1): aiohttp's client
                self._lean = None
        server = HttpServer(self._handle, max_body=_MAX_BODY, precheck=self._precheck)
        self._server = await server.start(self._host, self._requested_port)
        self._port = self._server.port
        return self

    async def aclose(self) -> None:
        """Stop listening (calls in flight are cut)."""
        server, self._server = self._server, None
        lean, self._lean = self._lean, None
        if lean is not None:
            lean.close()
        if server is not None:
            await server.close()
        self._port = None

    async def __aenter__(self) -> PolicyGateway:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- routes ------------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response | StreamResponse:
        if request.context is not None:  # a model call, authorized by _precheck from its head
            rollout_id, slot = request.context
            return await self._chat(request, rollout_id, slot)
        # (a model call _precheck refused was answered from its head: what is left is routed here)
        path = request.path
        method = request.method
        if path == "/health":
            return _json({"status": "ok"})
        match = _ROLLOUT_ROUTE.match(path)
        if match is not None:
            rollout_id, tail = unquote(match.group(1)), match.group(2) or ""
            if tail in ("/models", "/v1/models") and method == "GET":
                return self._models(request, rollout_id)
            if tail == "/trace" and method == "GET":
                return self._admin(request) or self._trace(rollout_id, pop=False)
            if tail == "" and method == "DELETE":
                return self._admin(request) or self._trace(rollout_id, pop=True)
        elif path in _CHAT_PATHS and method == "POST":  # (with the rollout id header it was a model call)
            return _error(
                400, f"no rollout: use /v1/rollouts/{{id}}/chat/completions or the {ROLLOUT_ID_HEADER} header"
            )
        elif path == "/v1/rollouts" and method == "POST":
            return self._admin(request) or await self._open(request)
        elif path == "/v1/policy_version" and method == "PUT":
            return self._admin(request) or await self._set_version(request)
        return _error(404, f"not found: {method} {request.path}")

    def _precheck(self, method: str, path: str, headers: dict[str, str]) -> Response | tuple[str, _Slot] | None:
        """A model call's rollout and slot, or its refusal when its token opens no such rollout, from
        its head alone (a refused body, up to 64 MiB, is dropped unread); None: :meth:`_handle` routes."""
        if method != "POST":
            return None
        match = _ROLLOUT_ROUTE.match(path)
        if match is not None:
            if (match.group(2) or "") not in _CHAT_PATHS:
                return None
            rollout_id = unquote(match.group(1))
        elif path in _CHAT_PATHS:
            rollout_id = headers.get(_ROLLOUT_ID_KEY, "")
            if not rollout_id:
                return None  # (_handle answers 400)
        else:
            return None
        slot, refused = self._authorize(headers, rollout_id)
        return refused if slot is None else (rollout_id, slot)

    def _admin(self, request: Request) -> Response | None:
        """None when the request carries the gateway's bearer, else the refusal."""
        token = _bearer(request.headers)
        if token is None:
            return _error(401, "missing bearer token", **{"WWW-Authenticate": 'Bearer realm="osmosis-gateway"'})
        if not _same(token, self.bearer):
            return _error(403, "this route needs the gateway's bearer token")
        return None

    def _authorize(self, headers: dict[str, str], rollout_id: str) -> tuple[_Slot | None, Response | None]:
        """The rollout's slot when the caller may write to it, else the refusal."""
        token = _bearer(headers)
        if token is None:
            return None, _error(401, "missing bearer token", **{"WWW-Authenticate": 'Bearer realm="osmosis-gateway"'})
        slot = self._slots.get(rollout_id)
        if slot is not None and _same(token, slot.token):  # the rollout's own token (the usual case)
            header = headers.get(_ROLLOUT_ID_KEY)
            if header is not None and header != rollout_id:
                return None, _error(403, f"the {ROLLOUT_ID_HEADER} header names another rollout than the path")
            return slot, None
        if _same(token, self.bearer):
            if slot is None:
                return None, _error(404, f"rollout {rollout_id!r} is not open on this gateway")
            return slot, None
        return None, _error(403, f"this token does not open rollout {rollout_id!r}")

    def _models(self, request: Request, rollout_id: str) -> Response:
        _, refused = self._authorize(request.headers, rollout_id)
        if refused is not None:
            return refused
        model = {"id": self.upstream.model, "object": "model", "created": 0, "owned_by": "osmosis-gateway"}
        return _json({"object": "list", "data": [model]})

    def _trace(self, rollout_id: str, *, pop: bool) -> Response:
        trace = self.pop_trace(rollout_id) if pop else self.trace(rollout_id)
        if trace is None:
            return _error(404, f"rollout {rollout_id!r} is not open on this gateway")
        return _json(trace.to_json())

    async def _open(self, request: Request) -> Response:
        try:
            data = json.loads(request.body)
            rollout_id = data["rollout_id"]
            version = data.get("policy_version")
            if not isinstance(rollout_id, str) or not (version is None or isinstance(version, str)):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError):
            return _error(400, 'expected {"rollout_id": "<string>", "policy_version": "<string, optional>"}')
        try:
            policy = self.open_rollout(rollout_id, policy_version=version)
        except ValueError as exc:
            return _error(409, str(exc))
        return _json(
            {"rollout_id": rollout_id, "base_url": policy.base_url, "api_key": policy.api_key, "model": policy.model},
            201,
        )

    async def _set_version(self, request: Request) -> Response:
        try:
            version = json.loads(request.body)["policy_version"]
            if not (version is None or isinstance(version, str)):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return _error(400, 'expected {"policy_version": "<string or null>"}')
        self.policy_version = version
        return _json({"policy_version": version})

    # -- the model call ----------------------------------------------------------------------------

    async def _chat(self, request: Request, rollout_id: str, slot: _Slot) -> Response | StreamResponse:
        """A model call of ``rollout_id``, whose ``slot`` :meth:`_precheck` found from the head."""
        if self._slots.get(rollout_id) is not slot:  # the rollout closed while the body came: ask again
            found, refused = self._authorize(request.headers, rollout_id)
            if refused is not None:
                return refused
            assert found is not None
            slot = found
        trace = slot.trace
        started = time.perf_counter()
        call = TraceCall(call_id=f"{rollout_id}#{slot.next_index}", index=slot.next_index, started_at=time.time())
        slot.next_index += 1
        trace.calls.append(call)
        raw = request.body
        try:
            body, by_json = _read_request(raw)
        except ValueError as exc:
            self._finish(trace, call, started, "bad_request", f"not a chat-completions request: {exc}", 400)
            return _error(400, f"not a chat-completions request: {exc}")
        version = body.pop(POLICY_VERSION_FIELD, None)
        version = request.headers.get(_POLICY_VERSION_KEY) or version or slot.policy_version or self.policy_version
        call.policy_version = None if version is None else str(version)
        sent = {k: v for k, v in body.items() if k not in ("model", "stream")}
        call.request = sent if by_json else _dumps(sent)  # (JSON text, read when the trace is)
        call.model = body.get("model") if isinstance(body.get("model"), str) else None
        call.stream = stream = body.get("stream") is True
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        capture = prepare_request(body, self.adapter)  # (may ask for the whole answer instead of a stream)
        data = json_bytes_kept(body) if by_json else _dumps(body)
        if self._lean is not None:
            upstream_streams = body.get("stream") is True
            return await self._chat_lean(
                request, trace, call, capture, started, data, rollout_id, include_usage, upstream_streams
            )
        from aiohttp import ClientConnectorError, ClientError

        headers = dict(self._upstream_headers)
        headers[ROLLOUT_ID_HEADER] = rollout_id
        try:
            async with client_session().post(self._upstream_url, data=data, headers=headers, **self._proxy) as upstream:
                status = upstream.status
                kind = upstream.headers.get("Content-Type", "")
                if stream and status == 200 and kind.startswith("text/event-stream"):
                    pieces = _aiohttp_pieces(upstream.content.iter_any())
                    return await self._relay(request, status, pieces, capture, trace, call, started)
                content = await read_limited(upstream, self.upstream.max_response_bytes)
        except ClientConnectorError as exc:
            return self._failed(request, trace, call, started, exc, unreachable=True)
        except (ResponseTooLarge, TimeoutError, ClientError, OSError) as exc:
            return self._failed(request, trace, call, started, exc, unreachable=False)
        if stream and body.get("stream") is not True and status == 200:
            return await self._stream_whole(request, trace, call, capture, started, content, include_usage)
        return self._answer(trace, call, capture, started, status, kind, content)

    async def _chat_lean(
        self,
        request: Request,
        trace: RolloutTrace,
        call: TraceCall,
        capture: CallCapture,
        started: float,
        data: bytes,
        rollout_id: str,
        include_usage: bool,
        upstream_streams: bool,
    ) -> Response | StreamResponse:
        """:meth:`_chat`'s upstream call on a plain-http upstream (the same outcomes, through
        :class:`~osmosis_gateway.upstream.UpstreamClient`): a whole answer, or a stream relayed as it comes."""
        assert self._lean is not None
        try:
            if not upstream_streams:
                status, kind, content = await self._lean.post(rollout_id, data)
            else:
                answer = await self._lean.stream(rollout_id, data)
                try:
                    status, kind = answer.status, answer.content_type
                    if status == 200 and kind.startswith("text/event-stream"):
                        return await self._relay(request, status, answer, capture, trace, call, started)
                    content = await answer.read()
                finally:
                    answer.close()
        except UpstreamUnreachable as exc:
            return self._failed(request, trace, call, started, exc, unreachable=True)
        except (ResponseTooLarge, TimeoutError, OSError, ValueError) as exc:
            return self._failed(request, trace, call, started, exc, unreachable=False)
        if call.stream and not upstream_streams and status == 200:
            return await self._stream_whole(request, trace, call, capture, started, content, include_usage)
        return self._answer(trace, call, capture, started, status, kind, content)

    def _failed(
        self,
        request: Request,
        trace: RolloutTrace,
        call: TraceCall,
        started: float,
        exc: BaseException,
        *,
        unreachable: bool,
    ) -> Response | StreamResponse:
        """What the rollout gets when the upstream call failed: a 502 when the upstream could not be
        reached or its answer is too large; else the upstream dropped the call, and so does the
        gateway (the rollout sees what it would have)."""
        if unreachable:
            message = clip(f"the gateway cannot reach the upstream: {exc}", self._secrets, _ERROR_CHARS)
            self._finish(trace, call, started, "upstream_error", message, 502)
            return _error(502, message)
        if isinstance(exc, ResponseTooLarge):
            self._finish(trace, call, started, "upstream_error", f"the upstream's answer is too large: {exc}", 502)
            return _error(502, f"the upstream's answer is too large: {exc}")
        what = clip(f"the upstream dropped the call: {type(exc).__name__}: {exc}", self._secrets, _ERROR_CHARS)
        self._finish(trace, call, started, "cut", what, None)
        return request.drop()

    def _answer(
        self,
        trace: RolloutTrace,
        call: TraceCall,
        capture: CallCapture,
        started: float,
        status: int,
        kind: str,
        content: bytes,
    ) -> Response:
        content_type = kind.split(";", 1)[0].strip() or "application/octet-stream"
        if status >= 400:
            message = clip(f"the upstream answered {status}: {_detail(content)}", self._secrets, _ERROR_CHARS)
            self._finish(trace, call, started, "upstream_error", message, status)
            return Response(status, content, content_type=content_type)
        try:
            stripped = capture.feed_bytes(content, chunk=False)
        except ValueError:
            problem = f"the upstream's answer ({content_type}, {len(content)} bytes) is not valid JSON"
            self._finish(trace, call, started, "capture_failed", problem, status)
            return Response(status, content, content_type=content_type)
        if stripped is not None:
            content = stripped
        self._complete(trace, call, capture, started, status)
        return Response(status, content, content_type=content_type)

    async def _stream_whole(
        self,
        request: Request,
        trace: RolloutTrace,
        call: TraceCall,
        capture: CallCapture,
        started: float,
        content: bytes,
        include_usage: bool,
    ) -> Response | StreamResponse:
        """A whole answer streamed to a rollout that asked for a stream (the upstream cannot give ids
        in one)."""
        try:
            doc, _ = _loads(content)
            if not isinstance(doc, dict):
                raise ValueError("not an object")
        except ValueError:
            problem = f"the upstream's answer ({len(content)} bytes) is not a JSON completion"
            self._finish(trace, call, started, "capture_failed", problem, 200)
            return Response(200, content, content_type="application/json")
        capture.feed(doc, chunk=False)
        events = completion_events(doc, include_usage=include_usage)
        body = b"".join(b"data: " + _dumps(event) + b"\n\n" for event in events) + b"data: [DONE]\n\n"
        response = StreamResponse(200, content_type=_EVENT_STREAM, headers=_NO_CACHE)
        try:
            await response.prepare(request)
            await response.write(body)
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            self._finish(trace, call, started, "client_gone", "the rollout hung up before the answer", 200)
            return response
        self._complete(trace, call, capture, started, 200)
        return response

    async def _relay(
        self,
        request: Request,
        status: int,
        pieces: AsyncIterable[bytes],
        capture: CallCapture,
        trace: RolloutTrace,
        call: TraceCall,
        started: float,
    ) -> Response | StreamResponse:
        """Pass an event stream through, piece by piece as the upstream client gives them (either
        client's: ``ConnectionError`` or ``TimeoutError`` when the stream broke off), reading and
        stripping each event."""
        response = StreamResponse(status, content_type=_EVENT_STREAM, headers=_NO_CACHE)
        try:
            await response.prepare(request)
        except (ConnectionError, RuntimeError):
            self._finish(trace, call, started, "client_gone", "the rollout hung up before the answer", 200)
            return response
        pending = b""
        done = False
        try:
            async for data in pieces:
                lines = (pending + data).split(b"\n")
                pending = lines.pop()
                for i, line in enumerate(lines):
                    if line.startswith(b"data:"):
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            done = True
                        elif payload:
                            lines[i] = self._event(capture, payload) or line
                if not lines:
                    continue  # no whole line yet
                try:
                    await response.write(b"\n".join(lines) + b"\n")
                except (ConnectionError, RuntimeError):
                    self._finish(trace, call, started, "client_gone", "the rollout hung up mid-stream", 200)
                    return response
        except (TimeoutError, OSError) as exc:
            what = clip(f"the upstream's stream broke off: {type(exc).__name__}: {exc}", self._secrets, _ERROR_CHARS)
            self._finish(trace, call, started, "cut", what, 200)
            return response.cut()
        try:
            if pending:
                await response.write(pending)
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            self._finish(trace, call, started, "client_gone", "the rollout hung up mid-stream", 200)
            return response
        if not done:
            self._finish(trace, call, started, "cut", "the upstream's stream ended without [DONE]", 200)
            return response
        self._complete(trace, call, capture, started, 200)
        return response

    def _event(self, capture: CallCapture, payload: bytes) -> bytes | None:
        """One event's data read into the capture; the rewritten line when the gateway took something out."""
        try:
            stripped = capture.feed_bytes(payload, chunk=True)
        except ValueError:
            capture.fail("a stream event is not valid JSON")
            return None
        return None if stripped is None else b"data: " + stripped

    def _complete(
        self, trace: RolloutTrace, call: TraceCall, capture: CallCapture, started: float, status: int
    ) -> None:
        call.response = capture.message()
        call.finish_reason = capture.finish_reason
        call.usage = capture.usage
        if not capture.token_level:
            self._finish(
                trace, call, started, "ok" if capture.problem is None else "capture_failed", capture.problem, status
            )
            return
        tokens = capture.tokens()
        if tokens is None:
            self._finish(trace, call, started, "capture_failed", capture.problem, status)
            return
        call.prompt_token_ids, call.completion_token_ids, call.logprobs = tokens
        self._finish(trace, call, started, "ok", None, status)

    @staticmethod
    def _finish(
        trace: RolloutTrace, call: TraceCall, started: float, status: Any, error: str | None, http_status: int | None
    ) -> None:
        call.status = status
        call.error = error
        call.http_status = http_status
        call.latency_sec = time.perf_counter() - started
        if status != "ok":
            trace.mark_incomplete(f"call {call.index} {status.replace('_', ' ')}: {error}")
