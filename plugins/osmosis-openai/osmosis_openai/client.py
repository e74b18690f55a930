"""The OpenAI client an agent integration gives its framework: one per event loop, on aiohttp.

Both agent integrations (Strands, the OpenAI Agents SDK) call the policy through ``openai``'s
``AsyncOpenAI``. Building one costs about 57 ms of CPU (an SSL context), and openai's default
httpx transport slows to a crawl at a hundred concurrent requests, so:

* one ``AsyncOpenAI`` per event loop, on openai's own aiohttp transport
  (``openai.DefaultAioHttpClient``, the ``openai[aiohttp]`` extra), with ``max_retries=0`` (the
  trainer decides about retries, and a POST is never sent twice), no cap on connections, idle
  connections closed after 4 s, proxies from ``HTTP(S)_PROXY``;
* a cheap ``with_options`` view of it per endpoint (base URL, key, extra headers), shared by the
  rollouts that call that endpoint; the rollout id header is added to each request from the
  running :class:`~osmosis_core.RolloutContext`, so no object is built per rollout;
* ``chat.completions.create`` skips openai's typed request transform when the request is already
  plain JSON (what both frameworks send): the transform walks every message with typing
  introspection, 0.7 to 1.0 ms of CPU per call here, 40 to 50% of the client's CPU per call
  (measured side by side in ``plugins/osmosis-openai/tests/test_client.py``'s docstring). It
  relies on openai internals (``AsyncCompletions._post``, ``make_request_options``), pinned by
  ``openai>=3,<4``; that test fails loudly, naming what changed, when an openai release breaks
  it, and anything but plain JSON (or ``response_format``) takes openai's normal path;
* a trainer's sampling settings for the rollout (``ctx.policy.sampling``: ``osmosis serve``'s
  ``sampling_params``) are set on every ``chat.completions.create`` over what the framework asked
  for (its ``temperature``, ``max_tokens``, ``extra_body``, ...: :mod:`osmosis_core.sampling`), as
  ``extra_body``, which openai merges last; a rollout without settings costs one context lookup;
* what is not a chat completion fails the call with a :class:`~osmosis_core.PolicyError` before
  the SDK reads it: a body over the rollout's ``max_response_bytes``, an HTML page, malformed
  JSON (in a body or in an event of a stream), JSON of the wrong shape (no ``choices``, a choice
  without its ``message`` or ``delta``), a stream cut without a ``finish_reason`` (see
  :func:`_check_response`). The checks are shape checks on the parsed JSON, no model is built:
  both frameworks then see a well-formed completion or chunk, or that error, on every turn.

The loop's client is closed with the loop's other HTTP clients
(:func:`osmosis_core.http.aclose_http`). It needs ``openai[aiohttp]``, a dependency of this
distribution (osmosis-openai), which both integrations depend on; the core does not.

>>> client = rollout_openai_client()          # doctest: +SKIP  (inside a rollout)
>>> await client.chat.completions.create(model=ctx.policy.model, messages=[...])
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import json.scanner
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from osmosis_core import ROLLOUT_ID_HEADER, PolicyError, current_rollout_context, get_rollout_context
from osmosis_core.http import DEFAULT_MAX_RESPONSE_BYTES, KEEPALIVE_SEC, on_close
from osmosis_core.plugin import clip
from osmosis_core.sampling import agent_distribution, sampling_overrides
from osmosis_core.wire import chat_completion_problem

if TYPE_CHECKING:
    from openai import AsyncOpenAI

    from osmosis_core import RolloutContext

__all__ = ["fast_client_class", "policy_error", "rollout_openai_client"]

_ViewKey = tuple[str, str, tuple[tuple[str, str], ...]]
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, dict[_ViewKey, Any]]] = (
    weakref.WeakKeyDictionary()
)


async def _tag_request(request: Any) -> None:
    """httpx event hook: the running rollout's id on every request its code sends."""
    ctx = current_rollout_context()
    if ctx is not None:
        request.headers[ROLLOUT_ID_HEADER] = ctx.rollout_id
    # an uncompressed body: the size limit counts the bytes as they arrive
    request.headers["Accept-Encoding"] = "identity"


_STREAMING: contextvars.ContextVar[bool | None] = contextvars.ContextVar("osmosis_openai_stream", default=None)
"""Whether the chat-completions request being sent asked for a stream (set by ``create``)."""


