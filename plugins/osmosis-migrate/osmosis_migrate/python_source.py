"""Rewriting one Python file written for osmosis-ai so it runs on osmosis.

The rewrite is a libcst transformation (:mod:`osmosis_migrate.codemod`, imported only when a file is
migrated, so ``osmosis --help`` never loads libcst): libcst's concrete syntax tree keeps every
comment, blank line and odd spacing, so only what is migrated changes. What it does:

* imports from ``osmosis_ai.rollout`` (and its integration, Harbor, server and client modules) go to
  ``osmosis_core``, ``osmosis_strands``, ``osmosis_openai_agents``, ``osmosis_harbor`` and
  ``osmosis_server``; renamed names (``AgentWorkflowOutput`` -> ``RolloutSample``, ...) are renamed
  where they are used (the uses libcst's scope analysis resolves to the import), or imported under
  their old name when renaming is not safe;
* a name osmosis does not offer stays imported from its old module, marked, and is reported with
  its file:line and why;
* ``session=OsmosisMemorySession()`` is dropped (osmosis's model registers the sample);
* ``get_rollout_context().chat_completions_url`` / ``.api_key`` become ``.policy.base_url`` /
  ``.policy.api_key``;
* config classes written the pydantic way (``class C(AgentWorkflowConfig): x: int = 1``) get
  ``@attrs.define(kw_only=True)``, since osmosis's configs are attrs classes;
* a server script's ``uvicorn`` and ``osmosis_server`` imports move into the function that serves,
  so ``osmosis run`` can import the file without the server plugin;
* in an entrypoint, the configs given to ``LocalBackend`` / ``HarborBackend`` are exposed as the
  module-level ``workflow_config`` / ``grader_config`` that ``osmosis run`` reads.

>>> m = migrate_python("main.py", "from osmosis_ai.rollout import AgentWorkflowOutput\\nx = AgentWorkflowOutput\\n")
>>> print(m.new_text, end="")
from osmosis_core import RolloutSample
x = RolloutSample
"""

from __future__ import annotations

from typing import Any

import attrs

from osmosis_migrate.records import Finding

__all__ = ["LEFTOVER_MARK", "BackendCall", "PythonAnalysis", "PythonMigration", "migrate_python"]

LEFTOVER_MARK = "# osmosis migrate: not offered by osmosis (see its MIGRATING.md)"
"""The comment on an import osmosis has no counterpart for (kept so the file fails loudly, not silently)."""


@attrs.frozen
class BackendCall:
    """What an entrypoint's ``LocalBackend(...)`` / ``HarborBackend(...)`` call tells a run config."""

    kind: str
    """``local`` or ``harbor``."""
    line: int
    workflow: str | None = None
    grader: str | None = None
    """A class name or import path; ``"none"`` when the backend was built without a grader."""
    harbor: dict[str, Any] = attrs.field(factory=dict)
    """``[backend.harbor]`` keys read from the call (``task_dir`` relative to the rollout folder)."""


@attrs.frozen
class PythonAnalysis:
    """Facts about a file that the config and dependency migrations use."""

    workflow_config_fields: frozenset[str] = frozenset()
    """Fields of the workflow config classes the file defines (for ``[sampling]``)."""
    backend: BackendCall | None = None
    distributions: frozenset[str] = frozenset()
    """osmosis distributions the migrated imports need."""


@attrs.define
class PythonMigration:
    """The migrated text and what to tell the user about it."""

    new_text: str
    notes: list[Finding]
    unmapped: list[Finding]
    analysis: PythonAnalysis
    references: bool
    """The file imports osmosis-ai."""


def migrate_python(rel: str, text: str, *, entrypoint: bool = False, decorate_configs: bool = True) -> PythonMigration:
    """Migrate one file's text. ``rel`` names it in findings; ``entrypoint`` marks a rollout's main module.

    ``decorate_configs`` adds ``@attrs.define`` to config subclasses (needed unless osmosis's config
    bases turn subclasses into attrs classes themselves).
    """
    from osmosis_migrate.codemod import migrate_module

    return migrate_module(rel, text, entrypoint=entrypoint, decorate_configs=decorate_configs)
