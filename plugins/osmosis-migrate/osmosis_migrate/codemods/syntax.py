"""Reading libcst nodes: the small questions every rule asks of the tree (no state, no migration).

>>> import libcst as cst
>>> dotted(cst.parse_expression("osmosis_ai.rollout.AgentWorkflow"))
'osmosis_ai.rollout.AgentWorkflow'
>>> string_value(cst.parse_expression("'a' 'b'")), is_none(cst.parse_expression("None"))
('ab', True)
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import TypeGuard, cast

import libcst as cst
import libcst.matchers as m

from osmosis_migrate.names import is_reference_module

__all__ = [
    "Import",
    "alias_local",
    "asname",
    "dotted",
    "imports_reference",
    "is_docstring_statement",
    "is_none",
    "keyword",
    "keywords",
    "leading",
    "positional",
    "small_statements",
    "split_lines",
    "string_value",
    "with_leading",
]

Import = cst.Import | cst.ImportFrom


def dotted(node: cst.CSTNode | None) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name):
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


def string_value(node: cst.CSTNode | None) -> str | None:
    """The value of a string literal (plain or implicitly concatenated), else None."""
    if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def is_none(node: cst.CSTNode | None) -> bool:
    """The literal ``None``."""
    return node is not None and m.matches(node, m.Name("None"))


def keyword(arg: cst.Arg) -> str | None:
    """The keyword of an argument (None for a positional or ``*`` / ``**`` one)."""
    return arg.keyword.value if arg.keyword is not None else None


def keywords(call: cst.Call) -> list[cst.Arg]:
    """The keyword arguments of a call (``**kwargs`` too, as ``ast`` lists them)."""
    return [a for a in call.args if a.keyword is not None or a.star == "**"]


def positional(call: cst.Call) -> list[cst.Arg]:
    """The positional arguments of a call (``*args`` too)."""
    return [a for a in call.args if a.keyword is None and a.star != "**"]


def alias_local(alias: cst.ImportAlias) -> str:
    """The name an import alias binds (``a`` for ``import a.b``)."""
    return asname(alias) or (dotted(alias.name) or "").split(".")[0]


def asname(alias: cst.ImportAlias) -> str | None:
    """The ``as`` name of an import alias, if any."""
    return alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else None


def leading(statement: cst.BaseStatement) -> list[cst.EmptyLine]:
    """The comment and blank lines above a statement."""
    return list(cast(cst.SimpleStatementLine | cst.BaseCompoundStatement, statement).leading_lines)


def with_leading(statement: cst.BaseStatement, lines: Sequence[cst.EmptyLine]) -> cst.BaseStatement:
    """``statement`` with ``lines`` above it instead of its own."""
    return statement.with_changes(leading_lines=list(lines))


def small_statements(
    body: Sequence[cst.BaseStatement | cst.BaseSmallStatement],
) -> Iterator[cst.BaseStatement | cst.BaseSmallStatement]:
    """The statements of a body (a module's, a class's), each small statement of a line on its own."""
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            yield from statement.body
        else:
            yield statement


def imports_reference(node: cst.CSTNode) -> TypeGuard[Import]:
    """An import statement of osmosis-ai (``from osmosis_ai... import`` or ``import osmosis_ai...``)."""
    if isinstance(node, cst.ImportFrom):
        return not node.relative and is_reference_module(dotted(node.module) or "")
    return isinstance(node, cst.Import) and any(is_reference_module(dotted(a.name) or "") for a in node.names)


def is_docstring_statement(statement: cst.BaseStatement) -> bool:
    """A line that is a string expression (a docstring when it comes first)."""
    return m.matches(
        statement,
        m.SimpleStatementLine(body=[m.Expr(m.MatchIfTrue(lambda v: string_value(v) is not None)), m.ZeroOrMore()]),
    )


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` as Python counts them (``str.splitlines`` also splits at form feeds and
    other separators the parser does not count)."""
    return _LINE.findall(text)


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
