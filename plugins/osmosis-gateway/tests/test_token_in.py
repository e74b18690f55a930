"""Token-in upstreams: the gateway renders with the policy's tokenizer, sends ids to the engine's
token route (the scripted token engine, real HTTP), parses tool calls back, and traces one sequence."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import MULTIPLY_TOOL, REPO, post, run, sse_docs

from osmosis_core import ConfigError, PolicyEndpoint
from osmosis_core.testing.token_engine import ScriptedTokenEngine, write_test_tokenizer
from osmosis_gateway import PolicyGateway, read_traces, trainer_view
from osmosis_gateway.settings import gateway_from_settings
from osmosis_gateway.token_in import ChatRenderer, TokenIn, parse_reply

ENGINES = ("sglang-generate", "vllm-completions", "trl-generate")


@pytest.fixture(scope="module")
def tokenizers_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tok")
    return {t: write_test_tokenizer(root / t, t) for t in ("chatml", "drifting")}  # type: ignore[arg-type]


def reply_text(prompt: str) -> str:
    """Hermes: a <think> block and a tool call, then after the tool's answer a final answer."""
    answers = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt)
    if answers:
        answer = answers[0]
        return f"<think>done</think>\nThe product is {answer}.\n#### {answer}"
    return (
        "<think>two calls</think>\n"
        '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>\n'
        '<tool_call>\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    )


async def agent(gateway: PolicyGateway, rollout_id: str, *, stream: bool = False, **extra: Any) -> list[dict]:
    """A plain tool-calling agent: call, run each tool call, call again until an answer."""
    policy = gateway.open_rollout(rollout_id, sampling={"temperature": 0.7, "max_tokens": 64})
    messages: list[dict] = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "6 x 7?"}]
    for _ in range(4):
        body = {"model": "m", "messages": messages, "tools": [MULTIPLY_TOOL], "temperature": 0.1, **extra}
        if stream:
            body["stream"] = True
        status, raw = await post(policy.chat_completions_url, body, token=policy.api_key)
        assert status == 200, raw
        if stream:
            docs = sse_docs(raw)
            delta_calls = [c for d in docs for c in d["choices"][0]["delta"].get("tool_calls") or []] if docs else []
            content = "".join(d["choices"][0]["delta"].get("content") or "" for d in docs if d["choices"])
            finish = next(
                d["choices"][0]["finish_reason"] for d in docs if d["choices"] and d["choices"][0]["finish_reason"]
            )
            message = {"role": "assistant", "content": content or None}
            if delta_calls:
                message["tool_calls"] = [
                    {"id": c["id"], "type": "function", "function": c["function"]} for c in delta_calls
                ]
        else:
            choice = json.loads(raw)["choices"][0]
            message, finish = choice["message"], choice["finish_reason"]
        messages.append(message)
        if finish != "tool_calls":
            break
        for call in message["tool_calls"]:
            args = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] * args["b"])})
    return messages


def gateway_for(engine: ScriptedTokenEngine, adapter: str, folder: Path, **options: Any) -> PolicyGateway:
    token_in = TokenIn(adapter, folder, **options)  # type: ignore[arg-type]
    return PolicyGateway(PolicyEndpoint(engine.url + "/v1", "policy"), adapter=adapter, token_in=token_in)  # type: ignore[arg-type]


@pytest.mark.parametrize("template", ["chatml", "drifting"])
@pytest.mark.parametrize("adapter", ENGINES)
def test_a_tool_calling_rollout_is_one_sequence_of_the_ids_the_engine_saw(tokenizers_dir, adapter, template):
    folder = tokenizers_dir[template]

    async def main():
        async with ScriptedTokenEngine(folder, reply_text) as engine, gateway_for(engine, adapter, folder) as gateway:
            messages = await agent(gateway, "r-1")
            return messages, gateway.pop_trace("r-1"), engine.requests

    messages, trace, seen = run(main)
    assert messages[-1]["content"].endswith("#### 42")
    assert len(messages[2]["tool_calls"]) == 2
    assert trace.complete
    assert len(trace.calls) == len(seen) == 2
    for call, request in zip(trace.calls, seen, strict=True):
        assert list(call.prompt_token_ids) == request.prompt_ids  # what the engine saw
        assert list(call.completion_token_ids) == request.output_ids  # what it produced
        assert list(call.logprobs) == pytest.approx(request.logprobs)
        assert request.rollout_id == "r-1"
    assert trace.calls[0].token_in == {"engine": adapter, "render": "full", "tool_calls": 2}
    assert trace.calls[1].token_in == {"engine": adapter, "render": "incremental", "extends": 0, "tool_calls": 0}
    view = trainer_view(trace)
    assert view.prefix_breaks == 0
    assert len(view.sequences) == 1
    (sequence,) = view.sequences
    assert sequence.token_ids == [*seen[1].prompt_ids, *seen[1].output_ids]
    masked = [lp for lp, m in zip(sequence.logprobs, sequence.loss_mask, strict=True) if m]
    assert masked == pytest.approx([*seen[0].logprobs, *seen[1].logprobs])
    whole = ChatRenderer(folder).prompt_ids(trace.calls[1].request["messages"], trace.calls[1].request["tools"])
    # on the append-only template the incremental ids are the template's own rendering of the whole
    # conversation; the drifting one renders history otherwise (a prefix break on the chat path)
    assert (whole == seen[1].prompt_ids) is (template == "chatml")


