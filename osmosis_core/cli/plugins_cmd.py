"""``osmosis plugins``: what is installed, what each plugin registers, and what failed to load."""

from __future__ import annotations

import json

import click

__all__ = ["plugins"]


@click.command(short_help="List the installed plugins and what each provides.")
@click.option("json_", "--json", is_flag=True, help="Print JSON (a list of plugin records) instead of a table.")
def plugins(json_: bool) -> None:
    """List plugins: name, distribution, version, status, what each provides, and any error.

    A plugin that fails to import, or whose register hook raises or returns something malformed,
    is listed as failed with the reason, and contributes nothing.

    \b
    Examples:
      osmosis plugins
      osmosis plugins --json
      OSMOSIS_DISABLE_PLUGINS=harbor osmosis plugins
    """
    from osmosis_core._engine.registry import get_registry

    registry = get_registry()
    records = [p.to_json() for p in registry.plugins]
    if json_:
        click.echo(json.dumps(records, indent=2))
        return
    rows = [("NAME", "DISTRIBUTION", "VERSION", "STATUS", "PROVIDES")]
    for p in registry.plugins:
        provides = "; ".join(f"{kind} {', '.join(names)}" for kind, names in sorted(p.provides.items())) or "-"
        rows.append((p.name, p.distribution, p.version or "-", p.status, provides))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        click.echo("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])
    for p in registry.plugins:
        if p.error:
            click.echo(f"{p.name}: {p.error}", err=True)
    for line in registry.conflicts():
        click.echo(f"conflict: {line}", err=True)
