"""Rule: move a server script's ``osmosis_server`` and ``uvicorn`` imports into the function that serves.

A module-level import of the server plugin would make ``osmosis run`` need that plugin to import the
file; when every use of such a name is inside top-level functions, its import moves to the top of
each of them (after the docstring), with ``import uvicorn`` when that is used only there too. A
server import that cannot move is reported.

>>> from osmosis_migrate.codemod import migrate_module
>>> text = "from osmosis_ai.rollout.server import create_rollout_server\\ndef main():\\n    create_rollout_server()\\n"
>>> print(migrate_module("x.py", text).new_text, end="")
def main():
    from osmosis_server import create_app
<BLANKLINE>
    create_app()
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from osmosis_migrate.codemods.base import MigrationRule
from osmosis_migrate.codemods.plan import Insert
from osmosis_migrate.codemods.syntax import alias_local, is_docstring_statement
from osmosis_migrate.names import Target

__all__ = ["RelocateServerImports"]

_SERVER_MODULES = frozenset({"osmosis_server"})
_IMPORT_UVICORN = m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("uvicorn"))])])


class RelocateServerImports(MigrationRule):
    """Moves module-level server imports into the top-level functions that use them (sorted, plain
    imports first), notes each function, and reports the server imports it cannot move."""

    DESCRIPTION = "Move osmosis_server / uvicorn imports into the function that serves."

    def _top_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        found = self.facts.enclosing_function(node, outermost=True)
        return found if found is not None and self.facts.parents.get(found) is self.facts.module else None

    def _relocatable(self, name: str) -> list[cst.FunctionDef] | None:
        functions: list[cst.FunctionDef] = []
        for use in self.facts.uses(name):
            function = self._top_function(use)
            if function is None or not isinstance(function.body, cst.IndentedBlock):
                return None
            if function not in functions:
                functions.append(function)
        return functions or None

    def plan_changes(self) -> None:
        facts = self.facts
        server = [
            b
            for b in facts.bindings.values()
            if isinstance(b.result, Target)
            and b.result.module in _SERVER_MODULES
            and facts.parents.get(facts.statement_of(b.statement)) is facts.module
        ]
        if not server:
            return
        lines: dict[str, tuple[str, list[cst.FunctionDef]]] = {}
        for b in server:
            assert isinstance(b.result, Target)
            local = facts.renames.get(b.local, b.local)
            functions = self._relocatable(b.local)
            if functions is None or not facts.alone(b.statement):
                self.note(
                    facts.position(b.statement),
                    f"{b.result.module}.{b.result.name}",
                    "imported at module level: `osmosis run` needs the osmosis-server plugin to import this file",
                )
                continue
            item = b.result.name if local == b.result.name else f"{b.result.name} as {local}"
            lines[b.local] = (f"from {b.result.module} import {item}", functions)
            self.plan.relocated.add(b.local)
            self.plan.distributions.add(b.result.distribution)
        if not self.plan.relocated:
            return
        for line in facts.module.body:
            if not m.matches(line, _IMPORT_UVICORN):
                continue
            assert isinstance(line, cst.SimpleStatementLine)
            assert isinstance(line.body[0], cst.Import)
            local = alias_local(line.body[0].names[0])
            functions = self._relocatable(local)
            if functions:
                text = "import uvicorn" + (f" as {local}" if local != "uvicorn" else "")
                lines[local] = (text, functions)
                self.plan.dropped.add(line)
        per_function: dict[cst.FunctionDef, list[str]] = {}
        for text, functions in lines.values():
            for function in functions:
                per_function.setdefault(function, []).append(text)
        for function, imports in per_function.items():
            assert isinstance(function.body, cst.IndentedBlock)
            body = function.body.body
            first = body[0]
            if is_docstring_statement(first) and len(body) > 1:
                first = body[1]
            block = "".join(f"{line}\n" for line in sorted(imports, key=lambda s: (s.startswith("from"), s)))
            self.plan.inserts[first] = Insert(list(cst.parse_module(block).body), [cst.EmptyLine(indent=False)])
            self.note(
                function,
                f"{function.name.value}(): " + ", ".join(sorted(imports)),
                "the server imports moved into the function that serves, so `osmosis run` imports this file without "
                "the server plugin (osmosis serve CONFIG replaces `python main.py`)",
            )
