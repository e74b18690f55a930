"""The token-in bridge: SGLang's ``/generate`` served in front of an engine that lives inside the trainer.

verl's rollout engines are not reachable over HTTP by a rollout server: an agent loop reaches them
through a Python object (``LLMServerClient.generate(request_id, prompt_ids=..., sampling_params=...)``).
:class:`TokenBridge` is a small aiohttp server that speaks SGLang's native ``/generate`` (what
``osmosis serve --traces`` with ``[traces] adapter = "sglang-generate"`` calls: see
:mod:`osmosis_trainer.sglang`) and answers each request by awaiting a callable::

    async def generate(request_id: str, prompt_ids: list[int], sampling_params: dict)
        -> (token_ids, logprobs, finish_reason)

so rendering the chat template and parsing tool calls stay on the rollout side (the gateway), and the
trainer hands over exact token ids both ways.

* ``request_id`` is the rollout's id, from the ``X-Osmosis-Rollout-Id`` header (else the body's
  ``rid``): every call of one rollout carries the same one, which is what verl's sticky routing
  keys on (one rollout stays on one replica and reuses its prefix cache);
* ``sampling_params`` are the request's, renamed from SGLang's names to the engine's
  (:func:`osmosis_trainer.sglang.engine_sampling`: vLLM's ``max_tokens``/``min_tokens``/``seed``, or
  SGLang's own), with ``logprobs: True`` (the trace needs each token's sampling logprob); text-only
  settings are dropped, and what the engine cannot take (``n`` > 1, a grammar, an unknown name) is
  a 400 that names it;
* ``finish_reason`` is ``"stop"``, ``"length"`` or ``"abort"``; ``logprobs`` must be one per token.

Refused with SGLang's error shape (``{"error": {"message": ...}}``): a missing or wrong bearer
token (401), a body that is not one prompt of token ids (``text``, a batch, ``stream: true``:
400), a body over ``max_body_bytes`` (413). An engine that raises is a 500 naming the exception; an
answer without logprobs, or with a count that does not match its tokens, a 502.

It listens on loopback by default; any other address needs ``api_key`` (the rollout server then
sends it as the policy's bearer, ``RolloutRequest.llm_api_key``). ``advertise_host`` is the name
the rollout server reaches it by, when that is not the address it listens on (``0.0.0.0`` on a
node whose address the rollout server knows).

>>> import asyncio
>>> async def engine(request_id, prompt_ids, sampling_params):
...     return [prompt_ids[-1] + 1], [-0.5], "stop"
>>> async def demo():
...     async with TokenBridge(engine) as bridge:
...         return bridge.url.startswith("http://127.0.0.1:")
>>> asyncio.run(demo())
True
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import attrs

from osmosis_trainer._http import check_listening
from osmosis_trainer.sglang import FINISH_REASONS, EngineNames, SamplingError, engine_sampling, generate_answer
from osmosis_trainer.wire import ROLLOUT_ID_HEADER

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["BridgeUsage", "Decode", "GenerateFn", "TokenBridge"]

logger = logging.getLogger("osmosis_trainer.bridge")

GenerateFn = Callable[[str, list[int], dict[str, Any]], Awaitable[tuple[Sequence[int], Sequence[float] | None, str]]]
"""``(request_id, prompt_ids, sampling_params) -> (token_ids, logprobs, finish_reason)``."""

Decode = Callable[[list[int], bool], str]
"""``(token_ids, skip_special_tokens) -> text``: fills the answer's ``text`` (else it is empty)."""

MAX_BODY_BYTES: Final = 64 * 1024 * 1024


