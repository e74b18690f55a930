"""``osmosis validate CONFIG``: the preflight of ``osmosis run`` alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from osmosis_core.cli.common import config_options, resolve_config

__all__ = ["validate"]

_OK = click.style("ok", fg="green")
_WARN = click.style("warn", fg="yellow")


@click.command(short_help="Check a run config without running anything.")
@click.argument("config_file", metavar="CONFIG", required=False, type=click.Path(dir_okay=False, path_type=Path))
@config_options
def validate(config_file: Path | None, **flags: Any) -> None:
    """Check a run config without running anything.

    Reads the config, the dataset (every line), the backend and its settings, imports the
    rollout's entrypoint once so wiring errors show now, and asks the policy endpoint GET /models
    (nothing is generated). A package this environment lacks (ModuleNotFoundError) is a warning
    naming it, and whether the rollout's pyproject.toml declares it (the rollout may run where it is
    installed: a trial image, a cluster node); any other import error fails. An endpoint that does
    not answer from here is a warning too (osmosis run here would stop on it).

    \b
    Examples:
      osmosis validate configs/eval/multiply-plain.toml
      osmosis validate configs/eval/multiply-plain.toml --backend local --limit 5
    """
    from osmosis_core._engine.config import api_key_from_env
    from osmosis_core._engine.dataset import read_dataset
    from osmosis_core._engine.loader import MissingDependency, load_rollout
    from osmosis_core._engine.registry import get_registry
    from osmosis_core._engine.runner import build_backend
    from osmosis_core.errors import ConfigError

    config = resolve_config(config_file, flags)
    registry = get_registry()
    click.echo(f"{_OK}    config {config.source or '(flags)'}")
    if config.dataset.path:
        rows = read_dataset(config.resolve(config.dataset.path), limit=config.dataset.limit)
        labelled = sum(r.label is not None for r in rows)
        click.echo(f"{_OK}    dataset: {len(rows)} rows ({labelled} with a label)")
    else:
        click.echo(f"{_WARN}  no dataset.path (give --dataset to osmosis run)")
    try:
        rollout = load_rollout(config, registry)
    except MissingDependency as exc:
        click.echo(f"{_WARN}  {exc}")
        click.echo(click.style("skip", fg="yellow") + "  workflow, grader and backend checks need that package")
        return
    grader = rollout.grader_class.__name__ if rollout.grader_class else "none"
    click.echo(f"{_OK}    rollout: workflow {rollout.workflow_class.__name__}, grader {grader}")
    backend = build_backend(config, rollout, registry, None)
    click.echo(f"{_OK}    backend {config.run.backend!r} (up to {backend.max_concurrency or 'unlimited'} at once)")
    import anyio

    anyio.run(backend.aclose)  # a backend may hold processes or sandboxes even before its first rollout
    if config.policy.base_url:
        try:
            api_key_from_env(config)
        except ConfigError as exc:
            click.echo(f"{_WARN}  {exc.problems[0]}")
            config.policy.api_key_env = None  # (the endpoint is still asked, without a key)
        _check_policy(config)
    else:
        click.echo(f"{_WARN}  no policy.base_url: give --policy-url or --stub-policy")


def _check_policy(config: Any) -> None:
    """Whether the endpoint answers ``GET /models`` (see :mod:`osmosis_core._engine.policy_check`).

    Unreachable is a warning here, as a missing package is: the run may happen where the endpoint
    is (a cluster node); ``osmosis run`` stops on it.
    """
    from osmosis_core._engine.policy_check import check_config_policy

    policy, check = check_config_policy(config)
    where = f"policy {policy.base_url} model {policy.model!r}"
    if check.unreachable is not None:
        click.echo(
            f"{_WARN}  {where}: unreachable ({check.unreachable}); osmosis run here would stop before it starts"
            " (start its server, or give --policy-url or --stub-policy)"
        )
    elif check.warning is not None:
        click.echo(f"{_WARN}  {where}: {check.warning}")
    else:
        answer = f"answers GET /models ({check.status})"
        if check.models:
            answer += ", lists the model"
        click.echo(f"{_OK}    {where}: {answer}")
