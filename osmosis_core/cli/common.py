"""Options shared by ``osmosis run`` and ``osmosis validate``: a config file plus overriding flags."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, overload

import click

__all__ = ["config_options", "make_console", "resolve_config"]

_F = Callable[..., Any]

CONSOLE_SCRIPT = False
"""True in the ``osmosis`` console script (its process exits after the command), False for a caller
that runs a command in its own process (a test through click's runner)."""

_OPTIONS: dict[str, Callable[[_F], _F]] = {
    "--rollout": click.option(
        "--rollout", "rollout_path", metavar="DIR", help="The rollout folder (overrides rollout.path)."
    ),
    "--backend": click.option(
        "--backend", metavar="NAME", help="The backend to run on (overrides run.backend), e.g. local."
    ),
    "--dataset": click.option("--dataset", metavar="FILE", help="A JSONL dataset (overrides dataset.path)."),
    "--limit": click.option("--limit", type=click.IntRange(min=0), help="Run only the first N rows."),
    "--n-samples": click.option("--n-samples", type=click.IntRange(min=1), help="Rollouts per row."),
    "--concurrency": click.option("--concurrency", type=click.IntRange(min=1), help="Rollouts at once."),
    "--workers": click.option(
        "--workers", type=click.IntRange(min=1), help="Processes to run rollouts in (local backend; CPU-bound agents)."
    ),
    "--policy-url": click.option(
        "--policy-url",
        metavar="URL",
        help="The OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1. On another host than the config's"
        " [policy] base_url, the config's key ([policy] api_key_env) is not sent there unless --api-key-env names"
        " it, as requests and curl drop credentials on a redirect to another host ([policy] headers go to the URL"
        " given).",
    ),
    "--model": click.option("--model", metavar="NAME", help="The model name sent to the endpoint."),
    "--api-key-env": click.option("--api-key-env", metavar="VAR", help="The environment variable holding the API key."),
    "--agent-timeout": click.option(
        "--agent-timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds per workflow."
    ),
    "--grader-timeout": click.option(
        "--grader-timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds per grading."
    ),
    "--output": click.option("--output", metavar="DIR", help="The run folder (default runs/<config>-<timestamp>)."),
}


def make_console(*, stderr: bool = False) -> Any:
    """A rich console; when the output is not a terminal (a log, CI, a pipe) its lines are never
    wrapped at 80 columns: a long path or message stays on one line that tools can grep."""
    from rich.console import Console

    console = Console(highlight=False, stderr=stderr)
    if not console.is_terminal:
        console = Console(highlight=False, stderr=stderr, width=100_000, soft_wrap=True)
    return console


@overload
def config_options(function: _F, /) -> _F: ...


@overload
def config_options(*, omit: Iterable[str] = ()) -> Callable[[_F], _F]: ...


def config_options(function: _F | None = None, /, *, omit: Iterable[str] = ()) -> Any:
    """Add the config-overriding flags to a command: ``@config_options``, or
    ``@config_options(omit=["--dataset", "--limit"])`` for a command to which those mean nothing
    (its ``--help`` then lists only the flags it takes).

    :raises ValueError: ``omit`` names a flag that is not one of them.
    """
    left_out = set(omit)
    unknown = left_out - set(_OPTIONS)
    if unknown:
        raise ValueError(f"config_options(omit=...): no such flag: {', '.join(sorted(unknown))}")

    def decorate(command: _F) -> _F:
        for flag, option in reversed(_OPTIONS.items()):
            if flag not in left_out:
                command = option(command)
        return command

    return decorate if function is None else decorate(function)


def _origin(url: str) -> tuple[str, str, int | None]:
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port or default


def _key_left_behind(policy: Any, flags: dict[str, Any]) -> str | None:
    """The notice when ``--policy-url`` is on another host (scheme, name or port) than the config's
    ``base_url``, whose key is then not sent (the rule and why: ``--policy-url``'s help)."""
    url = flags.get("policy_url")
    if not url or flags.get("api_key_env") is not None or not policy.base_url or not policy.api_key_env:
        return None
    if _origin(url) == _origin(policy.base_url):
        return None
    _, host, port = _origin(policy.base_url)
    return (
        f"notice: --policy-url is on another host than the config's base_url ({host}:{port}): the key in"
        f" ${policy.api_key_env}, meant for that host, is not sent (give --api-key-env {policy.api_key_env}"
        " to send it)"
    )


_OVERRIDES: dict[str, tuple[str, str, str]] = {
    "rollout_path": ("--rollout", "rollout", "path"),
    "dataset": ("--dataset", "dataset", "path"),
    "output": ("--output", "run", "output"),
    "backend": ("--backend", "run", "backend"),
    "limit": ("--limit", "dataset", "limit"),
    "n_samples": ("--n-samples", "run", "n_samples"),
    "concurrency": ("--concurrency", "run", "concurrency"),
    "workers": ("--workers", "run", "workers"),
    "policy_url": ("--policy-url", "policy", "base_url"),
    "model": ("--model", "policy", "model"),
    "api_key_env": ("--api-key-env", "policy", "api_key_env"),
    "agent_timeout": ("--agent-timeout", "run", "agent_timeout_sec"),
    "grader_timeout": ("--grader-timeout", "run", "grader_timeout_sec"),
}
"""Each overriding flag's parameter: the flag, and the config key it sets (``[section] key``)."""
_PATHS = frozenset({"rollout_path", "dataset", "output"})
"""The flags that name a path (relative to where the user stands, not to the workspace)."""
_FLAG_OF_KEY = {f"$.{section}.{key}": flag for flag, section, key in _OVERRIDES.values()}


def _blame_flags(problems: list[str], given: set[str]) -> None:
    """Raise a usage error naming the flag when a problem lies in a value given on the command line.

    :raises click.BadParameter: one problem, of ``--flag``; ``click.UsageError`` for several.
    """
    ctx = click.get_current_context(silent=True)
    split = [problem.rpartition(" @ ") for problem in problems]
    mine = [(_FLAG_OF_KEY[path], message) for message, _, path in split if _FLAG_OF_KEY.get(path) in given]
    if len(mine) == 1:
        raise click.BadParameter(mine[0][1], ctx=ctx, param_hint=f"'{mine[0][0]}'")
    if mine:
        raise click.UsageError("\n".join(f"Invalid value for '{flag}': {message}" for flag, message in mine), ctx)


def _check_backend_name(config: Any, source: str, flag_given: bool) -> None:
    """An unknown backend stops here, before anything starts, blaming ``--backend`` or ``$.run.backend``."""
    from osmosis_core._engine.registry import get_registry
    from osmosis_core.errors import ConfigError, PluginError

    try:
        get_registry().backend(config.run.backend)
    except PluginError as exc:
        if flag_given:
            _blame_flags([f"{exc} @ $.run.backend"], {"--backend"})
        raise ConfigError(source, [f"{exc} @ $.run.backend"]) from None


def _missing_config() -> click.MissingParameter:
    """click's own "Missing argument 'CONFIG'", for a command run with neither CONFIG nor ``--rollout``."""
    ctx = click.get_current_context(silent=True)
    param = next((p for p in ctx.command.params if p.name == "config_file"), None) if ctx is not None else None
    if param is None:
        return click.MissingParameter(ctx=ctx, param_hint="'CONFIG'", param_type="argument")
    return click.MissingParameter(ctx=ctx, param=param)


def resolve_config(config_file: Path | None, flags: dict[str, Any]) -> Any:
    """Read CONFIG (if given) and apply the flags over it; check the result.

    Without CONFIG, ``--rollout DIR`` (with the other flags) is the whole config. A problem with a
    value given as a flag is a usage error naming the flag (exit 2, as click reports its own); a
    problem in the file names the file and the key path.

    :raises ConfigError: a bad file or a bad combination, with key paths.
    :raises click.UsageError: neither CONFIG nor ``--rollout`` (click's "Missing argument 'CONFIG'"),
        or a bad flag value (``--backend loacl``).
    """
    from osmosis_core._engine.config import RunConfig, check_config, load_config
    from osmosis_core.errors import ConfigError

    if config_file is None and not flags.get("rollout_path"):
        raise _missing_config()
    config = load_config(config_file) if config_file is not None else RunConfig(root=Path.cwd())
    given = {_OVERRIDES[name][0] for name, value in flags.items() if name in _OVERRIDES and value is not None}
    notice = _key_left_behind(config.policy, flags)
    for name, (_, section, key) in _OVERRIDES.items():
        value = flags.get(name)
        if value is None or (name in _PATHS and not value):
            continue
        # paths given on the command line are relative to where the user stands
        setattr(getattr(config, section), key, str((Path.cwd() / value).resolve()) if name in _PATHS else value)
    source = str(config_file or "<command line>")
    problems = check_config(config)
    _blame_flags(problems, given)
    if problems:
        raise ConfigError(source, problems)
    _check_backend_name(config, source, "--backend" in given)
    if notice is not None:
        config.policy.api_key_env = None  # (the variable need not even be set)
        click.echo(click.style(notice, fg="yellow"), err=True)
    return config
