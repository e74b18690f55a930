"""Rule: rename where used the names osmosis renamed (``AgentWorkflowOutput`` -> ``RolloutSample``).

The uses are those libcst's scope analysis resolves to the import, for the renames the facts plan
(:attr:`~osmosis_migrate.codemods.facts.Facts.renames`: a rebound name, one named in a string, or a
new name already taken keeps its old name, imported under it); ``alias.Name`` through a module alias
(``import osmosis_ai.rollout as r``) is renamed too, or reported when osmosis does not offer it.

>>> from osmosis_migrate.codemod import migrate_module
>>> text = "from osmosis_ai.rollout import AgentWorkflowOutput\\nx: AgentWorkflowOutput\\n"
>>> print(migrate_module("x.py", text).new_text, end="")
from osmosis_core import RolloutSample
x: RolloutSample
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from osmosis_migrate.codemods.base import MigrationRule
from osmosis_migrate.codemods.plan import rename

__all__ = ["RenameNames"]


class RenameNames(MigrationRule):
    """Renames the uses of each planned rename (noted once, on its import) and the attributes read
    through a module alias."""

    DESCRIPTION = "Rename where used the names osmosis renamed."

    def plan_changes(self) -> None:
        facts = self.facts
        for old, new in facts.renames.items():
            binding = facts.bindings[old]
            if old in self.plan.removed:
                continue
            for use in facts.uses(old, at=binding.statement):
                self.plan.change(use, rename(new))
            self.note(
                facts.position(binding.statement), f"{old} -> {new}", "renamed where used (osmosis's name for it)"
            )
        through_alias = m.Attribute(value=m.Name(m.MatchIfTrue(lambda name: name in facts.module_aliases)))
        for node in facts.nodes:
            if isinstance(node, cst.Attribute) and m.matches(node, through_alias):
                assert isinstance(node.value, cst.Name)
                self.rename_attribute(node, facts.module_aliases[node.value.value])
