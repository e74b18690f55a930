"""A scripted token-in engine for tests: SGLang's ``/generate``, vLLM's ``/v1/completions`` with a
token-id prompt and vLLM's ``/inference/v1/generate`` (what TRL 1.16's ``trl vllm-serve`` serves),
over real HTTP on a loopback address, with a tokenizer of its own.

It decodes the prompt ids with its tokenizer, asks a *script* (prompt text in, generated text out)
what to say, encodes that, ends it with the stop token, and answers with the ids and a logprob per
id, in each engine's own shape. Every request is logged (:attr:`ScriptedTokenEngine.requests`) with
the ids it saw and the ids it produced, so a test compares a trace with what the engine did.

:func:`write_test_tokenizer` builds a small byte-level BPE tokenizer folder offline (no hub
access): ``tokenizer.json`` and a ``tokenizer_config.json`` holding a Qwen-like ChatML template with
tools (``template="chatml"``), or one that re-renders history as Qwen3's does
(``template="drifting"``): past ``<think>`` blocks dropped, an empty one written on a last assistant
turn without one. Needs ``tokenizers`` (osmosis-gateway's ``token-in`` extra).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["EngineRequest", "ScriptedTokenEngine", "TextScript", "calculator_text", "write_test_tokenizer"]

TextScript = Callable[[str], str]
"""A script of the engine: the prompt as text in, the generated text out (before its stop token)."""

_CHATML: Final = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\nCall a tool as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content or '' %}
        {%- if DRIFT and not loop.last and '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' }}
        {%- if DRIFT and loop.last and '<think>' not in content %}
            {{- '<think>\n\n</think>\n\n' }}
        {%- endif %}
        {{- content }}
        {%- for call in message.tool_calls or [] %}
            {%- if content or not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {%- set arguments = call.function.arguments %}
            {{- '<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
            {{- arguments if arguments is string else arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and not enable_thinking %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""
_SPECIAL: Final = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_ADDED: Final = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
                 "[TOOL_CALLS]", "<|python_tag|>")  # fmt: skip
_CORPUS: Final = (
    "You are a helpful assistant. Multiply the numbers: what is 12 times 7? The answer is 84.\n"
    '{"name": "multiply", "arguments": {"a": 12, "b": 7}} {"type": "function", "function": '
    '{"name": "multiply", "description": "Multiply two numbers.", "parameters": {"type": "object", '
    '"properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}\n'
    "#### 0123456789 system user assistant tool Tools tools Call a tool as"
)


def write_test_tokenizer(folder: str | Path, template: Literal["chatml", "drifting"] = "chatml") -> Path:
    """Write a small byte-level BPE tokenizer with a ChatML template to ``folder`` (made if missing).

    Any text encodes (bytes are the base alphabet) and decodes back exactly. ``<|im_end|>`` is its
    ``eos_token``; ``<tool_call>`` and the like are single added tokens, as in Qwen's.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=list(_SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_CORPUS] * 4, trainer)
    tokenizer.add_tokens(list(_ADDED))
    tokenizer.save(str(folder / "tokenizer.json"))
    text = _CHATML.replace("DRIFT", "true" if template == "drifting" else "false")
    config = {"chat_template": text, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder


_TOOL_RESPONSE: Final = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)
_MULTIPLY: Final = {"type": "function", "function": {"name": "multiply"}}


def calculator_text(prompt: str) -> str:
    """:func:`~osmosis_core.testing.scripts.calculator` in Hermes format, read from a ChatML prompt:
    a ``<tool_call>`` of ``multiply`` for the last user message's two numbers, then, once a tool
    answered after it, the answer ``#### N`` (``#### 0`` when the message holds no two numbers)."""
    from osmosis_core.testing.scripts import calculator

    user = prompt.rpartition("<|im_start|>user\n")[2]
    answers = _TOOL_RESPONSE.findall(user)
    if answers:  # (a tool's answer comes as a user turn in ChatML)
        request = {"messages": [{"role": "tool", "content": answers[0]}]}
    else:
        request = {"messages": [{"role": "user", "content": user.partition("<|im_end|>")[0]}], "tools": [_MULTIPLY]}
    reply = calculator(request)
    calls = [
        '<tool_call>\n{"name": ' + json.dumps(call.name) + ', "arguments": ' + call.arguments_json() + "}\n</tool_call>"
        for call in reply.tool_calls
    ]
    return "\n".join(calls) if calls else reply.content or ""


@attrs.frozen
class EngineRequest:
    """One request the engine answered: its route, body, the ids it saw and the ids it produced."""

    route: str
    body: dict[str, Any]
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]
    rollout_id: str | None


