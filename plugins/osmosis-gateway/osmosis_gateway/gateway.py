"""The policy gateway: an OpenAI-compatible proxy that records every model call of every rollout.

>>> async def main(upstream):                                            # doctest: +SKIP
...     async with PolicyGateway(upstream, adapter="vllm") as gateway:
...         policy = gateway.open_rollout("r-1")      # a PolicyEndpoint for that rollout alone
...         ...                                       # the rollout calls policy.chat_completions_url
...         trace = gateway.pop_trace("r-1")          # its RolloutTrace; the gateway forgets it

Routes (aiohttp's server, loopback by default):

* ``POST /v1/rollouts/{rollout_id}/chat/completions``: the per-rollout route (what
  :meth:`PolicyGateway.open_rollout` hands out), also ``POST /v1/chat/completions`` with the
  ``X-Osmosis-Rollout-Id`` header. The caller needs ``Authorization: Bearer`` with that rollout's
  token (or the gateway's bearer); a rollout id that was not opened is refused (404), a token of
  another rollout too (403), no token at all with 401. The refusal is decided from the request's
  head: the body of a refused call is never held (aiohttp reads and drops it, then closes).
* ``POST /v1/rollouts`` ``{"rollout_id": ..., "policy_version": ..., "sampling": {...}}`` opens a
  rollout over HTTP (gateway bearer): it answers ``{"rollout_id", "base_url", "api_key", "model"}``.
* ``GET /v1/rollouts/{rollout_id}/trace`` shows a trace; ``DELETE /v1/rollouts/{rollout_id}``
  takes it out (the gateway forgets the rollout). ``PUT /v1/policy_version`` sets the version
  recorded on later calls. ``GET /health`` needs no token.

A trainer's sampling settings (``open_rollout(id, sampling=...)``, over the upstream endpoint's own
``sampling``) are set on each call of the rollout over what it sent (:mod:`osmosis_core.sampling`):
the trace keeps the rollout's request as sent, and the settings applied in ``TraceCall.sampling``.

Each call is forwarded with the upstream's key, which no rollout, trace, log line or error ever
holds (:mod:`osmosis_gateway.call` says how a call is sent, answered and recorded). The adapter
(:mod:`osmosis_gateway.adapters`) asks the upstream for token ids and logprobs and takes them out of
the answer again. A capture failure never fails the call; an upstream error reaches the rollout as
the upstream sent it (redacted). Either marks the rollout's trace incomplete, and so does a call
that never completed.

HTTP is aiohttp's, both ways: its low-level server (keep-alive, pipelining, flow control, limits;
a request line or header over 64 KiB gets 431, a body over 64 MiB 413; a connection idle 75 s is
closed) and the core's pooled client session (one path for plain http, https and proxies). One
process takes 0.26-0.30 ms of CPU per whole call and about 0.4 ms per streamed one
(``bench/gateway_overhead.py`` on a quiet 2-core machine): some 3,000 calls a second per core.
Rollouts are independent, so more is more gateways, each a process (one per upstream, as ``osmosis
serve --traces`` keeps them, or one per trainer node), never a protocol of our own.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import secrets
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, unquote

import aiohttp
from aiohttp import web

from osmosis_core import PolicyEndpoint
from osmosis_core.http import KEEPALIVE_SEC, drop_connection, proxy_options, start_http_server
from osmosis_core.plugin import redact_data
from osmosis_core.sampling import check_sampling
from osmosis_gateway.adapters import ADAPTERS, TOKEN_IN_ADAPTERS, AdapterName, json_bytes
from osmosis_gateway.call import POLICY_VERSION_FIELD, POLICY_VERSION_HEADER, ModelCall, error_response
from osmosis_gateway.settings import READ_TIMEOUT_SEC
from osmosis_trainer.trace import RolloutTrace, TraceCall

if TYPE_CHECKING:
    from osmosis_gateway.token_in import Conversation, TokenIn

__all__ = [
    "POLICY_VERSION_FIELD",
    "POLICY_VERSION_HEADER",
    "READ_TIMEOUT_SEC",
    "ROLLOUT_ID_HEADER",
    "PolicyGateway",
    "check_rollout_id",
]

ROLLOUT_ID_HEADER: Final = "X-Osmosis-Rollout-Id"
CONNECT_TIMEOUT_SEC: Final = 30.0

log = logging.getLogger(__name__)

_ROLLOUT_ROUTE: Final = re.compile(r"^/v1/rollouts/([^/]+)(/.*)?$")
_CHAT_PATHS: Final = ("/v1/chat/completions", "/chat/completions")
"""The model call's paths: after ``/v1/rollouts/{id}``, or alone with the rollout id header."""
_MAX_BODY: Final = 64 * 1024 * 1024
_IDLE_SEC: Final = 75.0
"""A connection idle this long (nothing read, nothing being answered) is closed: aiohttp's server's
time before 3.12, longer than the clients' own (httpx 5 s, aiohttp 15 s)."""
_BODY_STALL_SEC: Final = 75.0
"""A request whose body stops coming for this long is given up and its connection closed."""
_BAD_ID_CHARS: Final = re.compile(r"[\x00-\x1f\x7f]")
MAX_ROLLOUT_ID_CHARS: Final = 1024
"""The longest rollout id (it travels in every call's URL and in a header upstream)."""
_CHALLENGE: Final = {"WWW-Authenticate": 'Bearer realm="osmosis-gateway"'}