def test_the_trainers_sampling_goes_under_the_engines_names_over_the_agents(tokenizers_dir):
    folder = tokenizers_dir["chatml"]

    async def main():
        async with ScriptedTokenEngine(folder, reply_text) as engine:
            async with gateway_for(engine, "sglang-generate", folder) as gateway:
                await agent(gateway, "r-1", top_p=0.5, seed=3)
            async with gateway_for(engine, "vllm-completions", folder) as gateway:
                await agent(gateway, "r-2", top_p=0.5, seed=3)
            return engine.requests

    sglang, _, vllm, _ = run(main)
    assert sglang.body["sampling_params"] == {  # (the agent's top_p: the trainer decides the distribution)
        "temperature": 0.7,
        "sampling_seed": 3,
        "max_new_tokens": 64,
    }
    assert "top_p" not in vllm.body
    assert sglang.body["return_logprob"] is True
    assert sglang.body["rid"] == "r-1-0"
    assert sglang.body["stream"] is False
    assert vllm.body["temperature"] == 0.7
    assert vllm.body["max_tokens"] == 64
    assert vllm.body["seed"] == 3
    assert vllm.body["prompt"] == vllm.prompt_ids
    assert vllm.body["model"] == "m"


def test_a_streaming_rollout_gets_events_and_the_same_trace(tokenizers_dir):
    folder = tokenizers_dir["drifting"]

    async def main():
        async with (
            ScriptedTokenEngine(folder, reply_text) as engine,
            gateway_for(engine, "sglang-generate", folder) as gateway,
        ):
            messages = await agent(gateway, "r-1", stream=True)
            return messages, gateway.pop_trace("r-1")

    messages, trace = run(main)
    assert messages[-1]["content"].endswith("#### 42")
    assert all(call.stream for call in trace.calls)
    assert trainer_view(trace).prefix_breaks == 0


def test_an_edited_history_is_rendered_whole_and_the_call_says_why(tokenizers_dir):
    folder = tokenizers_dir["chatml"]

    async def main():
        async with (
            ScriptedTokenEngine(folder, reply_text) as engine,
            gateway_for(engine, "sglang-generate", folder) as gateway,
        ):
            policy = gateway.open_rollout("r-1")
            first = [{"role": "user", "content": "6 x 7?"}]
            _status, raw = await post(
                policy.chat_completions_url, {"messages": first, "tools": [MULTIPLY_TOOL]}, token=policy.api_key
            )
            reply = json.loads(raw)["choices"][0]["message"]
            edited = [
                {"role": "user", "content": "6 x 7, please?"},
                reply,
                {"role": "tool", "tool_call_id": "x", "content": "42"},
            ]
            await post(
                policy.chat_completions_url, {"messages": edited, "tools": [MULTIPLY_TOOL]}, token=policy.api_key
            )
            return gateway.pop_trace("r-1"), engine.requests

    trace, seen = run(main)
    second = trace.calls[1]
    assert second.token_in["render"] == "full"
    assert second.token_in["render_reason"] == "message 0 differs from what the earlier calls sent and received"
    assert list(second.prompt_token_ids) == seen[1].prompt_ids
    assert trainer_view(trace).prefix_breaks == 1  # (counted, never repaired)


def test_malformed_tool_calls_reach_the_rollout_as_text_and_are_counted(tokenizers_dir):
    folder = tokenizers_dir["chatml"]
    broken = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6,\n</tool_call>'

    async def main():
        async with (
            ScriptedTokenEngine(folder, lambda _: broken) as engine,
            gateway_for(engine, "trl-generate", folder) as gateway,
        ):
            policy = gateway.open_rollout("r-1")
            request = {"messages": [{"role": "user", "content": "hi"}], "tools": [MULTIPLY_TOOL]}
            status, raw = await post(policy.chat_completions_url, request, token=policy.api_key)
            return status, json.loads(raw), gateway.pop_trace("r-1")

    status, doc, trace = run(main)
    assert status == 200
    assert doc["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": broken},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert trace.complete
    assert "hermes tool calls cannot be read" in trace.calls[0].token_in["tool_parse_error"]


