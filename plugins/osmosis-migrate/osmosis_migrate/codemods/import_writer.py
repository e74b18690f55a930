"""Writing a rewritten import statement so its comments and layout survive (used by the imports rule).

libcst's ``AddImportsVisitor`` / ``RemoveImportsVisitor`` add and remove names but neither keeps a
multi-line import's comments by the names they follow, nor splits one statement into several in
place; this writer does: one statement per target module, where the old one was, each name keeping
its comment, the old statement's indentation and trailing comment kept.

>>> g = Group("from", "osmosis_core")
>>> g.add("RolloutSample", "# the sample", [])
>>> g.items, g.comments
(['RolloutSample'], {0: '# the sample'})
"""

from __future__ import annotations

import io
import tokenize
from typing import Any

import attrs
import libcst as cst

from osmosis_migrate.codemods.facts import Facts
from osmosis_migrate.codemods.plan import Plan
from osmosis_migrate.codemods.syntax import Import
from osmosis_migrate.records import LEFTOVER_MARK

__all__ = ["Group", "import_comments", "write_statement"]


@attrs.define
class Group:
    """One import statement to write: ``from module import items`` or ``import items``."""

    kind: str
    module: str
    items: list[str] = attrs.field(factory=list)
    comments: dict[int, str] = attrs.field(factory=dict)
    before: dict[int, list[str]] = attrs.field(factory=dict)
    leftover: bool = False

    def add(self, item: str, comment: str | None, before: list[str]) -> None:
        """Add ``item`` (once), with the comment after it and the comment lines before it."""
        if item in self.items:
            return
        if comment:
            self.comments[len(self.items)] = comment
        if before:
            self.before[len(self.items)] = before
        self.items.append(item)


def import_comments(facts: Facts, node: Import) -> tuple[dict[int, str], dict[int, list[str]], list[str]]:
    """Comments inside a multi-line import: after an alias, on lines before one, or elsewhere."""
    after: dict[int, str] = {}
    before: dict[int, list[str]] = {}
    other: list[str] = []
    where = facts.positions[node]
    if where.end.line == where.start.line or isinstance(node.names, cst.ImportStar):
        return after, before, other
    ends = [facts.positions[a.asname.name if a.asname else a.name].end.line for a in node.names]
    starts = [facts.positions[a].start.line for a in node.names]
    lines = facts.lines[where.start.line - 1 : where.end.line]
    try:
        code = lines[0][where.start.column :] + "".join(lines[1:])
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return after, before, other
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        line = where.start.line + tok.start[0] - 1
        index = next((i for i, end in enumerate(ends) if end == line), None)
        if index is not None:
            after[index] = tok.string
            continue
        following = next((i for i, start in enumerate(starts) if start > line), None)
        if following is not None and line != where.start.line:
            before.setdefault(following, []).append(tok.string)
        else:
            other.append(tok.string)
    return after, before, other


def write_statement(facts: Facts, plan: Plan, node: Import, groups: list[Group]) -> None:
    """Plan ``node``'s replacement by ``groups`` (its removal when there are none)."""
    line = facts.parents.get(node)
    assert isinstance(line, cst.SimpleStatementLine | cst.SimpleStatementSuite)
    own_line = facts.alone(node)
    if not groups:
        if own_line:
            plan.dropped.add(line)
        elif len(line.body) == 1:
            plan.change(node, lambda _o, _u: cst.Pass())
        else:
            plan.change(node, lambda _o, _u: cst.RemoveFromParent())
            _keep_semicolons(plan, line)
        return
    start = facts.positions[node].start
    indent = facts.lines[start.line - 1][: start.column]
    multiline = facts.positions[node].end.line != start.line
    names = node.names
    if multiline and not isinstance(names, cst.ImportStar):
        first = facts.positions[names[0]].start.line
        text = facts.lines[first - 1]
        item_indent = text[: len(text) - len(text.lstrip(" \t"))]
        item_indent = item_indent[len(indent) :] if item_indent.startswith(indent) else item_indent
    else:
        item_indent = "    "
    # the comments no alias holds go on a multi-line from-import's first line (tokenized only for one)
    other = import_comments(facts, node)[2] if multiline and own_line else []
    texts = []
    for position, group in enumerate(groups):
        head = f"from {group.module} import " if group.kind == "from" else "import "
        mark = f"  {LEFTOVER_MARK}" if group.leftover and own_line else ""
        if multiline and group.kind == "from" and own_line:
            extra = "".join(f"  {c}" for c in other) if position == 0 else ""
            body: list[str] = []
            for i, item in enumerate(group.items):
                body.extend(f"{item_indent}{c}\n" for c in group.before.get(i, []))
                comment = f"  {group.comments[i]}" if i in group.comments else ""
                body.append(f"{item_indent}{item},{comment}\n")
            texts.append(f"{head}({mark}{extra}\n{''.join(body)})")
        else:
            comments = [group.comments[i] for i in sorted(group.comments)] if own_line else []
            tail = "".join(f"  {c}" for c in comments) if comments and not mark else ""
            texts.append(f"{head}{', '.join(group.items)}{mark}{tail}")
    if own_line:
        assert isinstance(line, cst.SimpleStatementLine)
        trailing = line.trailing_whitespace
        end = trailing.whitespace.value + (trailing.comment.value if trailing.comment else "")
        plan.expanded[line] = list(cst.parse_module("\n".join(texts) + end + "\n").body)
        return
    replacement = cst.parse_statement("; ".join(texts) + "\n")
    assert isinstance(replacement, cst.SimpleStatementLine)
    plan.change(node, lambda _o, _u: cst.FlattenSentinel(replacement.body))
    _keep_semicolons(plan, line)


def _keep_semicolons(plan: Plan, line: cst.SimpleStatementLine | cst.SimpleStatementSuite) -> None:
    """After a statement of a ``a; b`` line is removed or split: ``;`` between them, none added at the end."""
    last = line.body[-1].semicolon

    def fix(_original: cst.CSTNode, updated: Any) -> Any:
        body = list(updated.body)
        body[-1] = body[-1].with_changes(semicolon=last)
        body[:-1] = [
            s
            if isinstance(s.semicolon, cst.Semicolon)
            else s.with_changes(
                semicolon=cst.Semicolon(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" ")
                )
            )
            for s in body[:-1]
        ]
        return updated.with_changes(body=body)

    plan.change(line, fix)  # idempotent: twice for a line holding two imports is the same