def check_rollout_id(rollout_id: object) -> str:
    """``rollout_id`` when it can name a rollout: a non-empty string of at most
    :data:`MAX_ROLLOUT_ID_CHARS` characters, without control characters, and not ``.`` or ``..``
    (it travels in a header and as a segment of a URL: a line break there would make every call of
    the rollout fail, and clients resolve a dot segment away).

    :raises ValueError: why it cannot.
    """
    if not isinstance(rollout_id, str):
        raise ValueError(f"a rollout id must be a string, got {type(rollout_id).__name__}")
    if not rollout_id:
        raise ValueError("a rollout id must not be empty")
    if rollout_id in (".", ".."):
        raise ValueError(f"a rollout id must not be {rollout_id!r} (a URL's dot segment)")
    if len(rollout_id) > MAX_ROLLOUT_ID_CHARS:
        raise ValueError(f"a rollout id must be at most {MAX_ROLLOUT_ID_CHARS} characters, got {len(rollout_id)}")
    bad = _BAD_ID_CHARS.search(rollout_id)
    if bad is not None:
        raise ValueError(f"a rollout id must not hold control characters, got {bad.group()!r} in {rollout_id!r}")
    return rollout_id


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json_bytes(data), content_type="application/json")


def _bearer(request: web.BaseRequest) -> str | None:
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _same(a: str, b: str) -> bool:
    # (a header's bytes that are not UTF-8 come as surrogates: compared as the bytes they were)
    return hmac.compare_digest(a.encode("utf-8", "surrogateescape"), b.encode("utf-8", "surrogateescape"))


class Upstream:
    """What every call to the upstream is sent with: its URL, headers (the key), proxy, limits, and
    the gateway's own client session (no one else's ``aclose_http`` cuts its calls)."""

    __slots__ = (
        "adapter",
        "headers",
        "max_response_bytes",
        "model",
        "options",
        "read_timeout_sec",
        "secret_bytes",
        "secrets",
        "session",
        "token_in",
        "url",
    )

    def __init__(
        self, endpoint: PolicyEndpoint, adapter: AdapterName, read_timeout_sec: float, token_in: TokenIn | None = None
    ) -> None:
        from yarl import URL

        self.token_in = token_in
        """The engine's token route, renderer and tool parser (None: a chat upstream)."""
        url = endpoint.chat_completions_url if token_in is None else token_in.url(endpoint.base_url)
        self.url = URL(url)  # (parsed once, not per call)
        self.model = endpoint.model
        self.adapter = adapter
        self.headers = {"Content-Type": "application/json", **endpoint.headers}
        if endpoint.api_key:
            self.headers["Authorization"] = f"Bearer {endpoint.api_key}"
        self.secrets = endpoint.secrets()
        self.secret_bytes = tuple(
            dict.fromkeys(form for s in self.secrets for form in (s.encode(), json_bytes(s)[1:-1]))
        )
        """Each secret as UTF-8 and as JSON writes it (what an answer's bytes would hold)."""
        self.max_response_bytes = endpoint.max_response_bytes
        self.read_timeout_sec = read_timeout_sec
        # the upstream is fixed: its proxy (HTTP(S)_PROXY, NO_PROXY) is worked out once, not per call;
        # a redirect is not followed (it would carry the extra headers, secrets too, to another origin)
        proxy = proxy_options(str(self.url)) or {"proxy": None}
        self.options: dict[str, Any] = {"allow_redirects": False, **proxy}
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_SEC)
        self.session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_SEC, sock_read=read_timeout_sec),
        )
        """Pooled keep-alive connections, no cap on their number; one idle 4 s is closed, before
        uvicorn (vLLM, SGLang) closes it after 5 s, so a call does not go out on a connection the
        upstream is closing."""