def test_a_generation_cut_by_length_says_length(tokenizers_dir):
    folder = tokenizers_dir["chatml"]

    async def main():
        cut = ScriptedTokenEngine(folder, lambda _: "partial answ", finish="length")
        async with cut as engine, gateway_for(engine, "sglang-generate", folder) as gateway:
            policy = gateway.open_rollout("r-1")
            _, raw = await post(
                policy.chat_completions_url,
                {"messages": [{"role": "user", "content": "hi"}], "logprobs": True},
                token=policy.api_key,
            )
            return json.loads(raw)

    choice = run(main)["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "partial answ"
    assert len(choice["logprobs"]["content"]) > 0


@pytest.mark.parametrize(
    ("parser", "text", "content", "calls"),
    [
        ("hermes", 'ok <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', "ok", [("f", {"x": 1})]),
        (
            "hermes",
            '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call>',  # noqa: E501
            None,
            [("f", {}), ("g", {"y": 2})],
        ),
        ("hermes", "just words", "just words", []),
        (
            "llama3_json",
            '{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}',
            None,
            [("f", {"x": 1}), ("g", {})],
        ),
        ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"x": 1}}', None, [("f", {"x": 1})]),
        ("llama3_json", "It is 42.", "It is 42.", []),
        (
            "mistral",
            'Sure.[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]',
            "Sure.",
            [("f", {"x": 1}), ("g", {})],
        ),
        ("mistral", '[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}', None, [("f", {"x": 1}), ("g", {})]),
    ],
)
def test_tool_calls_are_read_in_each_format(parser, text, content, calls):
    parsed = parse_reply(text, parser)
    assert parsed.malformed is None
    assert parsed.content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == calls
    if parser == "mistral":
        assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in parsed.tool_calls)


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("hermes", '<tool_call>{"name": "f", "arguments": {"x": 1'),  # never closed, its JSON cut
        ("hermes", '<tool_call>{"name": "f", "arguments": {}} and more'),  # text after an open block
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),  # no name
        ("llama3_json", '{"name": "f", "parameters": {"x": 1}'),
        ("mistral", "[TOOL_CALLS][{"),
        ("mistral", "[TOOL_CALLS]f{}"),
    ],
)
def test_malformed_tool_calls_are_the_whole_text_and_a_reason(parser, text):
    parsed = parse_reply(text, parser)
    assert parsed.tool_calls == []
    assert parsed.content == text.strip()
    assert parsed.malformed is not None
    assert parsed.malformed.startswith(f"{parser} tool calls cannot be read")


def test_bad_token_in_settings_are_refused_naming_the_key(tmp_path, tokenizers_dir):
    upstream = PolicyEndpoint("http://127.0.0.1:1", "m")
    cases = [
        ({"adapter": "sglang-generate"}, "@ $.traces.tokenizer"),
        ({"adapter": "sglang-generate", "tokenizer": str(tmp_path / "none")}, "no such folder"),
        (
            {"adapter": "sglang-generate", "tokenizer": str(tokenizers_dir["chatml"]), "tool_parser": "qwen"},
            "$.traces.tool_parser",
        ),
        ({"adapter": "vllm", "tokenizer": str(tokenizers_dir["chatml"])}, "@ $.traces.tokenizer"),
        (
            {
                "adapter": "sglang-generate",
                "tokenizer": str(tokenizers_dir["chatml"]),
                "chat_template": str(tmp_path / "x.jinja"),
            },
            "@ $.traces.chat_template",
        ),
    ]
    for settings, where in cases:
        with pytest.raises(ConfigError) as caught:
            gateway_from_settings(upstream, settings, "run.toml")
        assert where in str(caught.value), (settings, str(caught.value))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "tokenizer.json").write_text((tokenizers_dir["chatml"] / "tokenizer.json").read_text())
    with pytest.raises(ConfigError, match=r"has no chat template .* @ \$\.traces\.tokenizer"):
        gateway_from_settings(upstream, {"adapter": "trl-generate", "tokenizer": str(tmp_path / "empty")}, "run.toml")
    gateway = gateway_from_settings(
        upstream,
        {"adapter": "trl-generate", "tokenizer": str(tokenizers_dir["chatml"]), "tool_parser": "mistral"},
        "run.toml",
    )
    assert gateway.token_in.engine == "trl-generate"
    assert gateway.token_in.tool_parser == "mistral"


