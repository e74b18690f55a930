"""The libcst migration behind :func:`osmosis_migrate.python_source.migrate_python`: the driver.

The module is parsed once into libcst's concrete syntax tree; the codemods of
:mod:`osmosis_migrate.codemods` run in order with one ``CodemodContext`` that carries the file's
facts and the plan, and ``Module.code`` prints the result, so every byte the migration does not
touch is kept. The findings' lines are then mapped from the old text to the new one.

This module imports libcst: import it only when a file is migrated.

>>> print(migrate_module("x.py", "import osmosis_ai.rollout as r\\ny = r.AgentWorkflowOutput\\n").new_text, end="")
import osmosis_core as r
y = r.RolloutSample
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.metadata import MetadataWrapper

from osmosis_migrate.codemods import gather_codemods
from osmosis_migrate.codemods.facts import Facts
from osmosis_migrate.codemods.plan import Item, Plan
from osmosis_migrate.codemods.syntax import split_lines
from osmosis_migrate.records import Finding, PythonAnalysis, PythonMigration

__all__ = ["migrate_module"]


def migrate_module(rel: str, text: str, *, entrypoint: bool = False, decorate_configs: bool = True) -> PythonMigration:
    """Migrate one file's text (see :func:`osmosis_migrate.python_source.migrate_python`)."""
    references = "osmosis_ai" in text
    try:
        ast.parse(text)  # what Python compiles: libcst also parses some files Python refuses (a bad \N{...})
        module = cst.parse_module(text)
    except (SyntaxError, ValueError, cst.ParserSyntaxError) as exc:
        problem = _syntax_error(rel, exc)
        return PythonMigration(text, [], [problem] if references else [], PythonAnalysis(), references)
    context = CodemodContext(filename=rel, wrapper=MetadataWrapper(module, unsafe_skip_copy=True))
    facts = Facts.read(context, text, entrypoint=entrypoint, decorate_configs=decorate_configs)
    plan = Plan.start(context)
    tree = facts.module
    for codemod in gather_codemods():  # not transform_module: it copies the tree, and the plan is keyed by its nodes
        tree = codemod(context).transform_module_impl(tree)
    new_text = tree.code if plan.changed else text
    line_of = _line_map(facts.lines, split_lines(new_text)) if plan.changed else _same_line

    def finding(item: Item) -> Finding:
        (line, _column), subject, why = item
        return Finding(rel, line_of(line), subject, why)

    return PythonMigration(
        new_text=new_text,
        notes=[finding(n) for n in sorted(plan.notes)],
        unmapped=[finding(u) for u in sorted(plan.unmapped)],
        analysis=PythonAnalysis(frozenset(plan.config_fields), plan.backend, frozenset(plan.distributions)),
        references=bool(facts.imports) or references,
    )


def _syntax_error(rel: str, exc: SyntaxError | ValueError | cst.ParserSyntaxError) -> Finding:
    """The finding for a file that does not parse, worded as Python's own parser words it."""
    if isinstance(exc, cst.ParserSyntaxError):
        line, message = exc.raw_line, exc.message
    elif isinstance(exc, SyntaxError):
        line, message = exc.lineno or 1, exc.msg
    else:  # a NUL byte
        line, message = 1, str(exc)
    return Finding(rel, line, "syntax error", f"cannot parse ({message}); fix it and migrate again")


def _same_line(line: int) -> int:
    """An unchanged file's line map."""
    return line


def _line_map(old: list[str], new: list[str]) -> Callable[[int], int]:
    """Where a line of the old text is in the new one: an unchanged line where it went; a line the
    migration rewrote or removed, where what replaced it (or what follows it) begins."""
    spans = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    last = max(len(new), 1)

    def line_of(line: int) -> int:
        index = line - 1
        for tag, i1, i2, j1, j2 in spans if index < len(old) else ():
            if not i1 <= index < i2:
                continue
            if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
                return min(j1 + index - i1 + 1, last)
            return min(j1 + 1, last)
        return last

    return line_of