class _Slot:
    """One open rollout: its token, its trace, its policy version and sampling settings, its calls in flight."""

    __slots__ = ("calls", "conversation", "next_index", "policy_version", "sampling", "token", "trace")

    def __init__(
        self,
        rollout_id: str,
        token: str,
        capture: str,
        policy_version: str | None,
        sampling: dict[str, Any] | None = None,
        conversation: Conversation | None = None,
    ) -> None:
        self.token = token
        self.conversation = conversation
        """On a token-in upstream, the rollout's answered calls (its next prompt extends them)."""
        self.trace = RolloutTrace(rollout_id, capture="text" if capture == "openai" else "tokens")
        self.policy_version = policy_version
        self.sampling = sampling
        """The trainer's settings, set on each call over the rollout's (None: the rollout's own go out)."""
        self.next_index = 0
        self.calls: dict[ModelCall, asyncio.Task[Any] | None] = {}
        """The calls in flight, and the task that answers each."""

    def close(self, why: str) -> None:
        """The rollout ends: each call in flight is recorded as cancelled (``why``), then cancelled
        (its upstream connection is closed)."""
        for call, task in self.calls.items():
            call.finish("cancelled", why, None)
            call.rollout_open = False
            if task is not None:
                task.cancel()
        self.calls.clear()


