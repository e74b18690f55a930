"""Does the policy endpoint answer? One cheap request before a run starts (``osmosis run``, ``osmosis validate``).

Before the first rollout, :func:`check_policy` asks ``GET {base_url}/models``: vLLM, SGLang,
Ollama, OpenAI and LiteLLM all serve it, it generates nothing, and it takes the same path as the
rollouts' calls (the environment's proxy, the key, the ``[policy]`` headers). What the answer means:

* **no HTTP answer** (connection refused, a host name that does not resolve, a TLS certificate
  or handshake refused, no connection within ``connect_timeout`` seconds, a connection closed
  without an answer): the endpoint is *unreachable*; ``osmosis run`` stops before it starts, in
  one line naming the URL and the reason.
* **200**: it answers. When it lists its models and the run's ``model`` is not among them, a
  warning (vLLM and Ollama answer 404 to every chat request naming a model they do not serve;
  a gateway may route names it does not list, so the run goes on).
* **401 / 403**: the host answered but refused the key (or wants one): a warning, since some
  gateways guard only the chat route differently.
* **404 / 405**: a server without the route: nothing to say.
* **5xx**, or no answer within ``timeout`` seconds after connecting: a warning (a proxy may answer
  502 for an upstream it cannot reach; a loaded server may be slow); the run goes on.

No message holds the key or a header value (:func:`~osmosis_core.errors.clip`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs

from osmosis_core.errors import clip
from osmosis_core.records import PolicyEndpoint

if TYPE_CHECKING:
    from osmosis_core._engine.config import RunConfig

__all__ = [
    "CONNECT_TIMEOUT_SEC",
    "TIMEOUT_SEC",
    "PolicyCheck",
    "check_config_policy",
    "check_policy",
    "check_policy_sync",
]

CONNECT_TIMEOUT_SEC = 3.0
"""How long the connection may take: a refused or unresolvable host fails at once, a host that
drops packets takes this long."""
TIMEOUT_SEC = 5.0
"""How long the whole request may take (past it, a warning: the host is there)."""
_MAX_BODY = 4 << 20  # a list of models; OpenAI's is about 30 KB


@attrs.frozen
class PolicyCheck:
    """What ``GET {base_url}/models`` said about a policy endpoint."""

    url: str
    """The URL asked (``{base_url}/models``)."""
    status: int | None = None
    """The HTTP status of the answer (None: no answer)."""
    unreachable: str | None = None
    """Why no HTTP answer came (``connection refused``, ...); the endpoint cannot serve the run."""
    warning: str | None = None
    """What a run should hear about an answer that was not a plain yes (one line, no secret)."""
    models: tuple[str, ...] = ()
    """The model ids the endpoint lists (empty when it lists none or did not answer 200)."""

    @property
    def ok(self) -> bool:
        """The endpoint answered and nothing is worth a warning."""
        return self.unreachable is None and self.warning is None


def _reason(exc: BaseException, connect_timeout: float) -> str:
    """Why a request got no HTTP answer, in a few words."""
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"the host name {exc.host!r} does not resolve"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"its TLS certificate is not accepted ({exc.certificate_error})"
    if isinstance(exc, (aiohttp.ClientConnectorSSLError, aiohttp.ClientSSLError)):
        return f"the TLS handshake failed ({exc})"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return f"connection refused by {exc.host}:{exc.port}"
        return f"cannot connect to {exc.host}:{exc.port} ({exc.os_error.strerror or exc.os_error})"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return f"no connection within {connect_timeout:g} s"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection without answering (is it an HTTP server, and http vs https right?)"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def _model_ids(body: bytes) -> tuple[str, ...]:
    """The ids of an OpenAI-style model list (``{"data": [{"id": ...}, ...]}``), else ()."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        return ()
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return ()
    return tuple(str(item["id"]) for item in items if isinstance(item, dict) and "id" in item)


