"""Hook specifications of osmosis (pluggy project ``osmosis``, entry-point group ``osmosis``).

A plugin is a module with ``@hookimpl`` functions, named in its distribution's metadata::

    # pyproject.toml of osmosis-echo
    [project.entry-points.osmosis]
    echo = "osmosis_echo.plugin"

Every hook but one is a *register* hook: it returns a list of small records, and the host collects
them, picks by name, and reports a name that two plugins both claim. ``osmosis_run_progress`` is
the one that listens: it hears how a run or a server is going. Keep the plugin module light:
import heavy frameworks inside the registered classes, not at module top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    import click

    from osmosis_core._engine.results import RunProgress
    from osmosis_core.backend import BackendSpec
    from osmosis_core.records import PolicyEndpoint
    from osmosis_core.templates import GraderSpec, TemplateSpec

__all__ = [
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "osmosis_policy_gateway",
    "osmosis_register_backends",
    "osmosis_register_commands",
    "osmosis_register_graders",
    "osmosis_register_templates",
    "osmosis_run_progress",
]

PROJECT_NAME = "osmosis"
"""The pluggy project name and the entry-point group."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marks a hook specification (the core's own use)."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a plugin's hook implementation: ``@hookimpl`` or ``@hookimpl(tryfirst=True)``."""


@hookspec
def osmosis_register_backends() -> Sequence[BackendSpec]:  # type: ignore[empty-body]
    """Register execution backends.

    :return: backend specs; users pick one by name with ``--backend NAME``.

    Example::

        @hookimpl
        def osmosis_register_backends():
            return [BackendSpec("echo", "osmosis_echo.backend:EchoBackend", config_type=None,
                                description="Runs rollouts by echoing the prompt.")]
    """


@hookspec
def osmosis_register_templates() -> Sequence[TemplateSpec]:  # type: ignore[empty-body]
    """Register starter templates for ``osmosis template list`` and ``osmosis template apply``.

    :return: template specs; each names the folder its files are copied from.

    Example::

        @hookimpl
        def osmosis_register_templates():
            root = importlib.resources.files("osmosis_echo") / "template"
            return [TemplateSpec("echo-local", root, description="An echo rollout.")]
    """


@hookspec
def osmosis_register_graders() -> Sequence[GraderSpec]:  # type: ignore[empty-body]
    """Register reusable graders that a run config can name (``grader = "name"``).

    :return: grader specs.

    Example::

        @hookimpl
        def osmosis_register_graders():
            return [GraderSpec("exact-match", "osmosis_graders.exact:ExactMatch",
                               description="1.0 when the final answer equals the label.")]
    """


@hookspec
def osmosis_register_commands(cli: click.Group) -> None:
    """Add click commands to the ``osmosis`` CLI (this is how ``osmosis serve`` arrives).

    :param cli: the root command group.

    Example::

        @hookimpl
        def osmosis_register_commands(cli):
            @cli.command()
            def hello():
                "Say hello."
                click.echo("hello")
    """


@hookspec
def osmosis_run_progress(progress: RunProgress) -> Path | None:
    """Hear how a run (``osmosis run``) or a server (``osmosis serve``) is going: to write a report,
    or send the figures to W&B, MLflow or a dashboard.

    Called in a worker thread, every minute or so while results come in, and once when it ends
    (``progress.final``; ``progress.summary.interrupted`` when it was stopped early). A hook that
    raises is logged once and never fails the run; one that is slow delays only the next call.

    :param progress: the run folder, the summary so far, ``final``, ``kind`` and the run's config.
    :returns: the path of a file the hook wrote (osmosis-report's ``report.html``), or None; the
        summary table at the end of ``osmosis run`` names each one, under the plugin's name.

    Example::

        @hookimpl
        def osmosis_run_progress(progress):
            if progress.final:
                wandb.log({"mean_reward": progress.summary.mean_reward})
    """


@hookspec(firstresult=True)
def osmosis_policy_gateway(upstream: PolicyEndpoint, settings: dict[str, Any], source: str) -> Any:
    """Make the policy gateway of a run with traces on (``osmosis run --traces``, ``[traces]``).

    The first plugin that returns something wins (osmosis-gateway provides it); the result is a
    :class:`osmosis_core.traces.TraceGateway`, not yet started.

    :param upstream: the run's ``[policy]`` endpoint (its key stays in the gateway).
    :param settings: the ``[traces]`` table; check it with ``structure_table(settings, T, "$.traces", source)``.
    :param source: the config file, for error messages.
    """
