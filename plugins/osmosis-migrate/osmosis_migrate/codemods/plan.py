"""What the rules decide for one file: per node of the original tree, how it changes, and the findings.

The rules plan against the original tree (its scopes and positions stay true while they run) and
:class:`~osmosis_migrate.codemods.apply.ApplyPlan` applies the whole plan in one transformer pass.
The :class:`Plan` travels in the ``CodemodContext`` (``context.scratch``), next to the facts.

>>> from libcst.codemod import CodemodContext
>>> context = CodemodContext()
>>> plan = Plan.start(context)
>>> plan is plan_of(context), plan.changed
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import libcst as cst
from libcst.codemod import CodemodContext

from osmosis_migrate.codemods.facts import Position
from osmosis_migrate.records import BackendCall

__all__ = ["Change", "Insert", "Item", "Plan", "decorate", "plan_of", "rename", "replace_expression"]

Change = Callable[[cst.CSTNode, Any], Any]
"""How one node changes: ``(original, updated) -> replacement``."""

Item = tuple[Position, str, str]
"""A finding before its line is mapped to the new text: (where, subject, why)."""

_SCRATCH_KEY = "osmosis_migrate.plan"


def plan_of(context: CodemodContext) -> Plan:
    """The plan :meth:`Plan.start` left in ``context``."""
    plan = context.scratch[_SCRATCH_KEY]
    assert isinstance(plan, Plan)
    return plan


@attrs.define
class Insert:
    """Statements to put before a statement (after its leading comments), and the lines it keeps above it."""

    statements: list[cst.BaseStatement]
    lines_above: list[cst.EmptyLine]


@attrs.define
class Plan:
    """The changes (keyed by nodes of the original tree), the findings, and what the analysis learned."""

    changes: dict[cst.CSTNode, list[Change]] = attrs.field(factory=dict)
    dropped: set[cst.CSTNode] = attrs.field(factory=set)
    """Statement lines removed (their comments and blank lines stay above what follows)."""
    expanded: dict[cst.CSTNode, list[cst.BaseStatement]] = attrs.field(factory=dict)
    """Statement lines replaced by these statements."""
    inserts: dict[cst.CSTNode, Insert] = attrs.field(factory=dict)
    appended: list[cst.BaseStatement] = attrs.field(factory=list)
    """Statements added at the end of the module."""
    notes: list[Item] = attrs.field(factory=list)
    unmapped: list[Item] = attrs.field(factory=list)
    distributions: set[str] = attrs.field(factory=set)
    removed: set[str] = attrs.field(factory=set)
    """Imported names whose every use was removed (OsmosisMemorySession)."""
    relocated: set[str] = attrs.field(factory=set)
    """Imported names moved into the function that serves."""
    renamed_attributes: set[cst.Attribute] = attrs.field(factory=set)
    config_fields: set[str] = attrs.field(factory=set)
    backend: BackendCall | None = None

    @classmethod
    def start(cls, context: CodemodContext) -> Plan:
        """An empty plan, left in ``context.scratch``."""
        plan = cls()
        context.scratch[_SCRATCH_KEY] = plan
        return plan

    @property
    def changed(self) -> bool:
        """Whether anything changes."""
        return bool(self.changes or self.dropped or self.expanded or self.inserts or self.appended)

    def change(self, node: cst.CSTNode, how: Change) -> None:
        """Change ``node`` (after the changes planned for it before)."""
        self.changes.setdefault(node, []).append(how)


def replace_expression(new: cst.BaseExpression) -> Change:
    """Put ``new`` where an expression was (in its parentheses)."""
    return lambda _original, updated: new.with_changes(lpar=updated.lpar, rpar=updated.rpar)


def rename(new: str) -> Change:
    """Give a name a new value."""
    return lambda _original, updated: updated.with_changes(value=new)


def decorate(decorator: cst.Decorator) -> Change:
    """Give a class its one decorator."""
    return lambda _original, updated: updated.with_changes(decorators=[decorator])
