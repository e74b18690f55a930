"""``osmosis migrate [DIR]``: rewrite a workspace written for osmosis-ai (the reference SDK) for osmosis."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from osmosis_migrate import MigrationPlan

__all__ = ["migrate"]


@click.command(short_help="Rewrite an osmosis-ai workspace for osmosis.")
@click.argument("directory", metavar="[DIR]", required=False, default=".", type=click.Path(path_type=Path))
@click.option("--write", is_flag=True, help="Apply the changes; each changed file is first copied to <file>.orig.")
@click.option("--no-diff", "no_diff", is_flag=True, help="Print only the summary, not the diff.")
def migrate(directory: Path, write: bool, no_diff: bool) -> None:
    """Rewrite an osmosis-ai workspace for osmosis (a diff first; --write applies it).

    For rollouts written for osmosis-ai, the reference SDK (import path osmosis_ai.rollout). DIR
    (default: the current folder) is the workspace: rollouts/, configs/, data/. It rewrites the
    imports of every Python file (to osmosis_core and the osmosis_strands, osmosis_openai_agents,
    osmosis_harbor and osmosis_server plugins), each rollout's pyproject.toml dependencies, and
    configs/eval/*.toml and configs/training/*.toml into osmosis run configs. Every setting or
    name it cannot map is listed with where it is and why.

    By default it prints the diff and changes nothing. With --write it applies the changes,
    keeping each changed file as <file>.orig; it refuses (writing nothing) when such a backup
    already exists. Running it again finds nothing to change.

    It reads only regular files: FIFOs, devices and sockets are never opened, symlinks are never
    followed (each is listed as left alone), and every file it could not read (not a regular file,
    permission denied, not UTF-8 text, larger than 16 MiB) is listed with why; those are not migrated.

    Exit status: 0 when the plan was shown or written (or nothing was left to change); 1 when DIR
    is not an osmosis-ai workspace, or nothing in it could be migrated; 3 when the plan was shown or
    written but some files could not be read (listed: migrate them by hand).

    \b
    Examples:
      osmosis migrate                      # show the diff and what cannot be mapped
      osmosis migrate my-workspace --write
      osmosis validate my-workspace/configs/eval/multiply-local-strands.toml
    """
    from osmosis_migrate import apply_migration, plan_migration

    plan = plan_migration(directory)
    shown = str(directory)
    unread = f"; {len(plan.unreadable)} file(s) could not be read (see the list above)" if plan.unreadable else ""
    if not plan.changes:
        _print_findings(plan.unmapped)
        _print_unread(plan)
        if plan.already_migrated:
            click.echo(f"osmosis migrate: nothing to change in {shown}: it is already migrated")
            _exit_if_unread(plan)
            return
        if not plan.is_reference_workspace:
            raise click.ClickException(
                f"{shown} is not an osmosis-ai workspace: no osmosis_ai import, osmosis-ai dependency or "
                f"[experiment] config found{' in the files it could read' if unread else ''}{unread}"
            )
        raise click.ClickException(f"nothing in {shown} could be migrated automatically (see the list above){unread}")
    if not write and not no_diff:
        for change in plan.changes:
            click.echo(change.diff(), nl=False)
        click.echo()
    if write:
        apply_migration(plan)
    verb = "changed" if write else "would change"
    click.echo(f"osmosis migrate: {len(plan.changes)} file(s) {verb} in {shown}")
    for change in plan.changes:
        flag = "A" if change.old is None else "M"
        kept = f"  (original: {change.rel}.orig)" if write and change.old is not None else ""
        click.echo(f"  {flag} {change.rel}{kept}")
    if plan.notes:
        click.echo("changes to know about:")
        for note in plan.notes:
            click.echo(f"  {note}")
    _print_findings(plan.unmapped)
    _print_unread(plan)
    if not write:
        target = "" if shown == "." else f" {shown}"
        click.echo(f"apply with: osmosis migrate{target} --write   (each changed file is first copied to <file>.orig)")
    else:
        click.echo("next: osmosis validate CONFIG for each migrated config, then osmosis run CONFIG --stub-policy")
    _exit_if_unread(plan)


def _print_findings(findings: tuple[object, ...]) -> None:
    if not findings:
        return
    click.echo(f"not mapped ({len(findings)}), each with why:")
    for finding in findings:
        click.echo(f"  {finding}")


_UNREADABLE_EXIT = 3
"""The exit status when the plan was shown or written but some files could not be read."""


def _print_unread(plan: MigrationPlan) -> None:
    if plan.symlinks:
        click.echo(f"symlinks left alone ({len(plan.symlinks)}): osmosis migrate never follows them")
        for finding in plan.symlinks:
            click.echo(f"  {finding.path}: {finding.subject}")
    if plan.unreadable:
        click.echo(f"could not read ({len(plan.unreadable)}), each with why; not migrated:")
        for finding in plan.unreadable:
            click.echo(f"  {finding}")


def _exit_if_unread(plan: MigrationPlan) -> None:
    if plan.unreadable:
        click.echo(
            f"osmosis migrate: {len(plan.unreadable)} file(s) could not be read (listed above): migrate them by hand",
            err=True,
        )
        raise click.exceptions.Exit(_UNREADABLE_EXIT)
