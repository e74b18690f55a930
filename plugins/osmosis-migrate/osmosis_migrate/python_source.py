"""Rewriting one Python file written for osmosis-ai so it runs on osmosis.

The rewrite is a set of libcst codemods, one per rule (:mod:`osmosis_migrate.codemods`, run by
:mod:`osmosis_migrate.codemod`, imported only when a file is migrated, so ``osmosis --help`` never
loads libcst): libcst's concrete syntax tree keeps every comment, blank line and odd spacing, so
only what is migrated changes. What it does:

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

from osmosis_migrate.records import LEFTOVER_MARK, BackendCall, PythonAnalysis, PythonMigration

__all__ = ["LEFTOVER_MARK", "BackendCall", "PythonAnalysis", "PythonMigration", "migrate_python"]


def migrate_python(rel: str, text: str, *, entrypoint: bool = False, decorate_configs: bool = True) -> PythonMigration:
    """Migrate one file's text. ``rel`` names it in findings; ``entrypoint`` marks a rollout's main module.

    ``decorate_configs`` adds ``@attrs.define`` to config subclasses (needed unless osmosis's config
    bases turn subclasses into attrs classes themselves).
    """
    from osmosis_migrate.codemod import migrate_module

    return migrate_module(rel, text, entrypoint=entrypoint, decorate_configs=decorate_configs)
