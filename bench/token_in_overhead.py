"""What a token-in call costs the gateway next to a chat call, in one run on one machine.

The gateway runs in a child process (its CPU read from ``/proc`` around each phase), in front of
either the scripted vLLM-flavoured chat server (``adapter="vllm"``: the chat path, ids captured
from the answer) or the scripted token engine (``adapter="sglang-generate"``: the gateway renders
the chat template, sends ids to ``/generate``, decodes and parses the Hermes tool calls). Both
stand-ins run in this process. The driver runs N two-call tool-calling rollouts at concurrency C
through each, and prints the gateway's CPU per call; then, in this process, the render + parse
work alone per call (no HTTP), split into the first call (the whole conversation rendered) and the
second (the new messages alone).

    python bench/token_in_overhead.py [--rollouts 300] [--concurrency 20]

The tokenizer is the stand-in's (``write_test_tokenizer``: a 400-token byte-level BPE, so a prompt
is more ids than a real model's 150k vocabulary makes of it); ``tokenizers`` encodes in Rust, so
the figure is dominated by the template's rendering, as it would be with a real model's folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import subprocess

from gateway_overhead import TOOLS, cpu_seconds, phase, stop_child


async def serve(adapter: str, upstream: str, ids: int, tokenizer: str) -> None:
    """The gateway child: ``adapter`` in front of ``upstream``, ``ids`` rollouts open."""
    from osmosis_core import PolicyEndpoint
    from osmosis_core.http import aclose_http
    from osmosis_gateway import PolicyGateway
    from osmosis_gateway.token_in import TokenIn

    token_in = TokenIn(adapter, tokenizer) if adapter != "vllm" else None  # type: ignore[arg-type]
    gateway = PolicyGateway(PolicyEndpoint(upstream, "osmosis-stub"), adapter=adapter, token_in=token_in)  # type: ignore[arg-type]
    await gateway.start()
    tokens = {f"r{i}": gateway.open_rollout(f"r{i}").api_key for i in range(ids)}
    print(json.dumps({"url": gateway.url, "tokens": tokens}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    complete = sum(1 for i in range(ids) if (t := gateway.trace(f"r{i}")) and len(t.calls) == 2 and t.complete)
    print(json.dumps({"complete_traces": complete}), flush=True)
    await gateway.aclose()
    await aclose_http()


def gateway_phase(adapter: str, upstream: str, tokenizer: str, rollouts: int, concurrency: int) -> tuple[float, int]:
    """The gateway child's CPU ms per call over ``rollouts`` two-call rollouts, and its complete traces."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", adapter, upstream, str(rollouts), tokenizer],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    ready = json.loads(child.stdout.readline())
    url = ready["url"]
    urls = [(f"{url}/rollouts/r{i}/chat/completions", ready["tokens"][f"r{i}"]) for i in range(rollouts)]
    before = cpu_seconds(child.pid)
    asyncio.run(phase(urls, concurrency, False))
    used = cpu_seconds(child.pid) - before
    done = stop_child(child)
    return used / (2 * rollouts) * 1000, done["complete_traces"]


def render_parse(tokenizer: str, rounds: int = 300) -> tuple[float, float]:
    """CPU ms of the token-in work alone (render, encode, decode, parse) for a first and a second call."""
    from osmosis_core.testing.token_engine import calculator_text
    from osmosis_gateway.token_in import Conversation, TokenIn

    token_in = TokenIn("sglang-generate", tokenizer)
    renderer = token_in.renderer
    firsts, seconds = 0.0, 0.0
    for n in range(rounds):
        conversation = Conversation()
        messages = [{"role": "user", "content": f"What is {n % 97} times 7?"}]
        started = time.process_time()
        prepared = token_in.prepare(conversation, {"messages": messages, "tools": TOOLS}, "r-0", "m")
        generated = [*renderer.encode(calculator_text(renderer.tokenizer.decode(prepared.rendered.prompt_ids))), 2]
        request = {"messages": messages, "tools": TOOLS}
        reply = token_in.reply({"output_ids": generated, "meta_info": {"finish_reason": {"type": "stop"},
                                "output_token_logprobs": [[-0.1, i, None] for i in generated]}}, request)  # fmt: skip
        firsts += time.process_time() - started
        message = reply.parsed.message()
        conversation.answered(prepared.seen, prepared.tools_key, message, prepared.rendered.prompt_ids, generated, 0,
                              finish_reason=reply.answer.finish_reason, stop_id=reply.stop_id)  # fmt: skip
        call = message["tool_calls"][0]
        messages = [*messages, message, {"role": "tool", "tool_call_id": call["id"], "content": "84"}]
        started = time.process_time()
        prepared = token_in.prepare(conversation, {"messages": messages, "tools": TOOLS}, "r-1", "m")
        assert prepared.rendered.mode == "incremental"
        token_in.reply({"output_ids": generated, "meta_info": {"finish_reason": {"type": "stop"},
                        "output_token_logprobs": [[-0.1, i, None] for i in generated]}}, request)  # fmt: skip
        seconds += time.process_time() - started
    return firsts / rounds * 1000, seconds / rounds * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--serve", nargs=4, metavar=("ADAPTER", "UPSTREAM", "IDS", "TOKENIZER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        adapter, upstream, ids, tokenizer = args.serve
        asyncio.run(serve(adapter, upstream, int(ids), tokenizer))
        return
    from osmosis_core.testing import ScriptedPolicyServer, calculator
    from osmosis_core.testing.token_engine import ScriptedTokenEngine, write_test_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        tokenizer = str(write_test_tokenizer(Path(folder) / "tokenizer"))
        with ScriptedPolicyServer(calculator, flavor="vllm") as chat, ScriptedTokenEngine(tokenizer) as engine:
            chat_ms, chat_done = gateway_phase("vllm", chat.url, tokenizer, args.rollouts, args.concurrency)
            token_ms, token_done = gateway_phase(
                "sglang-generate", engine.url, tokenizer, args.rollouts, args.concurrency
            )
        first, second = render_parse(tokenizer)
    calls = 2 * args.rollouts
    print(f"gateway CPU per call, {calls} calls at concurrency {args.concurrency} (one run, this machine):")
    print(f"  chat call (vllm adapter, ids from the answer)   {chat_ms:6.3f} ms   complete traces {chat_done}")
    print(f"  token-in call (sglang-generate: render + parse) {token_ms:6.3f} ms   complete traces {token_done}")
    print(f"render + parse alone, in process: first call (whole) {first:.3f} ms, second (incremental) {second:.3f} ms")


if __name__ == "__main__":
    main()
