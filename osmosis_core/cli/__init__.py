"""The ``osmosis`` command line (click). Every command module keeps its heavy imports inside the
command, so ``osmosis --help`` and ``osmosis plugins`` start fast.

Expected errors print one clear line (exit 1); usage errors exit 2; ``--debug`` or
``OSMOSIS_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from osmosis_core import __version__

__all__ = ["OsmosisGroup", "main", "make_cli"]

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def _debug(ctx: click.Context | None) -> bool:
    if os.environ.get("OSMOSIS_DEBUG", "").lower() in ("1", "true", "yes"):
        return True
    root = ctx.find_root() if ctx is not None else None
    return bool(root is not None and isinstance(root.obj, dict) and root.obj.get("debug"))


class OsmosisGroup(click.Group):
    """A group that turns the SDK's errors into one-line messages (exit 1)."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        """click's lookup; a command a first-party plugin would bring says what to install."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError:
            from osmosis_core._engine.registry import first_party_hint

            hint = first_party_hint("command", args[0]) if args else None
            if hint is None:
                raise
            raise click.UsageError(f"`osmosis {args[0]}` comes with {hint}: pip install {hint}", ctx) from None

    def invoke(self, ctx: click.Context) -> Any:
        from osmosis_core.errors import OsmosisError

        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            raise click.exceptions.Exit(130) from None
        except Exception as exc:
            if _debug(ctx):
                raise
            # a task group wraps what one task raised: report that exception, not the group
            error: BaseException = exc
            while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
                error = error.exceptions[0]
            if isinstance(error, OsmosisError):
                raise click.ClickException(str(error)) from None
            raise click.ClickException(
                f"{type(error).__name__}: {error} (rerun with --debug for the traceback)"
            ) from None


@click.group(cls=OsmosisGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "-V", "--version", prog_name="osmosis")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors [env: OSMOSIS_DEBUG=1].")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Agent rollouts for RL post-training.

    Write an AgentWorkflow and a Grader once, then run them over a dataset against any
    OpenAI-compatible endpoint.

    \b
    Start here:
      osmosis template apply multiply-plain demo
      cd demo && osmosis run configs/eval/multiply-plain.toml --stub-policy
    """
    ctx.obj = {"debug": debug}


def make_cli() -> click.Group:
    """The root group with the core's commands and every plugin's (what ``main`` runs)."""
    from osmosis_core.cli.plugins_cmd import plugins
    from osmosis_core.cli.run_cmd import run
    from osmosis_core.cli.template_cmd import template
    from osmosis_core.cli.validate_cmd import validate

    for command in (run, validate, plugins, template):
        cli.add_command(command)
    if len(sys.argv) > 1 and sys.argv[1] in ("-V", "--version"):
        return cli
    from osmosis_core._engine.registry import get_registry

    get_registry().add_commands(cli)
    return cli


def main() -> None:
    """The console script; an output closed early does not stop it (see :mod:`osmosis_core.cli.output`)."""
    import warnings

    from osmosis_core.cli import common
    from osmosis_core.cli.output import survive_closed_output
    from osmosis_core.deprecation import OsmosisDeprecationWarning

    common.CONSOLE_SCRIPT = True
    survive_closed_output()
    # a plugin or rollout that uses a deprecated osmosis name hears of it once, on stderr
    warnings.filterwarnings("default", category=OsmosisDeprecationWarning)
    try:
        make_cli().main(prog_name="osmosis")
    finally:
        # the command is over and its status decided: a SIGINT / SIGTERM now has nothing to stop, and the
        # interpreter's shutdown puts Python-level handlers back to the default (which would kill the
        # process: a complete run exiting -15 instead of 0), so the exit ignores them
        import signal

        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
