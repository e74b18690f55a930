"""The migration's rules as libcst codemods, one module per rule; :func:`gather_codemods` lists them in order.

Each rule is a :class:`~libcst.codemod.CodemodCommand` (:class:`~osmosis_migrate.codemods.base.MigrationRule`)
that reads the file's :class:`~osmosis_migrate.codemods.facts.Facts` and adds to the
:class:`~osmosis_migrate.codemods.plan.Plan`, both carried by the shared ``CodemodContext``; the rules
plan against the original tree, so its scopes and positions stay true while they run. The last
codemod, :class:`ApplyPlan`, applies the plan in one transformer pass.
:func:`osmosis_migrate.codemod.migrate_module` runs them, and only it can: the rules need the facts
and the plan it puts in the context (so libcst's own command line cannot run them alone).

>>> [c.__name__ for c in gather_codemods()][:2]
['RemoveMemorySession', 'RelocateServerImports']
"""

from __future__ import annotations

from libcst.codemod import Codemod

from osmosis_migrate.codemods.apply import ApplyPlan
from osmosis_migrate.codemods.config_classes import DecorateConfigClasses
from osmosis_migrate.codemods.context_attributes import RewriteContextAttributes
from osmosis_migrate.codemods.entrypoint_backend import ReadEntrypointBackend
from osmosis_migrate.codemods.imports import RewriteImports
from osmosis_migrate.codemods.memory_session import RemoveMemorySession
from osmosis_migrate.codemods.renames import RenameNames
from osmosis_migrate.codemods.server_imports import RelocateServerImports
from osmosis_migrate.codemods.usage import CheckUsage

__all__ = ["gather_codemods"]


def gather_codemods() -> list[type[Codemod]]:
    """The codemods in the order they run: a rule may read what an earlier one planned (the import
    rewrite skips the names the memory-session and server-import rules took; the usage check skips
    the attributes already rewritten), and :class:`ApplyPlan` comes last."""
    return [
        RemoveMemorySession,
        RelocateServerImports,
        RewriteImports,
        RenameNames,
        RewriteContextAttributes,
        DecorateConfigClasses,
        CheckUsage,
        ReadEntrypointBackend,
        ApplyPlan,
    ]