def test_osmosis_run_with_a_token_in_engine_traces_one_sequence_per_rollout(tmp_path, tokenizers_dir, clean_env):
    """``osmosis run --traces`` as a user runs it against SGLang's ``/generate``: the example's
    tool-calling rollouts pass, and each trace is one sequence of the ids the engine saw and made."""
    shutil.copytree(
        REPO / "rollouts" / "multiply-plain",
        tmp_path / "rollouts" / "multiply-plain",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    folder = tokenizers_dir["drifting"]
    with ScriptedTokenEngine(folder) as engine:
        config = tmp_path / "configs" / "eval" / "token-in.toml"
        config.parent.mkdir(parents=True)
        config.write_text(
            (REPO / "configs" / "eval" / "multiply-plain.toml")
            .read_text()
            .replace('base_url = "http://127.0.0.1:8000/v1"', f'base_url = "{engine.url}"')
            + f'\n[traces]\nadapter = "sglang-generate"\ntokenizer = "{folder}"\ntool_parser = "hermes"\n'
        )
        r = subprocess.run(
            [str(Path(sys.executable).parent / "osmosis"), "run", str(config), "--traces", "--limit", "3",
             "--output", "out"],
            cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        seen = {(r.rollout_id, tuple(r.prompt_ids)): r for r in engine.requests}
    assert r.returncode == 0, r.stderr
    results = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [result["reward"] for result in results] == [1.0, 1.0, 1.0]
    traces = [trace for _, trace in read_traces(tmp_path / "out" / "traces.jsonl").values()]
    assert len(traces) == 3
    assert len(seen) == 6
    for trace in traces:
        assert trace.complete
        assert [call.token_in["render"] for call in trace.calls] == ["full", "incremental"]
        for call in trace.calls:
            request = seen[(trace.rollout_id, tuple(call.prompt_token_ids))]
            assert list(call.completion_token_ids) == request.output_ids
            assert list(call.logprobs) == pytest.approx(request.logprobs)
        view = trainer_view(trace)
        assert view.prefix_breaks == 0
        assert len(view.sequences) == 1


def test_a_chat_gateway_imports_neither_tokenizers_nor_jinja2():
    code = (
        "import sys\nfrom osmosis_core import PolicyEndpoint\n"
        "from osmosis_gateway.settings import gateway_from_settings\n"
        "gateway_from_settings(PolicyEndpoint('http://127.0.0.1:1/v1', 'm'), {'adapter': 'sglang'}, 'run.toml')\n"
        "import osmosis_gateway.call\nprint('tokenizers' in sys.modules, 'jinja2' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False False", r.stderr


def test_text_parts_and_argument_text_render_as_vllm_hands_them_to_the_template(tokenizers_dir):
    folder = tokenizers_dir["chatml"]
    call = {"id": "c1", "type": "function", "function": {"name": "multiply", "arguments": '{"a":6,"b":7}'}}
    sent = [
        {"role": "user", "content": [{"type": "text", "text": "6 x "}, {"type": "text", "text": "7?"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
    ]

    async def main():
        async with ScriptedTokenEngine(folder) as engine, gateway_for(engine, "sglang-generate", folder) as gateway:
            policy = gateway.open_rollout("r-1")
            body = {"messages": sent, "tools": [MULTIPLY_TOOL]}
            status, _ = await post(policy.chat_completions_url, body, token=policy.api_key)
            return status, engine.requests

    status, seen = run(main)
    assert status == 200
    plain = [
        {"role": "user", "content": "6 x 7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**call, "function": {"name": "multiply", "arguments": {"a": 6, "b": 7}}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    assert seen[0].prompt_ids == ChatRenderer(folder).prompt_ids(plain, [MULTIPLY_TOOL])


def test_the_upstreams_key_in_generated_text_is_taken_out_and_the_call_not_trained_on(tokenizers_dir):
    folder = tokenizers_dir["chatml"]
    key = "sk-token-in-0123456789abcdef"

    async def main():
        async with ScriptedTokenEngine(folder, lambda _: f"the key is {key}") as engine:
            upstream = PolicyEndpoint(engine.url, "policy", key)
            token_in = TokenIn("sglang-generate", folder)
            async with PolicyGateway(upstream, adapter="sglang-generate", token_in=token_in) as gateway:
                policy = gateway.open_rollout("r-1")
                body = {"messages": [{"role": "user", "content": "key?"}]}
                _, raw = await post(policy.chat_completions_url, body, token=policy.api_key)
                return raw, gateway.pop_trace("r-1")

    raw, trace = run(main)
    assert key.encode() not in raw
    assert json.loads(raw)["choices"][0]["message"]["content"] == "the key is ***"
    assert trace.calls[0].status == "capture_failed"
    assert key not in json.dumps(trace.to_json())


def test_a_relative_tokenizer_path_is_read_against_the_config_files_folders(tmp_path, tokenizers_dir, monkeypatch):
    shutil.copytree(tokenizers_dir["chatml"], tmp_path / "models" / "policy")
    config = tmp_path / "configs" / "eval" / "run.toml"
    config.parent.mkdir(parents=True)
    config.write_text("")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    settings = {"adapter": "sglang-generate", "tokenizer": "models/policy"}
    gateway = gateway_from_settings(PolicyEndpoint("http://127.0.0.1:1", "m"), settings, str(config))
    assert gateway.token_in.renderer.stop_ids == {gateway.token_in.renderer.tokenizer.token_to_id("<|im_end|>")}
    with pytest.raises(ConfigError, match=r"no such folder: .*elsewhere/models/nowhere @ \$\.traces\.tokenizer"):
        gateway_from_settings(
            PolicyEndpoint("http://127.0.0.1:1", "m"), {**settings, "tokenizer": "models/nowhere"}, str(config)
        )


def test_the_standalone_gateway_serves_a_token_in_engine(tokenizers_dir, clean_env):
    osmosis = str(Path(sys.executable).parent / "osmosis")
    r = subprocess.run(
        [osmosis, "gateway", "--upstream", "http://127.0.0.1:1", "--adapter", "sglang-generate"],
        capture_output=True, text=True, env=clean_env, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert "--tokenizer" in r.stderr
    folder = tokenizers_dir["chatml"]
    with ScriptedTokenEngine(folder) as engine:
        proc = subprocess.Popen(
            [osmosis, "gateway", "--upstream", engine.url, "--adapter", "vllm-completions", "--tokenizer", str(folder)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env,
        )  # fmt: skip
        try:
            url = proc.stdout.readline().split()[4]
            bearer = proc.stdout.readline().removeprefix("bearer: ").strip()

            async def main():
                _, opened = await post(f"{url}/rollouts", {"rollout_id": "x"}, token=bearer)
                opened = json.loads(opened)
                body = {"messages": [{"role": "user", "content": "What is 6 times 7?"}], "tools": [MULTIPLY_TOOL]}
                _, raw = await post(opened["base_url"] + "/chat/completions", body, token=opened["api_key"])
                return json.loads(raw)

            answer = run(main)
        finally:
            proc.terminate()
            proc.communicate(timeout=10)
    (call,) = answer["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "multiply"
    assert json.loads(call["function"]["arguments"]) == {"a": 6.0, "b": 7.0}
    assert engine.requests[0].route == "/v1/completions"


def test_the_requests_chat_template_kwargs_reach_the_template(tokenizers_dir):
    folder = tokenizers_dir["chatml"]

    async def main():
        async with ScriptedTokenEngine(folder) as engine, gateway_for(engine, "sglang-generate", folder) as gateway:
            policy = gateway.open_rollout("r-1")
            messages = [{"role": "user", "content": "What is 6 times 7?"}]
            off = {"enable_thinking": False}
            for options in (off, off, None):
                body = {"messages": messages, "tools": [MULTIPLY_TOOL], "chat_template_kwargs": options}
                _, raw = await post(policy.chat_completions_url, body, token=policy.api_key)
                reply = json.loads(raw)["choices"][0]["message"]
                if reply.get("tool_calls"):
                    call = reply["tool_calls"][0]
                    messages = [*messages, reply, {"role": "tool", "tool_call_id": call["id"], "content": "42"}]
            return gateway.pop_trace("r-1"), engine.requests

    trace, seen = run(main)
    text = ChatRenderer(folder).tokenizer.decode
    assert text(seen[0].prompt_ids, skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert [c.token_in["render"] for c in trace.calls] == ["full", "incremental", "full"]
    assert (
        trace.calls[2].token_in["render_reason"] == "the tools or the template's options differ from the earlier calls'"
    )
    assert text(seen[2].prompt_ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")


PARSER_MODULE = '''
import json


def parse(text, tools):
    """A format of its own: CALL <name> <JSON arguments> on the answer's last line."""
    head, sep, call = text.rpartition("CALL ")
    if not sep:
        return text, []
    name, _, arguments = call.partition(" ")
    if name not in [t["function"]["name"] for t in tools]:
        raise ValueError(f"no tool {name!r}")
    json.loads(arguments)
    return head.strip() or None, [{"function": {"name": name, "arguments": arguments}}]


not_a_function = 3
'''


def test_a_parser_of_the_models_own_format_is_named_by_import_path(tmp_path, tokenizers_dir, monkeypatch):
    """``tool_parser = "module:function"``: given the generated text and the request's tools; what it
    raises is a malformed reply (the text reaches the rollout, the call says why), never a failed call."""
    (tmp_path / "own_format.py").write_text(PARSER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = tokenizers_dir["chatml"]
    replies = iter(['Let me.\nCALL multiply {"a": 6, "b": 7}', 'CALL divide {"a": 1}'])

    async def main():
        async with (
            ScriptedTokenEngine(folder, lambda _: next(replies)) as engine,
            gateway_for(engine, "sglang-generate", folder, tool_parser="own_format:parse") as gateway,
        ):
            policy = gateway.open_rollout("r-1")
            docs = []
            for _ in range(2):
                body = {"messages": [{"role": "user", "content": "6 x 7?"}], "tools": [MULTIPLY_TOOL]}
                status, raw = await post(policy.chat_completions_url, body, token=policy.api_key)
                assert status == 200, raw
                docs.append(json.loads(raw)["choices"][0])
            return docs, gateway.pop_trace("r-1")

    (called, refused), trace = run(main)
    assert called["finish_reason"] == "tool_calls"
    assert called["message"]["content"] == "Let me."
    [call] = called["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"] == {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}
    assert refused["message"] == {"role": "assistant", "content": 'CALL divide {"a": 1}'}
    assert [c.token_in.get("tool_parse_error") for c in trace.calls] == [
        None,
        "own_format.parse cannot read the tool calls: no tool 'divide'",
    ]
    assert trace.complete
    assert [c.status for c in trace.calls] == ["ok", "ok"]

    upstream = PolicyEndpoint("http://127.0.0.1:1", "m")
    table = {"adapter": "sglang-generate", "tokenizer": str(folder)}
    for parser, why in [
        ("own_format:missing", "cannot be imported: AttributeError"),
        ("no_such_module_here:parse", "cannot be imported: ModuleNotFoundError"),
        ("own_format:not_a_function", "is a int, not a function"),
        ("qwen", "one of hermes, llama3_json, mistral or an import path"),
    ]:
        with pytest.raises(ConfigError, match=r"@ \$\.traces\.tool_parser") as caught:
            gateway_from_settings(upstream, {**table, "tool_parser": parser}, "run.toml")
        assert why in str(caught.value), str(caught.value)
    assert gateway_from_settings(upstream, {**table, "tool_parser": "own_format:parse"}, "run.toml").token_in


def test_a_token_in_adapter_without_its_extra_says_what_to_install(tokenizers_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "jinja2", None)  # (as if not installed: import and find_spec see none)
    upstream = PolicyEndpoint("http://127.0.0.1:1", "m")
    table = {"adapter": "vllm-completions", "tokenizer": str(tokenizers_dir["chatml"])}
    with pytest.raises(
        ConfigError, match=r"jinja2 is not installed: pip install 'osmosis-gateway\[token-in\]' @ \$\.traces\.adapter"
    ):
        gateway_from_settings(upstream, table, "run.toml")


def _ask(policy, **body: Any):
    request = {"messages": [{"role": "user", "content": "6 x 7?"}], "tools": [MULTIPLY_TOOL], **body}
    return post(policy.chat_completions_url, request, token=policy.api_key)


@pytest.mark.parametrize("adapter", ["sglang-generate", "vllm-completions"])
def test_a_stop_on_another_special_token_is_not_text_and_the_next_call_says_why_it_is_whole(tokenizers_dir, adapter):
    """Qwen stops on <|endoftext|> as well as <|im_end|> (Llama 3.1 on <|eom_id|>, Gemma on
    <end_of_turn>): the stop is not content, and no close is appended after it without a word."""
    folder = tokenizers_dir["chatml"]

    async def main():
        engine = ScriptedTokenEngine(folder, reply_text, stop_token="<|endoftext|>")
        async with engine, gateway_for(engine, adapter, folder) as gateway:
            messages = await agent(gateway, "r-1")
            return messages, gateway.pop_trace("r-1"), engine.requests

    messages, trace, seen = run(main)
    assert len(messages[2]["tool_calls"]) == 2
    assert messages[-1]["content"] == "<think>done</think>\nThe product is 42.\n#### 42"
    assert all("<|endoftext|>" not in (m.get("content") or "") for m in messages)
    second = trace.calls[1]
    assert second.token_in["render"] == "full"
    assert "'<|endoftext|>', not '<|im_end|>'" in second.token_in["render_reason"]
    whole = ChatRenderer(folder).prompt_ids(second.request["messages"], second.request["tools"])
    assert list(second.prompt_token_ids) == whole == seen[1].prompt_ids
    assert trainer_view(trace).prefix_breaks == 1  # (counted, never stitched over a guess)


def test_a_turn_cut_by_length_is_extended_with_the_templates_close_and_the_call_says_so(tokenizers_dir):
    folder = tokenizers_dir["chatml"]

    async def main():
        engine = ScriptedTokenEngine(folder, lambda _: "partial answ", finish="length")
        async with engine, gateway_for(engine, "sglang-generate", folder) as gateway:
            policy = gateway.open_rollout("r-1")
            messages = [{"role": "user", "content": "hi"}]
            _, raw = await post(policy.chat_completions_url, {"messages": messages}, token=policy.api_key)
            messages += [json.loads(raw)["choices"][0]["message"], {"role": "user", "content": "go on"}]
            await post(policy.chat_completions_url, {"messages": messages}, token=policy.api_key)
            return gateway.pop_trace("r-1")

    first, second = run(main).calls
    assert second.token_in["render"] == "incremental"
    assert second.token_in["render_note"].startswith("call 0's answer was cut by length")
    base = [*first.prompt_token_ids, *first.completion_token_ids]
    assert list(second.prompt_token_ids[: len(base)]) == base  # one sequence
    after = ChatRenderer(folder).tokenizer.decode(list(second.prompt_token_ids[len(base) :]), skip_special_tokens=False)
    assert after == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"  # the whole close


def test_tool_calls_are_read_only_when_the_request_offers_tools_and_allows_them(tokenizers_dir):
    folder = tokenizers_dir["chatml"]
    call = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'
    divide = {"type": "function", "function": {"name": "divide"}}

    async def main():
        async with (
            ScriptedTokenEngine(folder, lambda _: call) as engine,
            gateway_for(engine, "sglang-generate", folder) as gateway,
        ):
            policy = gateway.open_rollout("r-1")
            answers = [
                await _ask(policy, tool_choice="none"),
                await post(
                    policy.chat_completions_url, {"messages": [{"role": "user", "content": "hi"}]}, token=policy.api_key
                ),
                await _ask(policy, tool_choice=divide),
                await _ask(policy, tool_choice="required"),
                await _ask(policy, tools=[{"type": "function", "function": {"name": "add"}}]),
            ]
            return [json.loads(raw)["choices"][0] for _, raw in answers], gateway.pop_trace("r-1")

    choices, trace = run(main)
    for choice in choices[:2]:  # tool_choice none, or no tools: the text as generated
        assert choice["finish_reason"] == "stop"
        assert choice["message"] == {"role": "assistant", "content": call}
    assert all(c["finish_reason"] == "tool_calls" for c in choices[2:])
    notes = [call.token_in for call in trace.calls]
    assert [n["tool_calls"] for n in notes] == [0, 0, 1, 1, 1]
    assert notes[2]["tool_choice_not_enforced"] == {"tool_choice": "divide", "met": False}
    assert notes[3]["tool_choice_not_enforced"] == {"tool_choice": "required", "met": True}
    assert notes[4]["unknown_tools"] == ["multiply"]  # kept, and said
    assert "unknown_tools" not in notes[2]


@pytest.mark.parametrize(
    ("text", "content", "names"),
    [
        (  # a <tool_call> the model mentions while it reasons is not a call
            "<think>\nI should use <tool_call> to call it.\n</think>\n\n"
            '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
            "<think>\nI should use <tool_call> to call it.\n</think>",
            ["f"],
        ),
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n', None, ["f"]),  # left open, its JSON whole
        ('<tool_call>{"name": "g", "arguments": {"code": "print(\'</tool_call>\')"}}</tool_call>', None, ["g"]),
    ],
)
def test_hermes_reads_calls_after_the_reasoning_and_a_last_block_left_open(text, content, names):
    parsed = parse_reply(text, "hermes")
    assert parsed.malformed is None
    assert parsed.content == content
    assert [c["function"]["name"] for c in parsed.tool_calls] == names


@pytest.mark.parametrize("adapter", ENGINES)
def test_a_tool_call_cut_by_length_still_says_length(tokenizers_dir, adapter):
    """vLLM says tool_calls only on a stop: a trainer's truncation check must see the cut."""
    folder = tokenizers_dir["chatml"]
    call = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>\nand then'

    async def main():
        engine = ScriptedTokenEngine(folder, lambda _: call, finish="length")
        async with engine, gateway_for(engine, adapter, folder) as gateway:
            policy = gateway.open_rollout("r-1")
            _, raw = await _ask(policy)
            return json.loads(raw)["choices"][0], gateway.pop_trace("r-1")

    choice, trace = run(main)
    assert choice["finish_reason"] == "length"
    assert len(choice["message"]["tool_calls"]) == 1
    assert trace.calls[0].finish_reason == "length"


def test_generation_marks_of_a_training_template_render_their_body(tmp_path, tokenizers_dir):
    """TRL's *_training.jinja and transformers' AssistantTracker wrap the assistant's text in
    {% generation %}: the gateway renders it as transformers does."""
    plain = ChatRenderer(tokenizers_dir["chatml"])
    config = json.loads((tokenizers_dir["chatml"] / "tokenizer_config.json").read_text())
    marked = config["chat_template"].replace("{{- content }}", "{% generation %}{{- content }}{% endgeneration %}")
    assert marked != config["chat_template"]
    (tmp_path / "training.jinja").write_text(marked)
    training = ChatRenderer(tokenizers_dir["chatml"], tmp_path / "training.jinja")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "It is 42."}]
    assert training.render(messages, None, add_generation_prompt=False) == plain.render(
        messages, None, add_generation_prompt=False
    )


def test_a_streamed_answer_carries_its_logprobs_when_asked(tokenizers_dir):
    folder = tokenizers_dir["chatml"]

    async def main():
        async with (
            ScriptedTokenEngine(folder, lambda _: "It is 42.") as engine,
            gateway_for(engine, "sglang-generate", folder) as gateway,
        ):
            policy = gateway.open_rollout("r-1")
            body = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "stream": True}
            _, raw = await post(policy.chat_completions_url, body, token=policy.api_key)
            return sse_docs(raw), engine.requests[0]

    docs, seen = run(main)
    entries = [e for d in docs if d["choices"] for e in (d["choices"][0]["logprobs"] or {}).get("content", [])]
    assert [e["logprob"] for e in entries] == pytest.approx(seen.logprobs)


@pytest.mark.parametrize("adapter", ["sglang-generate", "vllm-completions"])
def test_context_length_clamps_each_calls_cap_and_refuses_a_prompt_that_fills_it(tokenizers_dir, adapter):
    folder = tokenizers_dir["chatml"]

    async def main():
        async with ScriptedTokenEngine(folder, lambda _: "ok") as engine:
            prompt = len(ChatRenderer(folder).prompt_ids([{"role": "user", "content": "hi"}], None))
            async with gateway_for(engine, adapter, folder, context_length=prompt + 10) as gateway:
                policy = gateway.open_rollout("r-1")
                hi = {"messages": [{"role": "user", "content": "hi"}]}
                ok = await post(policy.chat_completions_url, hi, token=policy.api_key)
                long = {"messages": [{"role": "user", "content": "hi " * 40}]}
                refused = await post(policy.chat_completions_url, long, token=policy.api_key)
                own = [  # the agent's own cap: over the room, under it, null (unset), not a count
                    await post(policy.chat_completions_url, {**hi, "max_tokens": cap}, token=policy.api_key)
                    for cap in (500, 3, None, "many")
                ]
                return prompt, ok, refused, own, engine.requests, gateway.pop_trace("r-1")

    _prompt, ok, refused, own, seen, trace = run(main)
    assert ok[0] == 200
    assert [status for status, _ in own] == [200, 200, 200, 400]
    name = "max_new_tokens" if adapter == "sglang-generate" else "max_tokens"
    caps = [(r.body["sampling_params"] if adapter != "vllm-completions" else r.body)[name] for r in seen[1:]]
    room_here = 10 - (adapter == "sglang-generate")
    assert caps == [room_here, 3, room_here]  # (a null is unset: the default, clamped)
    assert "max_tokens must be a count of tokens" in json.loads(own[3][1])["error"]["message"]
    room = 10 - (adapter == "sglang-generate")  # (SGLang refuses a prompt and cap that fill it exactly)
    body = seen[0].body
    assert (body["sampling_params"]["max_new_tokens"] if adapter == "sglang-generate" else body["max_tokens"]) == room
    assert trace.calls[0].token_in["max_tokens_clamped"] == {"asked": 4096, "sent": room}
    assert refused[0] == 400
    assert "context_length" in json.loads(refused[1])["error"]["message"]
    assert len(seen) == 4  # (the refused calls never reached the engine)
    assert [c.status for c in trace.calls] == ["ok", "bad_request", "ok", "ok", "ok", "bad_request"]


def test_context_length_is_a_traces_setting(tmp_path, tokenizers_dir):
    upstream = PolicyEndpoint("http://127.0.0.1:1", "m")
    table = {"adapter": "sglang-generate", "tokenizer": str(tokenizers_dir["chatml"]), "context_length": 4096}
    gateway = gateway_from_settings(upstream, table, "c.toml")
    assert gateway.token_in.context_length == 4096
    with pytest.raises(ConfigError, match="context_length"):
        gateway_from_settings(upstream, {**table, "context_length": 1}, "c.toml")
    with pytest.raises(ConfigError, match="context_length"):
        gateway_from_settings(upstream, {"adapter": "vllm", "context_length": 4096}, "c.toml")
