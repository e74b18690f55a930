"""A policy server that samples the trainer's **live** model object: a development tool for
smoke-testing a training setup on a laptop before renting GPUs.

:class:`LivePolicyServer` serves a ``transformers`` causal LM over HTTP on loopback, in vLLM's
chat-completions answer shape (what ``osmosis serve --traces`` and its policy gateway read with
``adapter = "vllm"``): ``return_token_ids`` gives the top-level ``prompt_token_ids`` and the
choice's ``token_ids``; ``logprobs`` gives ``logprobs.content`` entries (``"token_id:N"`` tokens with
``return_tokens_as_token_ids``); tool calls are parsed from the generated text. It holds the model
object itself, not a copy: a trainer updating the weights in place (TRL does) makes every later
rollout sample the new weights, with no weight sync. Each answer's ``system_fingerprint`` names the
weights it was sampled from (:func:`weights_fingerprint`, taken at each request).

It also serves token ids in and out, for a gateway that renders the chat template itself
(``osmosis serve`` with ``[traces] adapter = "trl-generate"``): ``POST /inference/v1/generate``, the
route ``trl vllm-serve`` offers for token-id prompts (vLLM's ``GenerateRequest``: ``token_ids`` and
``sampling_params``; see :meth:`LivePolicyServer.generate`).

Sampling is done here, token by token under a lock (one request at a time, batch of one, with a KV
cache): the temperature, ``top_k``, ``top_p``, ``min_p``, ``max_tokens`` and ``seed`` of the
request, and each generated token's logprob under the distribution it was drawn from (vLLM's
``processed_logprobs``: after temperature and truncation). With ``top_k``, ``top_p`` and ``min_p``
off, that is what a trainer recomputes (``log_softmax(logits / temperature)``): measured, they agree
to under 1e-5. Generation stops after the tokenizer's end-of-sequence token (included in the ids, as
vLLM does) or ``max_tokens`` (``finish_reason: length``).

Tool calls (``tool_parser``):

* ``"hermes"`` (default): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks at the end
  of the answer, as Qwen2.5/Qwen3 and Hermes models write them (vLLM's ``hermes`` parser);
* ``"tiny"``: :mod:`osmosis_trainer.tiny_model`'s format (see :func:`parse_tiny_tool_calls`);
* a function ``(text, tools) -> (content, tool_calls)``.

Not served: ``n`` other than 1, ``stop`` strings, the penalties, ``tool_choice`` other than
``"auto"`` / ``"none"`` (each a 400 that names the field). Needs ``torch`` and ``transformers``
(``pip install osmosis-trainer[live-policy]``), imported by :meth:`LivePolicyServer.start`.

A smoke test of a whole setup (the model object is the one the trainer trains)::

    from osmosis_trainer.live_policy import LivePolicyServer
    from osmosis_trainer.tiny_model import char_tokenizer, tiny_model

    tokenizer = char_tokenizer()
    model = tiny_model(tokenizer)
    with LivePolicyServer(model, tokenizer, tool_parser="tiny") as policy:
        print(policy.url)  # http://127.0.0.1:<port>/v1: the rollouts' chat_completions_url
        rollout = OsmosisRollout(server_url, policy_url=policy.url, dataset=dataset)
        GRPOTrainer(model=model, processing_class=tokenizer, rollout_func=rollout, ...).train()
"""

from __future__ import annotations

import hmac
import inspect
import json
import re
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from osmosis_trainer._http import check_listening

if TYPE_CHECKING:
    import torch

__all__ = [
    "LivePolicyServer",
    "ServedCall",
    "ToolParser",
    "parse_hermes_tool_calls",
    "parse_tiny_tool_calls",
    "weights_fingerprint",
]

ToolParser = Callable[[str, Sequence[Mapping[str, Any]]], tuple[str | None, list[dict[str, Any]]]]
"""``(generated text, the request's tools) -> (content, tool calls in OpenAI's shape)``."""