async def _check_response(response: Any) -> None:
    """httpx event hook: refuse what is not a chat completion before the SDK reads it.

    * a body over the rollout's ``max_response_bytes`` (announced, or counted as it arrives);
    * a successful answer that is neither JSON nor an event stream (an HTML page from a proxy);
    * a JSON answer that does not parse (cut short by a broken server), or that is not a chat
      completion (no ``choices``, a choice without a ``message``, an ``error`` object; see
      ``osmosis_core.wire.chat_completion_problem``), or that answers a request for a stream;
    * an event stream whose event does not parse or is not a chat completion chunk, or that ends
      without a ``finish_reason`` (cut mid-answer), which the SDKs would otherwise take for a
      short, complete answer; or that answers a request that did not ask for one.

    Each is a :class:`~osmosis_core.PolicyError` naming the endpoint and the status, so the
    frameworks see either well-formed completions and chunks or that error, on every turn.
    """
    ctx = current_rollout_context()
    limit = ctx.policy.max_response_bytes if ctx is not None else DEFAULT_MAX_RESPONSE_BYTES
    request = response.request
    url = str(request.url)
    status = response.status_code
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        await response.aclose()
        raise PolicyError(
            f"policy endpoint {url} failed: the response ({declared} bytes) is over the {limit}-byte limit",
            status=status,
            endpoint=url,
        )
    kind = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    ok = 200 <= status < 300
    chat = ok and request.url.path.endswith("/chat/completions")
    sse = ok and kind == "text/event-stream"
    response.stream = _checked_stream(response.stream, limit, url, status, ctx, sse=sse, chat=chat)
    if not ok:
        return
    streaming = _STREAMING.get() if chat else None
    if sse:
        if streaming is False:
            raise _not_a_completion(url, status, ctx, "an event stream to a request that asked for no stream", b"")
        return
    if not kind.endswith("json"):
        await response.aread()
        raise _not_a_completion(
            url, status, ctx, f"{kind or 'no content type'}, not a chat completion", response.content
        )
    await response.aread()
    try:
        data = json.loads(response.content)
    except ValueError as exc:
        raise _not_a_completion(url, status, ctx, f"malformed JSON ({exc})", response.content) from None
    if not chat:
        return
    if streaming:
        raise _not_a_completion(
            url, status, ctx, f"{kind}, not the event stream the request asked for", response.content
        )
    problem = chat_completion_problem(data)
    if problem is not None:
        raise _not_a_completion(url, status, ctx, problem, response.content)


def _not_a_completion(url: str, status: int, ctx: RolloutContext | None, what: str, body: bytes) -> PolicyError:
    """The error for an answer that is not a chat completion: endpoint, status, what it was, its start."""
    shown = body[:4096].decode("utf-8", "replace").strip()
    message = f"policy endpoint {url} answered {status} with {what}" + (f": {shown}" if shown else "")
    return PolicyError(clip(message, ctx.policy.secrets() if ctx is not None else ()), status=status, endpoint=url)


def _checked_stream(
    stream: Any, limit: int, url: str, status: int, ctx: RolloutContext | None, *, sse: bool, chat: bool
) -> Any:
    """``stream`` (an httpx2 ``AsyncByteStream``) failing past ``limit`` bytes, and, for an event
    stream, at an event that is not a chat completion chunk (``chat``) or when it ends without a
    ``finish_reason``. Events are checked as their bytes arrive, before openai decodes them; after
    ``[DONE]`` (where openai stops) nothing is checked."""
    return _checked_stream_class()(stream, limit, url, status, ctx, sse, chat)


