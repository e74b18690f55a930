"""The core's own plugin: the ``local`` backend and the ``multiply-plain`` template.

Built-ins register through the same hooks as every external plugin.
"""

from __future__ import annotations

from osmosis_core.backend import BackendSetup, BackendSpec, ExecutionBackend
from osmosis_core.hookspecs import hookimpl
from osmosis_core.templates import GUIDES_ROOT, TemplateSpec, examples_root

__all__ = ["local_backend", "osmosis_register_backends", "osmosis_register_templates"]


def local_backend(setup: BackendSetup) -> ExecutionBackend:
    """The factory of the ``local`` backend. It takes no ``[backend.local]`` settings: ``setup.limits``
    (``[run] concurrency``) are its limits, and ``[run] workers`` > 1 runs it in a
    :class:`~osmosis_core._engine.workers.WorkerPool` of that many processes (a mode of ``local``,
    not a backend of its own: ``--workers`` chooses it with any config)."""
    if setup.workers > 1:
        from osmosis_core._engine.workers import WorkerPool

        return WorkerPool._of(setup)
    from osmosis_core.local import LocalBackend

    return LocalBackend._of(setup)


@hookimpl
def osmosis_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            "local",
            "osmosis_core._engine.builtin:local_backend",
            description="In-process on this machine's event loop (the default).",
        )
    ]


@hookimpl
def osmosis_register_templates() -> list[TemplateSpec]:
    return [
        TemplateSpec(
            "multiply-plain",
            examples_root(),
            description="A tool-calling multiply agent in plain Python (chat_completion), no agent framework.",
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
