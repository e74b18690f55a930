"""The OpenAI client an agent integration gives its framework: pooled per event loop, viewed per rollout.

Both agent integrations (Strands, the OpenAI Agents SDK) call the policy through ``openai``'s
``AsyncOpenAI``. Building one costs about 57 ms of CPU (an SSL context), and its default httpx
transport slows to a crawl at a hundred concurrent requests, so:

* one ``AsyncOpenAI`` per event loop, with ``max_retries=0`` (the trainer decides about retries)
  and the core's :class:`~osmosis_core.http.PooledTransport` underneath;
* each rollout gets a cheap ``with_options`` view of it bound to its own endpoint, key and
  rollout-id header, made once per rollout and kept on the :class:`RolloutContext`.

It needs the ``openai`` package (a dependency of both integrations, not of the core).

>>> client = rollout_openai_client()          # doctest: +SKIP  (inside a rollout)
>>> await client.chat.completions.create(model=client_model(), messages=[...])
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any

from osmosis_core.context import get_rollout_context
from osmosis_core.errors import PolicyError, redact

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["policy_error", "rollout_openai_client"]

_VIEW_KEY = "osmosis.openai_client"
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


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


def _fast_client_class() -> type[AsyncOpenAI]:
    """``AsyncOpenAI`` whose ``chat.completions.create`` skips openai's typed request transform
    when the request is already plain JSON (the transform walks every message with typing
    introspection: about a millisecond of CPU per call, a third of a bare client's cost)."""
    global _FAST_CLIENT
    if _FAST_CLIENT is not None:
        return _FAST_CLIENT
    import functools

    import openai
    from openai import AsyncStream
    from openai._base_client import make_request_options
    from openai._types import NotGiven, Omit
    from openai.resources.chat import AsyncChat
    from openai.resources.chat.completions.completions import AsyncCompletions
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    class FastCompletions(AsyncCompletions):  # type: ignore[misc]
        async def create(self, **params: Any) -> Any:  # type: ignore[override]
            body = {k: v for k, v in params.items() if k not in _OPTION_KEYS and not isinstance(v, (Omit, NotGiven))}
            if "response_format" in body or not _plain_json(body):
                return await super().create(**params)
            stream = bool(body.get("stream"))
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
                stream=stream,
                stream_cls=AsyncStream[ChatCompletionChunk],
            )

    class FastChat(AsyncChat):  # type: ignore[misc]
        @functools.cached_property
        def completions(self) -> FastCompletions:
            return FastCompletions(self._client)

    class FastAsyncOpenAI(openai.AsyncOpenAI):  # type: ignore[misc]
        @functools.cached_property
        def chat(self) -> FastChat:  # type: ignore[override]
            return FastChat(self)

    _FAST_CLIENT = FastAsyncOpenAI
    return FastAsyncOpenAI


_FAST_CLIENT: type[AsyncOpenAI] | None = None


def _loop_client() -> AsyncOpenAI:
    import openai._base_client as base

    from osmosis_core.http import transport_module

    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    pooled = transport_module("httpx2" if hasattr(base, "httpx2") else "httpx")  # openai 3.x uses httpx2
    http_client = pooled.shared_client()
    if client is None or client._client is not http_client:  # the pool was closed and replaced
        client = _fast_client_class()(
            api_key="unset", base_url="http://127.0.0.1:9/unset", max_retries=0, http_client=http_client
        )
        _clients[loop] = client
    return client


def rollout_openai_client() -> AsyncOpenAI:
    """The active rollout's view of the loop's pooled ``AsyncOpenAI`` (created on first use).

    :raises RuntimeError: outside a rollout; it never falls back to a public API.
    """
    ctx = get_rollout_context()
    # one view per (rollout, event loop): a sync tool that runs a sub-agent in a worker thread has a loop of its own
    views: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = ctx.extras.setdefault(
        _VIEW_KEY, weakref.WeakKeyDictionary()
    )
    loop = asyncio.get_running_loop()
    view = views.get(loop)
    if view is None or view.is_closed():
        headers = ctx.headers()
        headers.pop("Authorization", None)  # the client sends the key itself
        view = views[loop] = _loop_client().with_options(
            base_url=ctx.policy.base_url,
            api_key=ctx.policy.api_key or "EMPTY",
            default_headers=headers,
        )
    return view  # type: ignore[no-any-return]


def policy_error(exc: BaseException) -> PolicyError | None:
    """A :class:`PolicyError` for an ``openai`` or HTTP client failure, naming status and endpoint.

    Returns None for any other exception. The key never appears in the message.
    """
    module = type(exc).__module__.split(".", 1)[0]
    if module not in ("openai", "httpx", "httpx2", "httpcore", "httpcore2"):
        return None
    ctx = get_rollout_context()
    endpoint = ctx.policy.chat_completions_url
    status = getattr(exc, "status_code", None)
    detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in detail:  # "Connection error." says too little
        detail = f"{detail} ({type(cause).__name__}: {cause})"
    what = f"answered {status}" if status else f"failed ({type(exc).__name__})"
    message = redact(f"policy endpoint {endpoint} {what}: {detail}", ctx.policy.secrets())
    return PolicyError(" ".join(message.split())[:500], status=status, endpoint=endpoint)
