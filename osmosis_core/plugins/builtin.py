"""The core's own plugin: the ``local`` backend and the ``multiply-plain`` template.

Built-ins register through the same hooks as every external plugin.
"""

from __future__ import annotations

from osmosis_core.backend import BackendSpec
from osmosis_core.plugins.hookspecs import hookimpl
from osmosis_core.templates import GUIDES_ROOT, TemplateSpec, examples_root

__all__ = ["osmosis_register_backends", "osmosis_register_templates"]


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
