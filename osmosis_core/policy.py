"""Calling the rollout's policy from plain code: one chat-completions request, errors mapped.

>>> async def run(ctx):                                                  # doctest: +SKIP
...     reply = await chat_completion(ctx.prompt, tools=TOOLS, temperature=0.7)
...     return [*ctx.prompt, reply]

It posts to the active rollout's endpoint with the rollout id header and the bearer key, over
the shared pooled client of the running event loop (:func:`osmosis_core.http.shared_client`).
Any failure (unreachable, 4xx/5xx, a malformed answer) raises :class:`PolicyError`, which the
backend reports as ``policy_error``; the key never appears in the message.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from osmosis_core.context import get_rollout_context
from osmosis_core.errors import PolicyError, redact
from osmosis_core.records import Message

__all__ = ["chat_completion", "chat_completion_response"]


async def chat_completion_response(
    messages: list[Message], *, tools: list[dict[str, Any]] | None = None, **params: Any
) -> dict[str, Any]:
    """Send one chat-completions request for the active rollout; return the whole response JSON."""
    import httpx

    from osmosis_core.http import shared_transport

    rollout = get_rollout_context()
    policy = rollout.policy
    url = policy.chat_completions_url
    body: dict[str, Any] = {"model": policy.model, "messages": messages, **params}
    if tools:
        body["tools"] = tools
    secrets = policy.secrets()
    try:
        request = httpx.Request("POST", _parsed_url(url), json=body, headers=rollout.headers(), extensions=_TIMEOUTS)
        response = await shared_transport().handle_async_request(request)
        await response.aread()
    except httpx.HTTPError as exc:
        raise PolicyError(
            redact(f"policy endpoint {url} failed: {type(exc).__name__}: {exc}", secrets), endpoint=url
        ) from None
    if response.status_code >= 400:
        detail = _error_detail(response.content)
        raise PolicyError(
            redact(f"policy endpoint {url} answered {response.status_code}: {detail}", secrets),
            status=response.status_code,
            endpoint=url,
        )
    try:
        data = json.loads(response.content)
        data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise PolicyError(f"policy endpoint {url} sent a malformed completion: {exc!r}", endpoint=url) from None
    return data  # type: ignore[no-any-return]


async def chat_completion(
    messages: list[Message], *, tools: list[dict[str, Any]] | None = None, **params: Any
) -> Message:
    """Send one chat-completions request for the active rollout; return the assistant message.

    :param messages: the conversation so far (chat-completions dicts).
    :param tools: OpenAI-format tool definitions, if the model may call tools.
    :param params: any other request field (``temperature``, ``max_tokens``, ...).
    :raises PolicyError: the endpoint failed.
    """
    data = await chat_completion_response(messages, tools=tools, **params)
    message: Message = data["choices"][0]["message"]
    return {k: v for k, v in message.items() if v is not None}


_TIMEOUTS = {"timeout": {"connect": 30.0, "read": 600.0, "write": 600.0, "pool": 600.0}}
"""Per-request limits; a rollout's own agent timeout usually ends a call long before these."""


@functools.lru_cache(maxsize=256)
def _parsed_url(url: str) -> Any:
    """httpx parses a URL string on every request (tens of microseconds); parse each endpoint once."""
    import httpx

    return httpx.URL(url)


def _error_detail(content: bytes) -> str:
    try:
        data = json.loads(content)
        error = data.get("error", data)
        if isinstance(error, dict):
            return str(error.get("message") or error)[:300]
        return str(error)[:300]
    except ValueError:
        return content[:300].decode("utf-8", "replace").strip() or "(empty body)"