@attrs.define
class BridgeUsage:
    """What one request id (one rollout) cost the engine through the bridge."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    """Time spent awaiting the engine."""
    finish_reasons: list[str] = attrs.field(factory=list)


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def _prompt_ids(body: Mapping[str, Any]) -> list[int]:
    ids = body.get("input_ids")
    if ids is None:
        if body.get("text") is not None:
            raise _Refused(400, "text prompts are not served: send input_ids (the bridge has no tokenizer)")
        raise _Refused(400, "input_ids is required")
    if not isinstance(ids, list) or not ids:
        raise _Refused(400, "input_ids must be a non-empty list of token ids")
    if isinstance(ids[0], list):
        raise _Refused(400, "input_ids holds a batch: the bridge takes one prompt per request")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        bad = next(t for t in ids if not (isinstance(t, int) and not isinstance(t, bool) and t >= 0))
        raise _Refused(400, f"input_ids must be non-negative integers, got {bad!r}")
    return ids


class TokenBridge:
    """SGLang's ``/generate`` on HTTP, answered by ``generate`` (see the module docstring).

    :param generate: the engine call (:data:`GenerateFn`).
    :param names: the naming of the engine's sampling dict: ``"vllm"`` or ``"sglang"``.
    :param host: the address to listen on (loopback by default); any other needs ``api_key``.
    :param port: 0 for a free one (:attr:`url` says which).
    :param api_key: the bearer token every request must carry (``Authorization: Bearer <key>``).
    :param advertise_host: the host name :attr:`url` gives (default ``host``; ``127.0.0.1`` for ``0.0.0.0``).
    :param decode: fills each answer's ``text`` (:data:`Decode`); the gateway may decode the ids itself.
    :param max_body_bytes: a larger request is a 413.
    """

    def __init__(
        self,
        generate: GenerateFn,
        *,
        names: EngineNames = "vllm",
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        advertise_host: str | None = None,
        decode: Decode | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        if names not in ("vllm", "sglang"):
            raise ValueError(f"names must be 'vllm' or 'sglang', got {names!r}")
        check_listening(host, api_key, "the bridge")
        self._generate = generate
        self.names: EngineNames = names
        self.host = host
        self._port = port
        self._api_key = api_key
        self.advertise_host = advertise_host
        self._decode = decode
        self.max_body_bytes = max_body_bytes
        self._runner: web.AppRunner | None = None
        self._usage: dict[str, BridgeUsage] = {}
        self.requests = 0
        """Requests answered (any status)."""

    def __repr__(self) -> str:
        where = self.url if self._runner is not None else "not started"
        return f"TokenBridge({where}, names={self.names!r})"

    @property
    def api_key(self) -> str | None:
        """The bearer the rollout server must send (``RolloutRequest.llm_api_key``)."""
        return self._api_key

    @property
    def url(self) -> str:
        """The base URL to hand the rollout server as the policy (``RolloutRequest.chat_completions_url``).

        :raises RuntimeError: not started."""
        if self._runner is None:
            raise RuntimeError("the bridge is not started")
        host = self.advertise_host or ("127.0.0.1" if self.host in ("0.0.0.0", "") else self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self._port}"

    # -- lifetime ----------------------------------------------------------------------------------

    async def start(self) -> TokenBridge:
        """Listen on the running loop. :raises RuntimeError: already started; OSError: the port is taken."""
        from aiohttp import web

        if self._runner is not None:
            raise RuntimeError(f"{self!r} is already started")
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post("/generate", self._handle_generate)
        app.router.add_get("/health", self._handle_health)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self._port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        address = runner.addresses[0]
        self._port = int(address[1])
        self._runner = runner
        return self

    async def close(self) -> None:
        """Stop listening (requests in flight are answered first); idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> TokenBridge:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- accounting --------------------------------------------------------------------------------

    def usage(self, request_id: str) -> BridgeUsage | None:
        """What ``request_id``'s calls have cost so far (None: none yet)."""
        return self._usage.get(request_id)

    def pop_usage(self, request_id: str) -> BridgeUsage:
        """What ``request_id``'s calls cost, forgotten here (an adapter reads it once its rollout is over)."""
        return self._usage.pop(request_id, None) or BridgeUsage()

    # -- the routes ------------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        if self._api_key is None:
            return True
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._api_key.encode())

    async def _handle_health(self, request: web.Request) -> web.Response:
        from aiohttp import web

        if not self._authorized(request):
            return _error(web, 401, "missing or wrong bearer token")
        return web.json_response({})

    async def _handle_generate(self, request: web.Request) -> web.Response:
        from aiohttp import web

        self.requests += 1
        if not self._authorized(request):
            return _error(web, 401, "missing or wrong bearer token")
        try:
            body = await request.json(loads=json.loads)
        except web.HTTPRequestEntityTooLarge:
            return _error(web, 413, f"the body is over {self.max_body_bytes} bytes")
        except ValueError as exc:
            return _error(web, 400, f"the body is not JSON: {exc}")
        try:
            if not isinstance(body, dict):
                raise _Refused(400, "the body must be a JSON object")
            if body.get("stream"):
                raise _Refused(400, "stream: the bridge answers non-streaming requests only")
            prompt_ids = _prompt_ids(body)
            sampling = body.get("sampling_params") or {}
            if not isinstance(sampling, dict):
                raise _Refused(400, "sampling_params must be an object")
            try:
                params = engine_sampling(sampling, names=self.names)
            except SamplingError as exc:
                raise _Refused(400, str(exc)) from None
        except _Refused as exc:
            return _error(web, exc.status, str(exc))
        params["logprobs"] = True
        rid = body.get("rid") if isinstance(body.get("rid"), str) else None
        request_id = request.headers.get(ROLLOUT_ID_HEADER) or rid or uuid.uuid4().hex
        usage = self._usage.setdefault(request_id, BridgeUsage())
        started = time.perf_counter()
        try:
            token_ids, logprobs, finish = await self._generate(request_id, prompt_ids, params)
        except Exception as exc:
            logger.warning("the engine failed a request of %s: %s: %s", request_id, type(exc).__name__, exc)
            return _error(web, 500, f"the engine failed: {type(exc).__name__}: {exc}")
        finally:
            usage.seconds += time.perf_counter() - started
            usage.calls += 1
        tokens = [int(t) for t in token_ids]
        if logprobs is None:
            return _error(web, 502, "the engine returned no logprobs")
        if len(logprobs) != len(tokens):
            return _error(web, 502, f"the engine returned {len(logprobs)} logprobs for {len(tokens)} tokens")
        if finish not in FINISH_REASONS:
            return _error(web, 502, f"the engine's finish reason {finish!r} is not one of {sorted(FINISH_REASONS)}")
        usage.prompt_tokens += len(prompt_ids)
        usage.completion_tokens += len(tokens)
        usage.finish_reasons.append(finish)
        text = ""
        if self._decode is not None:
            text = self._decode(tokens, bool(sampling.get("skip_special_tokens", True)))
        answer = generate_answer(rid or request_id, len(prompt_ids), tokens, list(logprobs), finish, text=text)
        return web.json_response(answer)


def _error(module: Any, status: int, message: str) -> web.Response:
    """SGLang's error answer (``{"error": {"message": ...}}``); ``module`` is ``aiohttp.web``."""
    response: web.Response = module.json_response({"error": {"message": message}}, status=status)
    return response