def _detail(body: bytes) -> str:
    """What an error answer says (its ``error.message`` when it is OpenAI-shaped)."""
    text = body[:4096].decode("utf-8", "replace")
    try:
        data: Any = json.loads(text)
    except ValueError:
        return text.strip()
    error = data.get("error", data.get("detail", data)) if isinstance(data, dict) else data
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


async def check_policy(
    policy: PolicyEndpoint,
    *,
    key_source: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT_SEC,
    timeout: float = TIMEOUT_SEC,
) -> PolicyCheck:
    """Ask ``GET {base_url}/models`` once and say what the answer means (see the module).

    :param key_source: where the key came from (``$OPENAI_API_KEY``), for the warning on a 401.
    """
    import aiohttp

    from osmosis_core.http.client import ResponseTooLarge, http_request, read_limited

    url = policy.base_url.rstrip("/") + "/models"
    secrets = policy.secrets()
    headers = dict(policy.headers)
    if policy.api_key:
        headers["Authorization"] = f"Bearer {policy.api_key}"
    limits = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
    try:
        async with http_request("GET", url, headers=headers, timeout=limits, allow_redirects=False) as response:
            status = response.status
            try:
                body = await read_limited(response, _MAX_BODY)
            except ResponseTooLarge:
                body = b""
    except aiohttp.ConnectionTimeoutError as exc:  # (a TimeoutError too: the connection never came)
        return PolicyCheck(url, unreachable=_reason(exc, connect_timeout))
    except (aiohttp.SocketTimeoutError, TimeoutError):
        return PolicyCheck(url, warning=clip(f"connected, but no answer to GET {url} within {timeout:g} s", secrets))
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return PolicyCheck(url, unreachable=clip(_reason(exc, connect_timeout), secrets, 240))
    models = _model_ids(body) if 200 <= status < 300 else ()
    said = _warning(policy, status, body, models, url, key_source)
    return PolicyCheck(url, status, warning=clip(said, secrets, 300) if said else None, models=models)


def _warning(
    policy: PolicyEndpoint, status: int, body: bytes, models: tuple[str, ...], url: str, key_source: str | None
) -> str | None:
    """What an HTTP answer to ``GET /models`` is worth saying (see the module), or None."""
    if 200 <= status < 300:
        if not models or policy.model in models:
            return None
        listed = ", ".join(models[:5]) + (f" and {len(models) - 5} more" if len(models) > 5 else "")
        return f"it lists no model named {policy.model!r} (it lists {listed}); --model sets the name"
    if status in (401, 403):
        if policy.api_key:
            why = f"{f'the key in {key_source}' if key_source else 'the key'} is refused or lacks access"
        else:
            why = "it wants a key: name its variable with [policy] api_key_env or --api-key-env"
        return f"answered {status} to GET {url}: {_detail(body)}; {why}"
    if status >= 500:
        return f"answered {status} to GET {url}: {_detail(body)}"
    return None  # 3xx, 404, 405...: a server without the route (the chat route may still be there)


def check_policy_sync(policy: PolicyEndpoint, *, key_source: str | None = None, **limits: float) -> PolicyCheck:
    """:func:`check_policy` from synchronous code (its own event loop, HTTP clients closed after)."""
    import anyio

    from osmosis_core.http.client import http_scope

    async def ask() -> PolicyCheck:
        async with http_scope():
            return await check_policy(policy, key_source=key_source, **limits)

    return anyio.run(ask)


def check_config_policy(config: RunConfig) -> tuple[PolicyEndpoint, PolicyCheck]:
    """A run config's ``[policy]`` endpoint (its key read from ``api_key_env``), and what it answered.

    :raises ConfigError: the key's variable is named but not set.
    """
    from osmosis_core._engine.config import policy_endpoint

    policy = policy_endpoint(config)
    key_source = f"${config.policy.api_key_env}" if config.policy.api_key_env else None
    return policy, check_policy_sync(policy, key_source=key_source)
