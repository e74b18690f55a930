"""Calling the rollout's policy from plain code: one chat-completions request, errors mapped.

>>> async def run(ctx):                                                  # doctest: +SKIP
...     reply = await chat_completion(ctx.prompt, tools=TOOLS, temperature=0.7)
...     return [*ctx.prompt, reply]

It posts to the active rollout's endpoint with the rollout id header and the bearer key, over
the running loop's shared aiohttp session (:func:`osmosis_core.http.http_request`),
never more than once per call, with a trainer's sampling settings (``policy.sampling``, when it
gave some) set over the ones the call names. Any failure (unreachable, 4xx/5xx, a malformed
answer, a body over the endpoint's ``max_response_bytes``) raises :class:`PolicyError`, which the
backend reports as ``policy_error``; the key and header values never appear in the message.
"""

from __future__ import annotations

import json
from typing import Any

from osmosis_core.context import get_rollout_context
from osmosis_core.errors import PolicyError, clip
from osmosis_core.records import Message
from osmosis_core.sampling import apply_sampling

__all__ = ["chat_completion", "chat_completion_problem", "chat_completion_response"]


async def chat_completion_response(
    messages: list[Message], *, tools: list[dict[str, Any]] | None = None, **params: Any
) -> dict[str, Any]:
    """Send one chat-completions request for the active rollout; return the whole response JSON."""
    import aiohttp

    from osmosis_core.http.client import ResponseTooLarge, http_request, read_limited

    rollout = get_rollout_context()
    policy = rollout.policy
    url = policy.chat_completions_url
    body: dict[str, Any] = {"model": policy.model, "messages": messages, **params}
    if tools:
        body["tools"] = tools
    if policy.sampling is not None:  # the trainer's, over the workflow's
        apply_sampling(body, policy.sampling)
    secrets = policy.secrets()

    def failed(text: str, limit: int = 300, status: int | None = None) -> PolicyError:
        return PolicyError(clip(f"policy endpoint {url} {text}", secrets, limit), status=status, endpoint=url)

    try:
        async with http_request("POST", url, json=body, headers=rollout.headers()) as response:
            status = response.status
            content = await read_limited(response, policy.max_response_bytes)
    except ResponseTooLarge as exc:
        raise failed(f"failed: {exc}") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        what = f"{type(exc).__name__}: {exc}".rstrip(": ")
        raise failed(f"failed: {what}", 500) from None
    if status >= 400:
        raise failed(f"answered {status}: {_error_detail(content)}", 500, status)
    try:
        data = json.loads(content)
    except ValueError as exc:
        raise failed(f"answered {status} with malformed JSON ({exc}): {_text(content)}", status=status) from None
    problem = chat_completion_problem(data)
    if problem is not None:
        raise failed(f"answered {status} with {problem}: {_text(content)}", status=status)
    return data  # type: ignore[no-any-return]


async def chat_completion(
    messages: list[Message], *, tools: list[dict[str, Any]] | None = None, **params: Any
) -> Message:
    """Send one chat-completions request for the active rollout; return the assistant message.

    :param messages: the conversation so far (chat-completions dicts).
    :param tools: OpenAI-format tool definitions, if the model may call tools.
    :param params: any other request field (``temperature``, ``max_tokens``, ...); a trainer's
        sampling settings (``policy.sampling``) win over the ones given here.
    :raises PolicyError: the endpoint failed.
    """
    data = await chat_completion_response(messages, tools=tools, **params)
    message: Message = data["choices"][0]["message"]
    return {k: v for k, v in message.items() if v is not None}


def chat_completion_problem(data: Any, *, chunk: bool = False) -> str | None:
    """What makes parsed JSON not a chat completion (``chunk``: not a streamed chunk), or None.

    Shape checks only, of what the SDKs and frameworks read without checking (cheap: no model is
    built): an object whose ``choices`` is a list (non-empty for a completion; a chunk's may be
    empty, as the usage chunk's is) of objects, each with a ``message`` (a chunk's: ``delta``)
    object whose ``tool_calls``, when present, is a list of objects.

    >>> chat_completion_problem({"hello": "world"})
    'JSON that is not a chat completion (no choices)'
    >>> chat_completion_problem({"choices": [], "usage": {}}, chunk=True) is None
    True
    """
    what = "a chat completion chunk" if chunk else "a chat completion"
    if type(data) is not dict:
        return f"JSON that is not {what} (a {type(data).__name__}, not an object)"
    error = data.get("error")
    if error:  # what openai raises as an APIError, a status-less one
        detail = error.get("message") if isinstance(error, dict) else None
        return f"an error instead of {what}: {detail or error}"
    choices = data.get("choices")
    if type(choices) is not list or not (choices or chunk):
        shown = "no choices" if not choices else f"choices is a {type(choices).__name__}, not a list"
        return f"JSON that is not {what} ({shown})"
    field = "delta" if chunk else "message"
    for choice in choices:
        if type(choice) is not dict:
            return f"JSON that is not {what} (a choice is a {type(choice).__name__}, not an object)"
        message = choice.get(field)
        if type(message) is not dict:
            return f"JSON that is not {what} (a choice without a {field} object)"
        calls = message.get("tool_calls")
        if calls is not None and (type(calls) is not list or not all(type(c) is dict for c in calls)):
            return f"JSON that is not {what} ({field}.tool_calls is not a list of objects)"
    return None


def _text(content: bytes) -> str:
    """The start of a body as text: far longer than any message keeps, so :func:`clip` redacts first."""
    return content[:4096].decode("utf-8", "replace").strip() or "(empty body)"


def _error_detail(content: bytes) -> str:
    """What an error body says."""
    try:
        data = json.loads(content[:65536])
    except ValueError:
        return _text(content)
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)