MAX_BODY_BYTES: Final = 16 * 1024 * 1024
_UNSUPPORTED: Final = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}
"""Settings the server does not apply, and the value each may have anyway (it changes nothing)."""
_HERMES: Final = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class RequestError(ValueError):
    """A request the server does not serve: answered 400 with this message."""


def _call(index: int, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "index": index,
        "function": {"name": name, "arguments": arguments},
    }


def _first_tool(tools: Sequence[Mapping[str, Any]]) -> str | None:
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = (function or tool).get("name") if isinstance(function or tool, Mapping) else None
        if isinstance(name, str):
            return name
    return None


def parse_tiny_tool_calls(text: str, tools: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """A tool call in :mod:`osmosis_trainer.tiny_model`'s format: the text before the first
    ``<tool_call>`` is the content, everything after it the call's arguments (one call a turn). The
    call names no function: it goes to the first of ``tools`` (without tools, the whole text is
    content). Whatever the text, the template renders the message back to the same tokens.

    >>> tools = [{"type": "function", "function": {"name": "lookup"}}]
    >>> content, [call] = parse_tiny_tool_calls("ok<tool_call>box 3", tools)
    >>> content, call["function"]
    ('ok', {'name': 'lookup', 'arguments': 'box 3'})
    >>> parse_tiny_tool_calls("no call", [{"function": {"name": "lookup"}}])
    ('no call', [])
    """
    name = _first_tool(tools)
    start = text.find("<tool_call>")
    if name is None or start < 0:
        return text, []
    return text[:start] or None, [_call(0, name, text[start + len("<tool_call>") :])]


def parse_hermes_tool_calls(text: str, tools: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Hermes / Qwen tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
    after the content, as vLLM's ``hermes`` parser reads them. An answer whose blocks are not all
    well-formed JSON with a ``name`` (or that has text after them) is all content.

    >>> text = 'Let me see.<tool_call>\\n{"name": "f", "arguments": {"a": 1}}\\n</tool_call>'
    >>> content, calls = parse_hermes_tool_calls(text, [])
    >>> content, calls[0]["function"]
    ('Let me see.', {'name': 'f', 'arguments': '{"a": 1}'})
    """
    start = text.find("<tool_call>")
    if start < 0:
        return text, []
    calls: list[dict[str, Any]] = []
    position = start
    for match in _HERMES.finditer(text, start):
        if text[position : match.start()].strip():
            return text, []  # text between the calls: not a clean call list
        try:
            call = json.loads(match.group(1))
        except ValueError:
            return text, []
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, []
        arguments = call.get("arguments", call.get("parameters", {}))
        encoded = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        calls.append(_call(len(calls), call["name"], encoded))
        position = match.end()
    if not calls or text[position:].strip():
        return text, []
    return text[:start] or None, calls


_PARSERS: Final[dict[str, ToolParser]] = {"hermes": parse_hermes_tool_calls, "tiny": parse_tiny_tool_calls}


def weights_fingerprint(model: Any, *, values_per_tensor: int = 4096) -> str:
    """A CRC-32 of ``model``'s parameters, as 8 hex digits: the same weights give the same
    fingerprint, an optimizer step almost surely another. Each parameter contributes up to
    ``values_per_tensor`` values spread evenly over it (every value of a small one), so it costs
    about a millisecond per million values read, whatever the model's size."""
    import torch

    crc = 0
    for parameter in model.parameters():
        data = parameter.detach().reshape(-1)
        if data.numel() > values_per_tensor:
            data = data[:: -(-data.numel() // values_per_tensor)]
        crc = zlib.crc32(data.contiguous().view(torch.uint8).cpu().numpy(), crc)
    return f"{crc:08x}"


@attrs.frozen
class ServedCall:
    """One answered chat completion (:attr:`LivePolicyServer.calls`)."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    weights: str
    """The fingerprint of the weights it was sampled from (:func:`weights_fingerprint`)."""
    seconds: float


@attrs.frozen(kw_only=True)
class _Sampling:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int | None = None
    seed: int | None = None


def _number(body: Mapping[str, Any], name: str, default: float, check: Callable[[float], bool], rule: str) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not check(float(value)):
        raise RequestError(f"{name} {rule}, got {value!r}")
    return float(value)


def _integer(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} must be an integer, got {value!r}")
    return value


def _sampling(body: Mapping[str, Any]) -> _Sampling:
    """The request's sampling settings; what the server does not serve is a :class:`RequestError`."""
    if body.get("n", 1) not in (1, None):
        raise RequestError(f"n={body.get('n')!r}: the live policy server answers one choice per request")
    if body.get("stop") not in (None, [], ""):
        raise RequestError("stop: stop strings are not served by the live policy server (the end-of-sequence token is)")
    for name, neutral in _UNSUPPORTED.items():
        if body.get(name) not in (None, neutral):
            raise RequestError(f"{name}: not served by the live policy server (only {neutral} or none)")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(f"tool_choice={choice!r}: the live policy server serves 'auto' and 'none' only")
    top_k = _integer(body, "top_k")
    if top_k is not None and top_k < -1:
        raise RequestError(f"top_k must be -1, 0 (off) or a count of tokens, got {top_k}")
    max_tokens = _integer(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise RequestError(f"max_tokens must be >= 1, got {max_tokens}")
    return _Sampling(
        temperature=_number(body, "temperature", 1.0, lambda v: v >= 0, "must be >= 0"),
        top_k=max(top_k or 0, 0),
        top_p=_number(body, "top_p", 1.0, lambda v: 0 < v <= 1, "must be in (0, 1]"),
        min_p=_number(body, "min_p", 0.0, lambda v: 0 <= v <= 1, "must be in [0, 1]"),
        max_tokens=max_tokens,
        seed=_integer(body, "seed"),
    )


class LivePolicyServer:
    """Serve ``model`` (the very object a trainer trains) over HTTP on loopback (see the module docstring).

    :param model: a ``transformers`` causal LM (``model(input_ids, past_key_values=..., use_cache=True)``).
    :param tokenizer: its tokenizer, with a chat template (``apply_chat_template``); its
        end-of-sequence token ends a generation.
    :param tool_parser: ``"hermes"``, ``"tiny"`` or a :data:`ToolParser`.
    :param model_name: the name ``/v1/models`` lists and answers carry (requests may name any).
    :param host: the address to listen on (loopback by default). Any other address needs ``api_key``.
    :param api_key: a bearer token every request must carry (``Authorization: Bearer <key>``, what an
        OpenAI client sends as its API key); None: no token, which only loopback allows.
    :param port: 0 for a free one (:attr:`url` says which).
    :param max_model_len: the longest prompt + generation (default the model's
        ``max_position_embeddings``); a longer prompt is a 400.
    :param keep_calls: how many :class:`ServedCall` records :attr:`calls` keeps (the latest).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        tool_parser: Literal["hermes", "tiny"] | ToolParser = "hermes",
        model_name: str = "live-policy",
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        max_model_len: int | None = None,
        keep_calls: int = 100_000,
    ) -> None:
        if isinstance(tool_parser, str):
            if tool_parser not in _PARSERS:
                raise ValueError(f"tool_parser must be one of {', '.join(_PARSERS)} or a function, got {tool_parser!r}")
            self._parse: ToolParser = _PARSERS[tool_parser]
        else:
            self._parse = tool_parser
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len or int(getattr(model.config, "max_position_embeddings", 4096))
        check_listening(host, api_key, "the server")
        self._host = host
        self._port = port
        self._api_key = api_key
        self._lock = threading.Lock()
        self._calls: deque[ServedCall] = deque(maxlen=keep_calls)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stop_ids: frozenset[int] = frozenset()
        self._cache_name = "past_key_values"

    def __repr__(self) -> str:
        where = self.url if self._server is not None else "not started"
        return f"LivePolicyServer({type(self.model).__name__}, {where})"

    # -- lifetime ----------------------------------------------------------------------------------

    def start(self) -> LivePolicyServer:
        """Listen (in a daemon thread); returns the server. :raises RuntimeError: already started."""
        if self._server is not None:
            raise RuntimeError(f"{self!r} is already started")
        import torch  # noqa: F401 - a missing torch fails here, not in the first request

        eos = self.tokenizer.eos_token_id
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids = {eos} if isinstance(eos, int) else set()
        if isinstance(configured, int):
            ids.add(configured)
        elif isinstance(configured, (list, tuple)):
            ids.update(i for i in configured if isinstance(i, int))
        if not ids:
            raise ValueError("the tokenizer has no eos_token_id: nothing would end a generation")
        self._stop_ids = frozenset(ids)
        # transformers 5 names the KV cache `cache` (`past_key_values` before, deprecated since)
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_name = "cache" if "cache" in parameters else "past_key_values"
        server = ThreadingHTTPServer((self._host, self._port), _handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="live-policy-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (a request being answered finishes first); idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> LivePolicyServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The OpenAI base URL (``http://127.0.0.1:<port>/v1``): a rollout's ``chat_completions_url``."""
        if self._server is None:
            raise RuntimeError("the live policy server is not started")
        host, port = self._server.server_address[:2]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else str(host)
        return f"http://{host}:{port}/v1"

    @property
    def calls(self) -> list[ServedCall]:
        """The answered chat completions, oldest first (the last ``keep_calls``)."""
        with self._lock:
            return list(self._calls)

    # -- answering -----------------------------------------------------------------------------------

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one chat-completions request body (what ``POST /v1/chat/completions`` does).

        :raises RequestError: a request the server does not serve (the message names the field).
        """
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list")
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            raise RequestError("tools must be a list")
        sampling = _sampling(body)
        try:
            prompt = self.tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as exc:  # a template error is the request's: say which
            raise RequestError(f"the chat template failed on these messages: {type(exc).__name__}: {exc}") from None
        prompt = [int(i) for i in prompt]
        generated, logprobs, finish, weights = self._serve(prompt, sampling)
        text = self.tokenizer.decode(generated, skip_special_tokens=False)
        end = self.tokenizer.eos_token
        if finish == "stop" and isinstance(end, str) and text.endswith(end):
            text = text[: -len(end)]
        content, tool_calls = (text, []) if body.get("tool_choice") == "none" else self._parse(text, tools)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
            finish = "tool_calls" if finish == "stop" else finish
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        if body.get("logprobs") is True:
            as_ids = body.get("return_tokens_as_token_ids") is True
            pieces = [f"token_id:{i}" for i in generated] if as_ids else self.tokenizer.convert_ids_to_tokens(generated)
            choice["logprobs"] = {"content": _logprob_content(pieces, logprobs)}
        else:
            choice["logprobs"] = None
        answer: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model_name,
            "system_fingerprint": f"weights-{weights}",
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(generated),
                "total_tokens": len(prompt) + len(generated),
            },
        }
        if body.get("return_token_ids") is True:
            answer["prompt_token_ids"] = prompt
            choice["token_ids"] = generated
        return answer

    def generate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one token-in request body (what ``POST /inference/v1/generate`` does: vLLM's token
        route, which ``trl vllm-serve`` serves and TRL's ``VLLMClient`` calls with token ids):
        ``{"request_id", "model", "token_ids": [...], "sampling_params": {"max_tokens", "temperature",
        "top_p", "top_k", "min_p", "seed", "logprobs": 0}}``; the answer's one choice holds the
        generated ``token_ids``, their ``logprobs.content`` (``"token_id:N"`` tokens) when
        ``sampling_params.logprobs`` is set, and the ``finish_reason``.

        :raises RequestError: a request the server does not serve (the message names the field).
        """
        if body.get("stream") is True:
            raise RequestError("stream: the token route answers whole (stream false)")
        prompt = body.get("token_ids")
        size = len(self.tokenizer)
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < size for i in prompt)
        ):
            raise RequestError(f"token_ids must be a non-empty list of token ids (0 to {size - 1})")
        params = body.get("sampling_params", {})
        if not isinstance(params, dict):
            raise RequestError("sampling_params must be an object")
        if params.get("logprobs") not in (None, 0):
            raise RequestError("sampling_params.logprobs: the live policy server returns the sampled token's only (0)")
        generated, logprobs, finish, _ = self._serve(prompt, _sampling(params))
        choice: dict[str, Any] = {"index": 0, "token_ids": generated, "logprobs": None, "finish_reason": finish}
        if params.get("logprobs") is not None:
            choice["logprobs"] = {"content": _logprob_content([f"token_id:{i}" for i in generated], logprobs)}
        request_id = body.get("request_id")
        return {
            "request_id": request_id if isinstance(request_id, str) else f"generate-{uuid.uuid4().hex}",
            "choices": [choice],
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }

    def _serve(self, prompt: list[int], sampling: _Sampling) -> tuple[list[int], list[float], str, str]:
        """Generate after ``prompt`` (under the lock, recorded in :attr:`calls`): ids, logprobs, finish
        reason, and the fingerprint of the weights that generated them.

        :raises RequestError: the prompt leaves no room in the model's context."""
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens: the model's maximum context length is {self.max_model_len}"
            )
        limit = min(sampling.max_tokens or room, room)
        started = time.perf_counter()
        with self._lock:
            weights = weights_fingerprint(self.model)
            generated, logprobs, finish = self._generate(prompt, sampling, limit)
            seconds = time.perf_counter() - started
            self._calls.append(ServedCall(len(prompt), len(generated), finish, weights, seconds))
        return generated, logprobs, finish, weights

    def _generate(self, prompt: list[int], sampling: _Sampling, limit: int) -> tuple[list[int], list[float], str]:
        """Sample up to ``limit`` tokens after ``prompt`` (the lock held): ids, logprobs, finish reason."""
        import torch

        device = next(self.model.parameters()).device
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(sampling.seed)
        generated: list[int] = []
        logprobs: list[float] = []
        with torch.no_grad():
            output = self.model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
            while True:
                logits = output.logits[0, -1].float()
                token, logprob = _sample(logits, sampling, generator)
                generated.append(token)
                logprobs.append(logprob)
                if token in self._stop_ids:
                    return generated, logprobs, "stop"
                if len(generated) >= limit:
                    return generated, logprobs, "length"
                cache = getattr(output, self._cache_name)
                output = self.model(
                    input_ids=torch.tensor([[token]], device=device), use_cache=True, **{self._cache_name: cache}
                )


def _logprob_content(pieces: list[str], logprobs: list[float]) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content`` entries (the sampled token's logprob, no alternatives)."""
    return [
        {"token": piece, "logprob": logprob, "bytes": None, "top_logprobs": []}
        for piece, logprob in zip(pieces, logprobs, strict=True)
    ]


def _sample(logits: torch.Tensor, sampling: _Sampling, generator: torch.Generator | None) -> tuple[int, float]:
    """One token from ``logits`` and its logprob under the distribution it was drawn from."""
    import torch

    if sampling.temperature == 0:  # greedy, with the model's own logprob (as vLLM gives it)
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, -1)[token])
    scores = logits / sampling.temperature
    # vLLM's order: temperature, then min_p (an argmax-invariant logits processor), then top-k and top-p
    if sampling.min_p > 0.0:
        probabilities = torch.softmax(scores, -1)
        scores = scores.masked_fill(probabilities < sampling.min_p * probabilities.max(), float("-inf"))
    if sampling.top_k and sampling.top_k < scores.numel():
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(ordered, -1).cumsum(-1)
        drop = cumulative - torch.softmax(ordered, -1) >= sampling.top_p  # keep the smallest set reaching top_p
        scores = scores.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    logprobs = torch.log_softmax(scores, -1)
    token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
    return token, float(logprobs[token])


def _handler(server: LivePolicyServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "osmosis-live-policy"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: a training step makes dozens of requests

        def _send(self, status: int, document: Any) -> None:
            payload = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _error(self, status: int, message: str) -> None:
            kind = "invalid_request_error" if status < 500 else "server_error"
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def _allowed(self) -> bool:
            """The request carries the server's api_key (or none is set); else a 401 is sent."""
            key = server._api_key
            if key is None:
                return True
            sent = self.headers.get("Authorization") or ""
            if hmac.compare_digest(sent.encode(), f"Bearer {key}".encode()):
                return True
            self.close_connection = True
            self._error(401, "a bearer token is required (Authorization: Bearer <api_key>)")
            return False

        def do_GET(self) -> None:
            if not self._allowed():
                return
            path = self.path.split("?", 1)[0].rstrip("/")
            if path in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            elif path == "/v1/models":
                model = {"id": server.model_name, "object": "model", "created": 0, "owned_by": "osmosis"}
                self._send(200, {"object": "list", "data": [model]})
            else:
                self._error(404, f"not found: GET {self.path}")

        def do_POST(self) -> None:
            if not self._allowed():
                return
            path = self.path.split("?", 1)[0].rstrip("/")
            token_in = path == "/inference/v1/generate"
            if not token_in and not path.endswith("/chat/completions"):
                self._error(404, f"not found: POST {self.path}")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self.close_connection = True  # the body is not read: the connection cannot carry on
                if length < 0:
                    self._error(400, "Content-Length must be a count of bytes")
                else:
                    self._error(413, f"the body has {length} bytes; at most {MAX_BODY_BYTES}")
                return
            try:
                body = json.loads(self.rfile.read(length) or b"null")
                if not isinstance(body, dict):
                    raise RequestError("the body must be a JSON object")
                answer = server.generate(body) if token_in else server.complete(body)
            except (ValueError, RequestError) as exc:  # JSON errors are ValueErrors too
                self._error(400, str(exc))
                return
            except Exception as exc:  # the model failed: the client gets a 500 that says why
                self._error(500, f"{type(exc).__name__}: {exc}")
                return
            if body.get("stream") is True and not token_in:
                self._stream(answer, include_usage=bool((body.get("stream_options") or {}).get("include_usage")))
            else:
                self._send(HTTPStatus.OK, answer)

        def _stream(self, answer: dict[str, Any], *, include_usage: bool) -> None:
            """The whole answer as server-sent events, as vLLM streams it (ids and logprobs in the deltas)."""
            base = {k: answer[k] for k in ("id", "created", "model", "system_fingerprint")}
            base["object"] = "chat.completion.chunk"
            choice = answer["choices"][0]
            message = choice["message"]
            first: dict[str, Any] = {"role": "assistant", "content": message["content"] or ""}
            if message.get("tool_calls"):
                first["tool_calls"] = message["tool_calls"]
            delta: dict[str, Any] = {"index": 0, "delta": first, "logprobs": choice["logprobs"], "finish_reason": None}
            if "token_ids" in choice:
                delta["token_ids"] = choice["token_ids"]
            chunks: list[dict[str, Any]] = [{**base, "choices": [delta]}]
            if "prompt_token_ids" in answer:
                chunks[0]["prompt_token_ids"] = answer["prompt_token_ids"]
            chunks.append(
                {
                    **base,
                    "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}],
                }
            )
            if include_usage:
                chunks.append({**base, "choices": [], "usage": answer["usage"]})
            payload = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler
