"""``osmosis gateway`` (a standalone policy gateway) and ``osmosis export`` (traces as ATIF)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

if TYPE_CHECKING:
    from osmosis_gateway.adapters import AdapterName

__all__ = ["export", "gateway"]

BANNER = "osmosis gateway listening on "


@click.command(short_help="Run a policy gateway that records token-level traces.")
@click.option("--upstream", "upstream_url", required=True, metavar="URL", help="The upstream's OpenAI base URL.")
@click.option("--model", default="default", show_default=True, help="The model name rollouts get.")
@click.option("--api-key-env", metavar="VAR", help="The environment variable holding the upstream's key.")
@click.option(
    "--adapter",
    type=click.Choice(["vllm", "sglang", "openai", "sglang-generate", "vllm-completions", "trl-generate"]),
    default="vllm",
    show_default=True,
    help="How the upstream is asked for token ids (openai: text only); sglang-generate, vllm-completions and "
    "trl-generate: a token-in engine (--upstream its base URL), the gateway renders with --tokenizer.",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Token-in: the policy's tokenizer folder (tokenizer.json, tokenizer_config.json).",
)
@click.option(
    "--chat-template",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Token-in: a .jinja template replacing the folder's.",
)
@click.option(
    "--tool-parser",
    default="hermes",
    show_default=True,
    help="Token-in: the format of the policy's tool calls: hermes, llama3_json, mistral, or a parser of the "
    "model's own format, package.module:function.",
)
@click.option(
    "--context-length",
    type=click.IntRange(min=2),
    metavar="TOKENS",
    help="Token-in: the engine's context length (SGLang's --context-length, vLLM's --max-model-len): each call's "
    "cap is clamped to what its prompt leaves, and a prompt that fills it is refused (400).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="The port (0: a free one).")
@click.option("--bearer-env", metavar="VAR", help="Take the gateway's bearer from this variable (else one is made).")
@click.option("--policy-version", help="The policy version recorded on calls that name none.")
@click.option(
    "--read-timeout",
    "read_timeout_sec",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    metavar="SEC",
    help="Give up a call when the upstream sends nothing this long.",
)
def gateway(
    upstream_url: str,
    model: str,
    api_key_env: str | None,
    adapter: str,
    tokenizer: Path | None,
    chat_template: Path | None,
    tool_parser: str,
    context_length: int | None,
    host: str,
    port: int,
    bearer_env: str | None,
    policy_version: str | None,
    read_timeout_sec: float,
) -> None:
    """Run a policy gateway in front of an inference server until Ctrl-C.

    It prints its URL and its bearer token. A trainer opens a rollout with
    POST {url}/rollouts {"rollout_id": ...} (bearer), which answers the rollout's own base_url and
    api_key; the rollout's calls are recorded; DELETE {url}/rollouts/{id} takes its trace out.

    \b
    Example:
      osmosis gateway --upstream http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B
      osmosis gateway --upstream http://127.0.0.1:30000 --adapter sglang-generate --tokenizer /models/Qwen3-8B
    """
    import asyncio
    import signal

    from osmosis_core import PolicyEndpoint
    from osmosis_gateway.gateway import PolicyGateway

    key = None
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise click.BadParameter(f"the environment variable {api_key_env} is not set", param_hint="--api-key-env")
    bearer = None
    if bearer_env:
        bearer = os.environ.get(bearer_env)
        if not bearer:
            raise click.BadParameter(f"the environment variable {bearer_env} is not set", param_hint="--bearer-env")
    if not upstream_url.startswith(("http://", "https://")):
        raise click.BadParameter(f"must start with http:// or https://, got {upstream_url!r}", param_hint="--upstream")
    upstream = PolicyEndpoint(upstream_url, model, key)
    token_in = None
    if adapter in ("sglang-generate", "vllm-completions", "trl-generate"):
        if tokenizer is None:
            raise click.BadParameter(f"adapter {adapter} needs the policy's tokenizer folder", param_hint="--tokenizer")
        from osmosis_gateway.token_in import TokenIn, TokenizerFolderError

        try:
            token_in = TokenIn(
                cast("Any", adapter), tokenizer, chat_template=chat_template, tool_parser=tool_parser,
                context_length=context_length,
            )  # fmt: skip
        except TokenizerFolderError as exc:
            raise click.BadParameter(str(exc), param_hint="--tokenizer") from None
        except ValueError as exc:  # (the tool parser)
            raise click.BadParameter(str(exc), param_hint="--tool-parser") from None
        except ImportError as exc:  # (tokenizers or jinja2 missing)
            raise click.BadParameter(str(exc), param_hint="--adapter") from None
    elif tokenizer is not None or chat_template is not None or context_length is not None:
        raise click.BadParameter(
            f"adapter {adapter} does not render: no tokenizer, template or context length", param_hint="--adapter"
        )

    async def serve() -> None:
        from osmosis_core.http import aclose_http

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        server = PolicyGateway(
            upstream,
            adapter=cast("AdapterName", adapter),
            host=host,
            port=port,
            bearer=bearer,
            policy_version=policy_version,
            read_timeout_sec=read_timeout_sec,
            token_in=token_in,
        )
        try:
            await server.start()
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from None
        click.echo(f"{BANNER}{server.url} (upstream {upstream.base_url}, adapter {adapter})")
        if bearer is None:
            click.echo(f"bearer: {server.bearer}")
        try:
            await stop.wait()
        finally:
            await server.aclose()
            await aclose_http()

    try:
        import uvloop  # a third less CPU per call than asyncio's loop (bench/gateway_overhead.py)
    except ImportError:  # pragma: no cover - not on Windows
        asyncio.run(serve())
    else:
        uvloop.run(serve())


@click.command(short_help="Export a run's traces to another format (ATIF).")
@click.argument("run_dir", metavar="RUN", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["atif"]), default="atif", show_default=True)
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    help="The folder to write to (default: RUN/atif).",
)
def export(run_dir: Path, fmt: str, output: Path | None) -> None:
    """Export a run's traces (traces.jsonl, from osmosis run --traces) to another format.

    atif: Harbor's Agent Trajectory Interchange Format v1.7, one <rollout_id>.json per rollout
    (one step per model call, token ids and logprobs in each step's metrics). An incomplete
    rollout's file is valid ATIF too: a failed call's step holds its status and error, and no
    token ids it did not capture.
    """
    from osmosis_gateway.atif import trace_to_atif
    from osmosis_trainer.trace import read_traces

    source = run_dir / "traces.jsonl"
    if not source.is_file():
        raise click.ClickException(f"{source} does not exist: run with --traces (or a [traces] table) first")
    try:
        traces = read_traces(source)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    results = _rewards(run_dir / "results.jsonl")
    out = output or run_dir / "atif"
    out.mkdir(parents=True, exist_ok=True)
    written = incomplete = skipped = 0
    for (row, sample), (line, trace) in sorted(traces.items()):
        extra = {"row_index": row, "sample_index": sample, **results.get((row, sample), {})}
        document = trace_to_atif(trace, extra=extra)
        if document is None:
            skipped += 1
            continue
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(line["rollout_id"]))
        (out / f"{name}.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        written += 1
        incomplete += not trace.complete
    said = f"wrote {written} ATIF trajectories to {out}"
    if incomplete:
        said += f" ({incomplete} of incomplete rollouts: extra.complete is false, notes say what is missing)"
    if skipped:
        said += f"; {skipped} rollout{' made' if skipped == 1 else 's made'} no model call and "
        said += "has no trajectory" if skipped == 1 else "have no trajectory"
    click.echo(said)


def _rewards(path: Path) -> dict[tuple[int, int], dict[str, object]]:
    """Each (row, sample)'s latest status and reward from results.jsonl (when there is one)."""
    found: dict[tuple[int, int], dict[str, object]] = {}
    if not path.is_file():
        return found
    with path.open(encoding="utf-8") as handle:
        for text in handle:
            try:
                line = json.loads(text)
                found[(int(line["row"]), int(line["sample_index"]))] = {
                    "status": line.get("status"),
                    "reward": line.get("reward"),
                }
            except (ValueError, KeyError, TypeError):
                continue
    return found
