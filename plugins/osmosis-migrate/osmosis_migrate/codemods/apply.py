"""The last codemod: applies what the rules planned, in one ``CSTTransformer`` pass over the tree.

The changes are keyed by the nodes of the original tree; the pass enters only the nodes on the way
to a change (the rest of the tree is kept as it is, without being walked), and rebuilds the
statement lists that lose, gain or replace statements: a removed line's comments and blank lines
stay above whatever comes next. ``Module.code`` then prints the result, so every byte the migration
does not touch is kept.

>>> from osmosis_migrate.codemod import migrate_module
>>> text = "# kept\\nfrom osmosis_ai.rollout.server import create_rollout_server\\n"
>>> text += "def main():\\n    create_rollout_server()\\n"
>>> print(migrate_module("x.py", text).new_text, end="")
# kept
def main():
    from osmosis_server import create_app
<BLANKLINE>
    create_app()
"""

from __future__ import annotations

from typing import Any

import libcst as cst
from libcst.codemod import Codemod, CodemodContext

from osmosis_migrate.codemods.facts import facts_of
from osmosis_migrate.codemods.plan import plan_of
from osmosis_migrate.codemods.syntax import leading, with_leading

__all__ = ["ApplyPlan"]


class ApplyPlan(Codemod, cst.CSTTransformer):
    """Applies the plan in the context to the original tree (returned as it is when nothing changes):
    a codemod that is its own ``CSTTransformer`` (libcst's ``ContextAwareTransformer`` without the
    matcher-decorator set-up it does not use)."""

    def __init__(self, context: CodemodContext) -> None:
        Codemod.__init__(self, context)
        self.facts = facts_of(context)
        self.plan = plan_of(context)
        self.paths: set[cst.CSTNode] = set()
        for node in [*self.plan.changes, *self.plan.dropped, *self.plan.expanded, *self.plan.inserts]:
            current: cst.CSTNode | None = node
            while current is not None and current not in self.paths:
                self.paths.add(current)
                current = self.facts.parents.get(current)
        self.paths.add(self.facts.module)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        return tree.visit(self) if self.plan.changed else tree

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.paths

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        result: Any = updated_node
        for change in self.plan.changes.get(original_node, ()):
            result = change(original_node, result)
        if isinstance(original_node, cst.Module | cst.IndentedBlock):
            result = self._rebuild_body(original_node, result)
        return result

    def _rebuild_body(self, original: cst.Module | cst.IndentedBlock, updated: Any) -> Any:
        """The block's statements with the planned removals, expansions and insertions."""
        if not isinstance(updated, cst.Module | cst.IndentedBlock):
            return updated
        body: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        for before, after in zip(original.body, updated.body, strict=True):
            if before in self.plan.dropped:
                carried += leading(after)
                continue
            insert = self.plan.inserts.get(before)
            lines = [*carried, *leading(after)]
            statements = list(self.plan.expanded.get(before, [with_leading(after, [])]))
            carried = []
            if insert is not None:
                statements[0] = with_leading(statements[0], insert.lines_above)
                statements = [*insert.statements, *statements]
            statements[0] = with_leading(statements[0], [*lines, *leading(statements[0])])
            body += statements
        if isinstance(updated, cst.Module):
            footer = [*carried, *updated.footer]
            appended = self.plan.appended
            if appended:
                body += [with_leading(appended[0], [*footer, *leading(appended[0])]), *appended[1:]]
                footer = []
            return updated.with_changes(body=body, footer=footer, has_trailing_newline=True)
        if not body:
            body = [cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried)]
            carried = []
        return updated.with_changes(body=body, footer=[*carried, *updated.footer])
