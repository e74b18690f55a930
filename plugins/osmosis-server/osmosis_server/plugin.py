"""The osmosis plugin of osmosis-server (entry point ``server``): the ``osmosis serve`` command.

It stays light: the command's module imports Starlette and uvicorn only when it runs, so
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
    from osmosis_server.serve_cmd import serve

    cli.add_command(serve)
