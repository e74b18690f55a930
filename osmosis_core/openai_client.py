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


def _loop_client() -> AsyncOpenAI:
    import openai
    import openai._base_client as base

    from osmosis_core.http import transport_module

    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    pooled = transport_module("httpx2" if hasattr(base, "httpx2") else "httpx")  # openai 3.x uses httpx2
    http_client = pooled.shared_client()
    if client is None or client._client is not http_client:  # the pool was closed and replaced
        client = openai.AsyncOpenAI(
            api_key="unset", base_url="http://127.0.0.1:9/unset", max_retries=0, http_client=http_client
        )
        _clients[loop] = client
    return client


def rollout_openai_client() -> AsyncOpenAI:
    """The active rollout's view of the loop's pooled ``AsyncOpenAI`` (created on first use).

    :raises RuntimeError: outside a rollout; it never falls back to a public API.
    """
    ctx = get_rollout_context()
    view = ctx.extras.get(_VIEW_KEY)
    if view is None:
        headers = ctx.headers()
        headers.pop("Authorization", None)  # the client sends the key itself
        view = _loop_client().with_options(
            base_url=ctx.policy.base_url,
            api_key=ctx.policy.api_key or "EMPTY",
            default_headers=headers,
        )
        ctx.extras[_VIEW_KEY] = view
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
    message = redact(f"policy endpoint {endpoint} {what}: {detail}", (ctx.policy.api_key,))
    return PolicyError(" ".join(message.split())[:500], status=status, endpoint=endpoint)
