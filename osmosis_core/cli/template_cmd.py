"""``osmosis template list|apply``: starter templates that plugins (and the core) register."""

from __future__ import annotations

import json
from pathlib import Path

import click

__all__ = ["template"]


@click.group(short_help="List the starter templates, or copy one into a folder.")
def template() -> None:
    """Starter templates: list them, or copy one into a folder.

    \b
    Examples:
      osmosis template list
      osmosis template apply multiply-plain my-workspace
    """


@template.command("list", short_help="List the templates the installed plugins provide.")
@click.option("json_", "--json", is_flag=True, help="Print JSON instead of a table.")
def list_templates(json_: bool) -> None:
    """List the templates the installed plugins provide.

    \b
    Example:
      osmosis template list --json
    """
    from osmosis_core._engine.registry import get_registry

    specs = get_registry().templates()
    if json_:
        records = [{"name": s.name, "description": s.description, "next_steps": s.next_steps} for s in specs]
        click.echo(json.dumps(records, indent=2))
        return
    width = max((len(s.name) for s in specs), default=4)
    for s in specs:
        click.echo(f"{s.name.ljust(width)}  {s.description}")


@template.command("apply", short_help="Copy a template into a folder.")
@click.argument("name")
@click.argument("directory", required=False, default=".", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite files that already exist.")
def apply(name: str, directory: Path, force: bool) -> None:
    """Copy template NAME into DIRECTORY (default: the current folder).

    Nothing is overwritten without --force, and nothing is written outside DIRECTORY.

    \b
    Examples:
      osmosis template apply multiply-plain
      osmosis template apply multiply-plain demo && cd demo
      osmosis run configs/eval/multiply-plain.toml --stub-policy
    """
    from osmosis_core._engine.registry import get_registry
    from osmosis_core.templates import apply_template

    spec = get_registry().template(name)
    written = apply_template(spec, directory, force=force)
    click.echo(f"applied template {spec.name!r} to {directory}: {len(written)} file(s)")
    for rel in written:
        click.echo(f"  {rel.as_posix()}")
    if spec.next_steps:
        click.echo("next:")
        prefix = f"cd {directory} && " if str(directory) != "." else ""
        for step in spec.next_steps.splitlines():
            click.echo(f"  {prefix}{step}")