class ScriptedTokenEngine:
    """A token-in engine on a loopback address, answering with ``script``'s text as ids.

    :param tokenizer: the engine's tokenizer folder (``tokenizer.json``, ``tokenizer_config.json``).
    :param script: prompt text in, generated text out (default :func:`calculator_text`).
    :param finish: ``stop`` (the stop token ends each answer) or ``length`` (no stop token: cut).
    :param stop_token: the token that ends each answer (default the config's ``eos_token``; a model
        may stop on another, as Qwen on ``<|endoftext|>``).
    """

    def __init__(
        self, tokenizer: str | Path, script: TextScript | None = None, *, finish: str = "stop",
        stop_token: str | None = None,
    ) -> None:  # fmt: skip
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
        config = json.loads((Path(tokenizer) / "tokenizer_config.json").read_text(encoding="utf-8"))
        eos = stop_token if stop_token is not None else config["eos_token"]
        stop_id = self.tokenizer.token_to_id(eos if isinstance(eos, str) else eos["content"])
        if stop_id is None:
            raise ValueError(f"the stop token {eos!r} is not in {tokenizer}/tokenizer.json")
        self.stop_id: int = stop_id
        self.script = script or calculator_text
        self.finish = finish
        self.requests: list[EngineRequest] = []
        self._runner: web.BaseRunner | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        """The engine's base URL (``http://127.0.0.1:PORT``)."""
        if self._port is None:
            raise RuntimeError("the engine is not running")
        return f"http://127.0.0.1:{self._port}"

    def _generate(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
        text = self.script(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.finish == "stop":
            ids.append(self.stop_id)
        return ids, [-0.05 - 0.01 * (i % 7) for i in range(len(ids))]

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        from aiohttp import web

        path = request.path
        if request.method != "POST" or path not in ("/generate", "/v1/completions", "/inference/v1/generate"):
            return web.json_response({"error": f"not found: {request.method} {path}"}, status=404)
        try:
            body = json.loads(await request.read())
            key = {"/generate": "input_ids", "/v1/completions": "prompt"}.get(path, "token_ids")
            prompt = body[key]
            if not isinstance(prompt, list) or not all(isinstance(i, int) for i in prompt):
                raise TypeError(f"{key} is not a list of ids")
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": {"message": f"bad request: {exc}"}}, status=400)
        ids, logprobs = self._generate(prompt)
        rollout = request.headers.get("X-Osmosis-Rollout-Id")
        self.requests.append(EngineRequest(path, body, prompt, ids, logprobs, rollout))
        reason = "stop" if self.finish == "stop" else "length"
        text = self.tokenizer.decode(ids)
        if path == "/generate":
            finish: dict[str, Any] = {"type": "stop", "matched": self.stop_id} if reason == "stop" else {
                "type": "length", "length": len(ids)}  # fmt: skip
            meta = {"id": body.get("rid"), "finish_reason": finish, "prompt_tokens": len(prompt),
                    "completion_tokens": len(ids), "cached_tokens": 0,
                    "output_token_logprobs": [[lp, i, None] for lp, i in zip(logprobs, ids, strict=True)]}  # fmt: skip
            return web.json_response({"text": text, "output_ids": ids, "meta_info": meta})
        tokens = [f"token_id:{i}" for i in ids]
        if path == "/v1/completions":
            lp = {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None, "text_offset": [0] * len(ids)}
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": reason, "token_ids": ids,
                      "prompt_token_ids": prompt}  # fmt: skip
            return web.json_response({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})
        content = [{"token": t, "logprob": v, "top_logprobs": []} for t, v in zip(tokens, logprobs, strict=True)]
        choice = {"index": 0, "logprobs": {"content": content}, "finish_reason": reason, "token_ids": ids}
        return web.json_response({"request_id": body.get("request_id"), "choices": [choice]})

    async def start_async(self) -> ScriptedTokenEngine:
        """Listen inside the running event loop."""
        from osmosis_core.http.server import start_http_server

        self._runner, self._port = await start_http_server(self._handle, "127.0.0.1", 0, max_body=64 * 1024 * 1024)
        return self

    async def stop_async(self) -> None:
        """Stop listening."""
        runner, self._runner, self._port = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    def start(self) -> ScriptedTokenEngine:
        """Listen in a daemon thread with its own event loop (for a test that runs a subprocess)."""
        started = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            loop.run_until_complete(self.start_async())
            started.set()
            loop.run_forever()
            loop.run_until_complete(self.stop_async())
            loop.close()

        self._thread = threading.Thread(target=run, name="scripted-token-engine", daemon=True)
        self._thread.start()
        started.wait(10)
        return self

    def stop(self) -> None:
        """Stop the thread :meth:`start` began."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = self._loop = None

    async def __aenter__(self) -> ScriptedTokenEngine:
        return await self.start_async()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop_async()

    def __enter__(self) -> ScriptedTokenEngine:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