class PolicyGateway:
    """An OpenAI-compatible proxy in front of ``upstream`` that records each rollout's calls.

    :param upstream: the inference server (its key and headers stay in the gateway; its ``sampling``
        settings, if any, are set on every call, under a rollout's own).
    :param adapter: how to ask it for tokens: ``vllm``, ``sglang`` or ``openai`` (text only).
    :param host: the address to listen on (loopback by default). Every route but ``/health`` needs a
        token on any address: a rollout's own, or the gateway's ``bearer``. The URLs the gateway hands
        out name ``host`` as given, so give the address the rollouts reach it at (``10.0.0.5`` on a
        cluster's private network). A wildcard (``0.0.0.0``, ``::``) listens on every interface, and
        the URLs handed out then name ``127.0.0.1`` (``::1``): right for rollouts on this machine
        only; a rollout on another host needs the address it reaches (``host``), not the wildcard.
    :param bearer: the gateway's own token (the run's); made up when not given.
    :param policy_version: recorded on calls that name none (settable later: :attr:`policy_version`).
    :param read_timeout_sec: how long the upstream may send nothing before a call is given up.
    :param token_in: a token-in engine (:class:`~osmosis_gateway.token_in.TokenIn`, with
        ``adapter`` its engine's name): the gateway renders each call with the policy's tokenizer and
        sends ids to ``upstream.base_url``'s token route.
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
        read_timeout_sec: float = READ_TIMEOUT_SEC,
        token_in: TokenIn | None = None,
    ) -> None:
        if adapter not in ADAPTERS:
            raise ValueError(f"adapter must be one of {', '.join(ADAPTERS)}, got {adapter!r}")
        if (adapter in TOKEN_IN_ADAPTERS) != (token_in is not None and token_in.engine == adapter):
            raise ValueError(f"adapter {adapter!r} needs token_in of that engine (and only a token-in adapter has one)")
        self.token_in = token_in
        if not read_timeout_sec > 0:
            raise ValueError(f"read_timeout_sec must be positive, got {read_timeout_sec!r}")
        self.upstream = upstream
        self.adapter: AdapterName = adapter
        self.policy_version = policy_version
        self.bearer = bearer or secrets.token_urlsafe(24)
        self.read_timeout_sec = read_timeout_sec
        self._host = host
        self._requested_port = port
        self._slots: dict[str, _Slot] = {}
        self._upstream: Upstream | None = None
        self._runner: web.BaseRunner | None = None
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
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self._host, self._host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self._port}/v1"

    def open_rollout(
        self,
        rollout_id: str,
        *,
        policy_version: str | None = None,
        sampling: Mapping[str, Any] | None = None,
    ) -> PolicyEndpoint:
        """Register a rollout; return the endpoint its model calls go to (its own URL and token).

        :param policy_version: recorded on each call of the rollout (a call's own header or field wins).
        :param sampling: a trainer's sampling settings (:mod:`osmosis_core.sampling`), set on each call
            of the rollout over what it sends (and over the upstream endpoint's ``sampling``); the
            call's trace keeps the request as sent and the settings applied (``TraceCall.sampling``).
            The endpoint returned carries none: the gateway applies them.
        :raises ValueError: the id is empty or holds a control character (:func:`check_rollout_id`),
            the rollout is already open (an id names one rollout), or a sampling setting is unknown
            or out of its range (named).
        """
        check_rollout_id(rollout_id)
        if rollout_id in self._slots:
            raise ValueError(f"rollout {rollout_id!r} is already open on this gateway")
        applied = self.upstream.sampling
        if sampling is not None:
            applied = {**(applied or {}), **check_sampling(sampling)} or None
        token = secrets.token_urlsafe(18)
        conversation = None
        if self.token_in is not None:
            from osmosis_gateway.token_in import Conversation

            conversation = Conversation()
        self._slots[rollout_id] = _Slot(rollout_id, token, self.adapter, policy_version, applied, conversation)
        return PolicyEndpoint(
            f"{self.url}/rollouts/{quote(rollout_id, safe='')}",
            self.upstream.model,
            token,
            max_response_bytes=self.upstream.max_response_bytes,
        )

    def trace(self, rollout_id: str) -> RolloutTrace | None:
        """The trace of an open rollout so far (None when it is not open); a call still in flight
        is ``pending`` in it."""
        slot = self._slots.get(rollout_id)
        return slot.trace if slot is not None else None

    def pop_trace(self, rollout_id: str) -> RolloutTrace | None:
        """Take a rollout's trace out and close the rollout: later calls of it are refused, and a call
        still in flight is recorded as ``cancelled`` and cancelled (its upstream connection closed)."""
        slot = self._slots.pop(rollout_id, None)
        if slot is None:
            return None
        slot.close("the rollout ended (its trace was taken) before the call's answer was complete")
        return slot.trace

    @property
    def open_rollouts(self) -> int:
        """Rollouts opened and not yet popped."""
        return len(self._slots)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> PolicyGateway:
        """Listen (inside the running event loop)."""
        if self._runner is not None:
            raise RuntimeError("the gateway is already running")
        upstream = self._upstream = Upstream(self.upstream, self.adapter, self.read_timeout_sec, self.token_in)
        try:
            self._runner, self._port = await start_http_server(
                self._handle,
                self._host,
                self._requested_port,
                max_body=_MAX_BODY,
                idle_sec=_IDLE_SEC,
                cancel_on_hang_up=True,
            )
        except BaseException:
            self._upstream = None
            await upstream.session.close()
            raise
        return self

    async def aclose(self) -> None:
        """Stop listening; a call in flight is recorded as ``cancelled`` and cut."""
        runner, self._runner = self._runner, None
        upstream, self._upstream = self._upstream, None
        for slot in self._slots.values():
            slot.close("the gateway stopped before the call's answer was complete")
        try:
            if runner is not None:
                await runner.cleanup()
        finally:
            if upstream is not None:
                await upstream.session.close()
            self._port = None

    async def __aenter__(self) -> PolicyGateway:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- routes ------------------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.raw_path.partition("?")[0]  # (as sent: a rollout id may hold an encoded "/")
        method = request.method
        match = _ROLLOUT_ROUTE.match(path)
        if match is not None:
            rollout_id, tail = unquote(match.group(1)), match.group(2) or ""
            if tail in _CHAT_PATHS and method == "POST":
                return await self._model_call(request, rollout_id)
            if tail in ("/models", "/v1/models") and method == "GET":
                return self._models(request, rollout_id)
            if tail == "/trace" and method == "GET":
                return self._admin(request) or self._trace(rollout_id, pop=False)
            if tail == "" and method == "DELETE":
                return self._admin(request) or self._trace(rollout_id, pop=True)
        elif path in _CHAT_PATHS and method == "POST":
            rollout_id = request.headers.get(ROLLOUT_ID_HEADER, "")
            if rollout_id:
                return await self._model_call(request, rollout_id)
            return error_response(
                400, f"no rollout: use /v1/rollouts/{{id}}/chat/completions or the {ROLLOUT_ID_HEADER} header"
            )
        elif path == "/health":
            return _json({"status": "ok"})
        elif path == "/v1/rollouts" and method == "POST":
            return self._admin(request) or await self._open(request)
        elif path == "/v1/policy_version" and method == "PUT":
            return self._admin(request) or await self._set_version(request)
        return error_response(404, f"not found: {method} {path}")

    def _admin(self, request: web.BaseRequest) -> web.Response | None:
        """None when the request carries the gateway's bearer, else the refusal."""
        token = _bearer(request)
        if token is None:
            return error_response(401, "missing bearer token", **_CHALLENGE)
        if not _same(token, self.bearer):
            return error_response(403, "this route needs the gateway's bearer token")
        return None

    def _authorize(self, request: web.BaseRequest, rollout_id: str) -> tuple[_Slot | None, web.Response | None]:
        """The rollout's slot when the caller may write to it, else the refusal."""
        token = _bearer(request)
        if token is None:
            return None, error_response(401, "missing bearer token", **_CHALLENGE)
        slot = self._slots.get(rollout_id)
        if slot is not None and _same(token, slot.token):  # the rollout's own token (the usual case)
            header = request.headers.get(ROLLOUT_ID_HEADER)
            if header is not None and header != rollout_id:
                return None, error_response(403, f"the {ROLLOUT_ID_HEADER} header names another rollout than the path")
            return slot, None
        if _same(token, self.bearer):
            if slot is None:
                return None, error_response(404, f"rollout {rollout_id!r} is not open on this gateway")
            return slot, None
        return None, error_response(403, f"this token does not open rollout {rollout_id!r}")

    def _models(self, request: web.BaseRequest, rollout_id: str) -> web.Response:
        _, refused = self._authorize(request, rollout_id)
        if refused is not None:
            return refused
        model = {"id": self.upstream.model, "object": "model", "created": 0, "owned_by": "osmosis-gateway"}
        return _json({"object": "list", "data": [model]})

    def _trace(self, rollout_id: str, *, pop: bool) -> web.Response:
        trace = self.pop_trace(rollout_id) if pop else self.trace(rollout_id)
        if trace is None:
            return error_response(404, f"rollout {rollout_id!r} is not open on this gateway")
        data = trace.to_json()
        secrets = self.upstream.secrets()
        return _json(redact_data(data, secrets) if secrets else data)

    async def _open(self, request: web.BaseRequest) -> web.Response:
        try:
            data = json.loads(await request.read())
            rollout_id = data["rollout_id"]
            version = data.get("policy_version")
            sampling = data.get("sampling")
            if not isinstance(rollout_id, str) or not (version is None or isinstance(version, str)):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError):
            return error_response(
                400,
                'expected {"rollout_id": "<string>", "policy_version": "<string, optional>", '
                '"sampling": {"temperature": 1.0, ...} (optional)}',
            )
        try:
            check_rollout_id(rollout_id)
            if sampling is not None:
                sampling = check_sampling(sampling)
        except ValueError as exc:
            return error_response(400, str(exc))
        try:
            policy = self.open_rollout(rollout_id, policy_version=version, sampling=sampling)
        except ValueError as exc:
            return error_response(409, str(exc))
        return _json(
            {"rollout_id": rollout_id, "base_url": policy.base_url, "api_key": policy.api_key, "model": policy.model},
            201,
        )

    async def _set_version(self, request: web.BaseRequest) -> web.Response:
        try:
            version = json.loads(await request.read())["policy_version"]
            if not (version is None or isinstance(version, str)):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return error_response(400, 'expected {"policy_version": "<string or null>"}')
        self.policy_version = version
        return _json({"policy_version": version})

    # -- the model call ----------------------------------------------------------------------------

    async def _model_call(self, request: web.BaseRequest, rollout_id: str) -> web.StreamResponse:
        """A model call of ``rollout_id``: refused from its head when its token opens no such rollout
        (its body is never read), else recorded from its head on (a trace taken while its body
        comes says it was cancelled), read, sent, answered."""
        slot, refused = self._authorize(request, rollout_id)
        if refused is not None:
            return refused
        assert slot is not None
        assert self._upstream is not None
        length = request.content_length
        if length is not None and length > _MAX_BODY:
            raise web.HTTPRequestEntityTooLarge(max_size=_MAX_BODY, actual_size=length)
        if request.version >= (1, 1) and request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # (as aiohttp's own router does)
            request.writer.output_size = 0
        record = TraceCall(
            call_id=f"{rollout_id}#{slot.next_index}",
            index=slot.next_index,
            status="pending",
            started_at=time.time(),
            policy_version=slot.policy_version or self.policy_version,
        )
        slot.next_index += 1
        slot.trace.calls.append(record)
        call = ModelCall(self._upstream, request, slot.trace, record, slot.sampling, slot.conversation)
        slot.calls[call] = asyncio.current_task()
        try:
            body = await request.read() if request.content.is_eof() else await _body(request)
            if body is None:  # a client that stalls in the middle of its body
                call.finish("client_gone", f"the rollout's request stalled for {_BODY_STALL_SEC:g} s", None)
                return _hang_up(request)
            return await call.answer(body)
        except web.HTTPRequestEntityTooLarge:
            call.finish("bad_request", f"the request is over the {_MAX_BODY}-byte limit", 413)
            raise
        except asyncio.CancelledError:  # the rollout hung up (or the call was cancelled, recorded so)
            call.finish("client_gone", "the rollout hung up before the answer was complete", None)
            raise
        except Exception as exc:  # what no outcome above foresaw: recorded, never left pending
            where = "its answer" if call.sent else "its request"
            what = call.message(f"{type(exc).__name__}: {exc}")
            log.warning("rollout %s: call %d: %s cannot be handled: %s", rollout_id, record.index, where, what)
            status = 502 if call.sent else 400
            call.finish("unreadable" if call.sent else "bad_request", f"{where} cannot be handled: {what}", status)
            return error_response(status, f"the gateway cannot handle {where}: {what}")
        finally:
            slot.calls.pop(call, None)


async def _body(request: web.BaseRequest) -> bytes | None:
    """A request's body as it comes, up to :data:`_MAX_BODY`; None when it stops coming for
    :data:`_BODY_STALL_SEC` (each piece is waited for that long, not the whole upload).

    :raises web.HTTPRequestEntityTooLarge: over the limit.
    """
    pieces: list[bytes] = []
    size = 0
    while True:
        try:
            async with asyncio.timeout(_BODY_STALL_SEC):
                piece = await request.content.readany()
        except TimeoutError:
            return None
        if not piece:
            return b"".join(pieces)
        size += len(piece)
        if size > _MAX_BODY:
            raise web.HTTPRequestEntityTooLarge(max_size=_MAX_BODY, actual_size=size)
        pieces.append(piece)


_hang_up: Final = drop_connection
