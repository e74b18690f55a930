"""The osmosis plugin of osmosis-harbor (entry point ``harbor``): the ``harbor`` backend, a template,
and the ``osmosis harbor`` command (task images: ``build``, ``cache``).

It stays light: nothing here imports Harbor (or litellm, which takes seconds to import), so
``osmosis --help`` and ``osmosis plugins`` stay fast; Harbor is imported when the backend is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from osmosis_core.plugin import BackendSpec, TemplateSpec, hookimpl
from osmosis_core.templates import multiply_template

if TYPE_CHECKING:
    import click

__all__ = [
    "TEMPLATE_NAME",
    "TEMPLATE_ROOT",
    "osmosis_register_backends",
    "osmosis_register_commands",
    "osmosis_register_templates",
]

TEMPLATE_NAME = "multiply-harbor-strands"
TEMPLATE_ROOT = Path(__file__).resolve().parent / "template"
"""The template's files (rollout code, a Harbor task folder, configs, data), shipped inside the package."""


@hookimpl
def osmosis_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            "harbor",
            "osmosis_harbor.backend:HarborBackend.from_setup",
            config_type="osmosis_harbor.config:HarborBackendConfig",
            description="Each rollout in its own Harbor trial (bubblewrap sandbox, or docker/podman/daytona).",
        )
    ]


@hookimpl
def osmosis_register_templates() -> list[TemplateSpec]:
    return [
        multiply_template(
            TEMPLATE_NAME,
            TEMPLATE_ROOT,
            "A Strands multiply agent, each rollout in an isolated Harbor trial (no Docker needed).",
        )
    ]


@hookimpl
def osmosis_register_commands(cli: click.Group) -> None:
    from osmosis_harbor.harbor_cmd import harbor

    cli.add_command(harbor)
