"""The ``[traces]`` table of a run config (``osmosis run --traces`` turns it on with its defaults)::

[traces]
adapter = "vllm"            # how the upstream is asked for tokens: vllm, sglang, openai (text only),
                            # or a token-in engine: sglang-generate, vllm-completions, trl-generate
# tokenizer = "/models/Qwen3-8B"      # token-in: the policy's tokenizer folder (tokenizer.json, tokenizer_config.json);
#                                     # relative: to the config's folder or a parent of it, else the current one
# chat_template = "template.jinja"    # token-in: a template replacing the folder's
# tool_parser = "hermes"              # token-in: hermes, llama3_json, mistral, or "package.module:function"
# context_length = 32768              # token-in: the engine's context; each call's cap is clamped to what
#                                     # its prompt leaves, a prompt that fills it is refused (400)
policy_version = "step-0"   # recorded on every call that names none
# host = "127.0.0.1"        # where the gateway listens (a bearer is always required)
# port = 0                  # 0 picks a free port
# read_timeout_sec = 600    # the upstream sending nothing this long fails the call (no_answer)
# enabled = false           # keep the table, turn traces off
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import attrs

from osmosis_core import ConfigError, PolicyEndpoint
from osmosis_core.plugin import structure_table
from osmosis_gateway.adapters import TOKEN_IN_ADAPTERS, AdapterName

READ_TIMEOUT_SEC: Final = 600.0
"""How long the upstream may send nothing (before its answer's head, or between two pieces of it)
before a call is given up (``no_answer``, or ``cut`` mid-stream): as long as the core's client waits."""

__all__ = ["READ_TIMEOUT_SEC", "TracesSettings", "gateway_from_settings"]


@attrs.define(kw_only=True)
class TracesSettings:
    """``[traces]``: the policy gateway of a run."""

    enabled: bool = True
    adapter: AdapterName = "vllm"
    policy_version: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    read_timeout_sec: float = attrs.field(default=READ_TIMEOUT_SEC, validator=attrs.validators.gt(0))
    tokenizer: str | None = None
    chat_template: str | None = None
    tool_parser: str = "hermes"
    """hermes, llama3_json, mistral, or a parser's import path ``"package.module:function"``."""
    context_length: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(2)))
    """Token-in: the engine's context length in tokens (prompt and generation)."""


def gateway_from_settings(upstream: PolicyEndpoint, settings: dict[str, Any], source: str) -> Any:
    """A :class:`~osmosis_gateway.PolicyGateway` (not started) in front of ``upstream``.

    :raises osmosis_core.ConfigError: a bad ``[traces]`` key, named by its path.
    """
    from osmosis_gateway.gateway import PolicyGateway

    checked = structure_table(settings, TracesSettings, "$.traces", source)
    token_in = None
    if checked.adapter in TOKEN_IN_ADAPTERS:
        token_in = _token_in(checked, source)
    elif checked.tokenizer is not None or checked.chat_template is not None or checked.context_length is not None:
        key = (
            "tokenizer" if checked.tokenizer is not None
            else "chat_template" if checked.chat_template is not None
            else "context_length"
        )  # fmt: skip
        raise ConfigError(
            source, [f"only a token-in adapter renders ({', '.join(TOKEN_IN_ADAPTERS)}) @ $.traces.{key}"]
        )
    return PolicyGateway(
        upstream,
        token_in=token_in,
        adapter=checked.adapter,
        host=checked.host,
        port=checked.port,
        policy_version=checked.policy_version,
        read_timeout_sec=checked.read_timeout_sec,
    )


def _token_in(checked: TracesSettings, source: str) -> Any:
    """The token-in engine of a checked ``[traces]`` table (its tokenizer loaded, its template compiled).

    :raises osmosis_core.ConfigError: no tokenizer, or a folder or template that cannot serve.
    """
    from osmosis_gateway.token_in import TokenIn, TokenizerFolderError

    if checked.tokenizer is None:
        raise ConfigError(
            source, [f"adapter {checked.adapter!r} needs the policy's tokenizer folder @ $.traces.tokenizer"]
        )
    template = None if checked.chat_template is None else _config_path(checked.chat_template, source)
    try:
        return TokenIn(
            checked.adapter,  # type: ignore[arg-type]  # (one of TOKEN_IN_ADAPTERS)
            _config_path(checked.tokenizer, source),
            chat_template=template,
            tool_parser=checked.tool_parser,
            context_length=checked.context_length,
        )
    except TokenizerFolderError as exc:
        key = "chat_template" if checked.chat_template is not None and "chat template" in str(exc) else "tokenizer"
        raise ConfigError(source, [f"{exc} @ $.traces.{key}"]) from None
    except ValueError as exc:  # (the tool parser: unknown, or an import path that does not import)
        raise ConfigError(source, [f"{exc} @ $.traces.tool_parser"]) from None
    except ImportError as exc:  # (tokenizers or jinja2 missing: the extra)
        raise ConfigError(source, [f"{exc} @ $.traces.adapter"]) from None


def _config_path(path: str, source: str) -> Path:
    """A path of the table: absolute (or ``~``) as is; a relative one against the config file's
    folder and its parents (the first where it exists), else the current folder."""
    found = Path(path).expanduser()
    if found.is_absolute():
        return found
    config = Path(source)
    anchors = [config.resolve().parent, *config.resolve().parents] if config.is_file() else []
    for base in anchors:
        if (base / found).exists():
            return base / found
    return Path.cwd() / found