@functools.cache
def _checked_stream_class() -> type:
    import httpx2

    class CheckedStream(httpx2.AsyncByteStream):
        # state is kept across iterations: openai iterates a stream again to drain it after the events
        def __init__(
            self, stream: Any, limit: int, url: str, status: int, ctx: RolloutContext | None, sse: bool, chat: bool
        ) -> None:
            self.stream, self.limit, self.url, self.status, self.ctx, self.chat = stream, limit, url, status, ctx, chat
            self.seen = 0
            self.finished = not sse
            self.done = not sse  # [DONE] seen (or not an event stream): nothing more to check
            self.rest = b""  # the start of a line not ended yet
            self.data: list[bytes] = []  # the data lines of the event being read

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self.stream:
                self.seen += len(chunk)
                if self.seen > self.limit:
                    raise PolicyError(
                        f"policy endpoint {self.url} failed: the response is over the {self.limit}-byte limit",
                        endpoint=self.url,
                    )
                if not self.done:
                    self._feed(chunk)
                yield chunk
            if not self.finished:
                self.finished = True  # reported once
                raise PolicyError(
                    f"policy endpoint {self.url} broke the response: the stream ended without a finish_reason "
                    "(cut short mid-answer)",
                    status=self.status,
                    endpoint=self.url,
                )

        def _feed(self, chunk: bytes) -> None:
            """Split the event stream into lines (CR, LF or CRLF) and check each event as it ends."""
            text = self.rest + chunk if self.rest else chunk
            held = b""
            if b"\r" in text:
                if text.endswith(b"\r"):  # maybe the first half of a CRLF
                    text, held = text[:-1], b"\r"
                text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            lines = text.split(b"\n")
            self.rest = lines.pop() + held
            for line in lines:
                if not line:  # the blank line that ends an event
                    if self.data:
                        data, self.data = b"\n".join(self.data), []
                        self._event(data)
                        if self.done:
                            return
                elif line.startswith(b"data:"):
                    self.data.append(line[6:] if line[5:6] == b" " else line[5:])

        def _event(self, data: bytes) -> None:
            if data.startswith(b"[DONE]"):
                self.done = True
                return
            if not self.chat:
                return
            try:
                doc = _parse_json(data)
            except ValueError as exc:
                what = f"malformed JSON in the event stream ({exc})"
                raise _not_a_completion(self.url, self.status, self.ctx, what, data) from None
            problem = chat_completion_problem(doc, chunk=True)
            if problem is not None:
                raise _not_a_completion(self.url, self.status, self.ctx, f"{problem} in the event stream", data)
            if not self.finished:
                self.finished = any(choice.get("finish_reason") for choice in doc["choices"])

        async def aclose(self) -> None:
            await self.stream.aclose()

    return CheckedStream


_SCAN: Final = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def _parse_json(data: bytes) -> Any:
    """``json.loads(data)`` for one event of a stream, through the C scanner alone (less than half
    the CPU: no encoding detection, no Python layers), raising ValueError the same way."""
    text = data.decode("utf-8").strip()
    try:
        doc, end = _SCAN(text, 0)
    except StopIteration as exc:
        raise json.JSONDecodeError("Expecting value", text, exc.value) from None
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return doc


_JSON_SCALARS = (str, int, float, bool, type(None))
_OPTION_KEYS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})


def _plain_json(value: Any, depth: int = 0) -> bool:
    """True for data made only of dicts, lists and JSON scalars (what openai's transform leaves as is)."""
    if isinstance(value, _JSON_SCALARS):
        return True
    if depth > 32:
        return False
    if type(value) is dict:
        return all(type(k) is str and _plain_json(v, depth + 1) for k, v in value.items())
    if type(value) is list:
        return all(_plain_json(v, depth + 1) for v in value)
    return False


@functools.cache
def fast_client_class() -> type[AsyncOpenAI]:
    """``AsyncOpenAI`` whose ``chat.completions.create`` posts plain-JSON requests as they are."""
    import openai
    from openai import AsyncStream
    from openai._base_client import make_request_options
    from openai._types import NotGiven, Omit
    from openai.resources.chat import AsyncChat
    from openai.resources.chat.completions.completions import AsyncCompletions
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    class FastCompletions(AsyncCompletions):
        async def create(self, **params: Any) -> Any:
            body = {k: v for k, v in params.items() if k not in _OPTION_KEYS and not isinstance(v, (Omit, NotGiven))}
            ctx = current_rollout_context()
            if ctx is not None and ctx.policy.sampling is not None:  # the trainer's, over the framework's
                params = _with_sampling(params, body, ctx.policy.sampling)
            token = _STREAMING.set(body.get("stream") is True)  # for the response check
            try:
                return await self._create(body, params)
            finally:
                _STREAMING.reset(token)

        async def _create(self, body: dict[str, Any], params: dict[str, Any]) -> Any:
            if "response_format" in body or not _plain_json(body):
                return await super().create(**params)
            options = make_request_options(
                extra_headers=params.get("extra_headers"),
                extra_query=params.get("extra_query"),
                extra_body=params.get("extra_body"),
                timeout=params.get("timeout", openai.NOT_GIVEN),
                security={"bearer_auth": True},
            )
            return await self._post(
                "/chat/completions",
                body=body,
                options=options,
                cast_to=ChatCompletion,
                stream=bool(body.get("stream")),
                stream_cls=AsyncStream[ChatCompletionChunk],
            )

    class FastChat(AsyncChat):
        @functools.cached_property
        def completions(self) -> FastCompletions:
            return FastCompletions(self._client)

    class FastAsyncOpenAI(openai.AsyncOpenAI):
        @functools.cached_property
        def chat(self) -> FastChat:
            return FastChat(self)

    return FastAsyncOpenAI


