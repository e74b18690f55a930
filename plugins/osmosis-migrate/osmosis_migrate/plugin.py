"""The osmosis plugin of osmosis-migrate (entry point ``migrate``): the ``osmosis migrate`` command.

It stays light: the command's module imports the migration only when it runs, so
``osmosis --help`` and ``osmosis plugins`` stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_core.plugin import hookimpl

if TYPE_CHECKING:
    import click

__all__ = ["osmosis_register_commands"]


@hookimpl
def osmosis_register_commands(cli: click.Group) -> None:
    from osmosis_migrate.migrate_cmd import migrate

    cli.add_command(migrate)
