"""Options shared by ``osmosis run`` and ``osmosis validate``: a config file plus overriding flags."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

__all__ = ["config_options", "make_console", "resolve_config"]

_F = Callable[..., Any]

_OPTIONS: list[Callable[[_F], _F]] = [
    click.option("--rollout", "rollout_path", metavar="DIR", help="The rollout folder (overrides rollout.path)."),
    click.option("--backend", metavar="NAME", help="The backend to run on (overrides run.backend), e.g. local."),
    click.option("--dataset", metavar="FILE", help="A JSONL dataset (overrides dataset.path)."),
    click.option("--limit", type=click.IntRange(min=0), help="Run only the first N rows."),
    click.option("--n-samples", type=click.IntRange(min=1), help="Rollouts per row."),
    click.option("--concurrency", type=click.IntRange(min=1), help="Rollouts at once."),
    click.option(
        "--workers", type=click.IntRange(min=1), help="Processes to run rollouts in (local backend; CPU-bound agents)."
    ),
    click.option(
        "--policy-url",
        metavar="URL",
        help="The OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1. When it names another host than the"
        " config's [policy] base_url, the config's key ([policy] api_key_env) is sent there only if --api-key-env"
        " is given too ([policy] headers go to the URL given).",
    ),
    click.option("--model", metavar="NAME", help="The model name sent to the endpoint."),
    click.option("--api-key-env", metavar="VAR", help="The environment variable holding the API key."),
    click.option("--agent-timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds per workflow."),
    click.option("--grader-timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds per grading."),
    click.option("--output", metavar="DIR", help="The run folder (default runs/<config>-<timestamp>)."),
]


def make_console(*, stderr: bool = False) -> Any:
    """A rich console; when the output is not a terminal (a log, CI, a pipe) its lines are never
    wrapped at 80 columns: a long path or message stays on one line that tools can grep."""
    from rich.console import Console

    console = Console(highlight=False, stderr=stderr)
    if not console.is_terminal:
        console = Console(highlight=False, stderr=stderr, width=100_000, soft_wrap=True)
    return console


def config_options(function: _F) -> _F:
    """Add the config-overriding flags to a command."""
    for option in reversed(_OPTIONS):
        function = option(function)
    return function


def _origin(url: str) -> tuple[str, str, int | None]:
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        port = None
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port or default


def _credentials_for_another_host(policy: Any, flags: dict[str, Any]) -> str | None:
    """A problem when ``--policy-url`` would take the config's key to another host unasked.

    The config's ``[policy] api_key_env`` names a key meant for its ``base_url``; a ``--policy-url``
    that points elsewhere would hand it to whatever answers there. The user says it is meant by
    naming the key's variable on the command line too (``--api-key-env``).
    """
    url = flags.get("policy_url")
    if not url or flags.get("api_key_env") is not None or not policy.base_url or not policy.api_key_env:
        return None
    if _origin(url) == _origin(policy.base_url):
        return None
    _, host, port = _origin(policy.base_url)
    return (
        f"--policy-url points at another host than the config's base_url ({host}:{port}), which the key in"
        f" ${policy.api_key_env} was meant for; to send that key to the new host, give --api-key-env"
        f" {policy.api_key_env} as well (or --api-key-env '' to send no key) @ $.policy.base_url"
    )


def resolve_config(config_file: Path | None, flags: dict[str, Any]) -> Any:
    """Read CONFIG (if given) and apply the flags over it; check the result.

    :raises ConfigError: a bad file or a bad combination, with key paths.
    """
    from osmosis_core._engine.config import RunConfig, check_config, load_config
    from osmosis_core.errors import ConfigError

    config = load_config(config_file) if config_file is not None else RunConfig(root=Path.cwd())
    cwd = Path.cwd()

    def path_flag(value: str) -> str:
        # paths given on the command line are relative to where the user stands
        return str((cwd / value).resolve())

    if flags.get("rollout_path"):
        config.rollout.path = path_flag(flags["rollout_path"])
    if flags.get("dataset"):
        config.dataset.path = path_flag(flags["dataset"])
    if flags.get("output"):
        config.run.output = path_flag(flags["output"])
    simple = {
        "backend": ("run", "backend"),
        "limit": ("dataset", "limit"),
        "n_samples": ("run", "n_samples"),
        "concurrency": ("run", "concurrency"),
        "workers": ("run", "workers"),
        "policy_url": ("policy", "base_url"),
        "model": ("policy", "model"),
        "api_key_env": ("policy", "api_key_env"),
        "agent_timeout": ("run", "agent_timeout_sec"),
        "grader_timeout": ("run", "grader_timeout_sec"),
    }
    credentials_problem = _credentials_for_another_host(config.policy, flags)
    for flag, (section, key) in simple.items():
        if flags.get(flag) is not None:
            setattr(getattr(config, section), key, flags[flag])
    problems = check_config(config)
    if credentials_problem:
        problems.append(credentials_problem)
    if problems:
        raise ConfigError(str(config_file or "<command line>"), problems)
    return config