def _with_sampling(params: dict[str, Any], body: dict[str, Any], sampling: Mapping[str, Any]) -> dict[str, Any]:
    """``create``'s keywords with a trainer's ``sampling`` set over the request's fields: in
    ``extra_body``, which openai merges over the body last (so the settings win over the typed
    keywords and over an ``extra_body`` of the framework's), by the name(s) the request gave its cap
    (:func:`osmosis_core.sampling.sampling_overrides`); the framework's distribution settings the
    trainer did not set (:func:`osmosis_core.sampling.agent_distribution`) sent as null, which servers
    read as unset (their default, which the trainer's loss assumes)."""
    extra = params.get("extra_body")
    extra = dict(extra) if isinstance(extra, Mapping) else {}
    overrides = sampling_overrides(sampling, body.keys() | extra.keys())
    dropped = dict.fromkeys(agent_distribution({**body, **extra}, sampling))
    return {**params, "extra_body": {**extra, **dropped, **overrides}}


def _loop_client() -> tuple[Any, dict[_ViewKey, Any]]:
    loop = asyncio.get_running_loop()
    entry = _clients.get(loop)
    if entry is None:
        import httpx2
        import openai

        http_client = openai.DefaultAioHttpClient(
            limits=httpx2.Limits(max_connections=0, keepalive_expiry=KEEPALIVE_SEC),
            event_hooks={"request": [_tag_request], "response": [_check_response]},
        )
        client = fast_client_class()(
            api_key="unset", base_url="http://127.0.0.1:9/unset", max_retries=0, http_client=http_client
        )
        entry = _clients[loop] = (client, {})

        async def close() -> None:
            _clients.pop(loop, None)
            await client.close()

        on_close(close)
    return entry


def rollout_openai_client() -> AsyncOpenAI:
    """The active rollout's view of the loop's ``AsyncOpenAI`` (created on first use).

    :raises RuntimeError: outside a rollout; it never falls back to a public API.
    """
    policy = get_rollout_context().policy
    client, views = _loop_client()
    key = (policy.base_url, policy.api_key or "EMPTY", tuple(sorted(policy.headers.items())))
    view = views.get(key)
    if view is None:
        view = views[key] = client.with_options(base_url=policy.base_url, api_key=key[1], default_headers=dict(key[2]))
    return view  # type: ignore[no-any-return]


def policy_error(exc: BaseException) -> PolicyError | None:
    """A :class:`PolicyError` for an ``openai`` or HTTP client failure, naming status and endpoint.

    Returns None for any other exception. The key and header values never appear in the message.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:  # what the response checks raised, under openai's wrapping
        seen.add(id(cur))
        if isinstance(cur, PolicyError):
            return cur
        cur = cur.__cause__ or cur.__context__
    module = type(exc).__module__.split(".", 1)[0]
    if module not in ("openai", "httpx", "httpx2", "httpcore", "httpcore2", "aiohttp"):
        return None
    ctx = get_rollout_context()
    endpoint = ctx.policy.chat_completions_url
    status = getattr(exc, "status_code", None)
    if status:
        detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        message = f"policy endpoint {endpoint} answered {status}: {detail}"
    else:
        root = exc  # the transport's own error says what happened ("Connection error." says too little)
        for _ in range(8):
            if root.__cause__ is None:
                break
            root = root.__cause__
        message = f"policy endpoint {endpoint} failed: {type(root).__name__}: {root}".rstrip(": ")
    return PolicyError(clip(message, ctx.policy.secrets(), 500), status=status, endpoint=endpoint)
