"""The core's own plugin: the ``local`` backend and the ``multiply-plain`` template.

Built-ins register through the same hooks as every external plugin.
"""

from __future__ import annotations

from pathlib import Path

from osmosis_core.backend import BackendSpec
from osmosis_core.plugins.hookspecs import hookimpl
from osmosis_core.templates import GUIDES_ROOT, TemplateSpec

__all__ = ["examples_root", "osmosis_register_backends", "osmosis_register_templates"]


def examples_root() -> Path:
    """Where the example rollouts live: inside the installed wheel, else the source checkout."""
    package = Path(__file__).resolve().parent.parent
    shipped = package / "_examples"
    return shipped if shipped.is_dir() else package.parent


@hookimpl
def osmosis_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            "local",
            "osmosis_core.local:LocalBackend.from_setup",
            description="In-process on this machine's event loop (the default).",
        )
    ]


@hookimpl
def osmosis_register_templates() -> list[TemplateSpec]:
    return [
        TemplateSpec(
            "multiply-plain",
            examples_root(),
            description="A tool-calling multiply agent in plain Python (httpx), no agent framework.",
            include=(
                "rollouts/multiply-plain/**",
                "configs/eval/multiply-plain.toml",
                "configs/training/multiply-plain.toml",
            ),
            next_steps="osmosis run configs/eval/multiply-plain.toml --stub-policy",
            layers=(GUIDES_ROOT,),
            variables={"dataset": "rollouts/multiply-plain/data/multiply.jsonl"},
        )
    ]
