"""The base of the migration's rules: a libcst codemod that plans its changes on the shared facts.

Every rule is a :class:`~libcst.codemod.CodemodCommand`; it reads the file's
:class:`~osmosis_migrate.codemods.facts.Facts` (the nodes of the one walk, instead of walking the
tree again: a ``VisitorBasedCodemodCommand``'s matcher set-up alone costs about 10 ms per file and
rule) and writes its part of the :class:`~osmosis_migrate.codemods.plan.Plan`, both found in the
``CodemodContext`` it is built with.
By default a rule runs only in a file that imports osmosis-ai (:meth:`MigrationRule.applies`); it returns the
tree as it got it: the last codemod, :class:`~osmosis_migrate.codemods.apply.ApplyPlan`, changes it.

>>> from osmosis_migrate.codemod import migrate_module
>>> [str(f) for f in migrate_module("x.py", "import osmosis_ai.rollout as r\\ny = r.X\\n").unmapped]
["x.py:2: X: not offered, because ..."]
"""

from __future__ import annotations

from abc import abstractmethod

import libcst as cst
from libcst.codemod import CodemodCommand, CodemodContext

from osmosis_migrate.codemods.facts import Position, facts_of
from osmosis_migrate.codemods.plan import plan_of
from osmosis_migrate.names import NotOffered, resolve_name

__all__ = ["MigrationRule"]


class MigrationRule(CodemodCommand):
    """One rule of the migration: :meth:`plan_changes` records what it rewrites and reports."""

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.facts = facts_of(context)
        self.plan = plan_of(context)

    def applies(self) -> bool:
        """Whether the rule has anything to do in this file (by default: the file imports osmosis-ai)."""
        return bool(self.facts.imports)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if self.applies():
            self.plan_changes()
        return tree

    @abstractmethod
    def plan_changes(self) -> None:
        """Record this rule's changes and findings in the plan."""

    # -- findings ---------------------------------------------------------------------------------

    def anchor(self, node: cst.CSTNode | Position) -> Position:
        """Where a finding about ``node`` is reported."""
        if isinstance(node, tuple):
            return node
        if isinstance(node, cst.FunctionDef | cst.ClassDef):
            node = node.name  # ``ast`` places a decorated definition on its ``def`` / ``class`` line
        return self.facts.position(node)

    def note(self, node: cst.CSTNode | Position, subject: str, why: str) -> None:
        """Report a change that matters."""
        self.plan.notes.append((self.anchor(node), subject, why))

    def unmapped(self, node: cst.CSTNode | Position, subject: str, why: str) -> None:
        """Report what could not be migrated (once)."""
        item = (self.anchor(node), subject, why)
        if item not in self.plan.unmapped:
            self.plan.unmapped.append(item)

    # -- changes more than one rule makes ---------------------------------------------------------

    def rename_attribute(self, node: cst.Attribute, module: str) -> None:
        """``module_alias.Name`` -> osmosis's name for it (or report that osmosis does not offer it)."""
        result = resolve_name(module, node.attr.value)
        if isinstance(result, NotOffered):
            self.unmapped(node, node.attr.value, "not offered, because " + result.why)
            return
        self.plan.distributions.add(result.distribution)
        if result.name != node.attr.value:
            self.plan.renamed_attributes.add(node)
            new = result.name
            self.plan.change(node, lambda _o, updated: updated.with_changes(attr=updated.attr.with_changes(value=new)))
