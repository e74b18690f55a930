"""What the rules read of a file before anything changes: its nodes, scopes, positions and imports.

One :class:`Facts` per file travels in the ``CodemodContext`` (``context.scratch``) and every rule
reads the same one, so the tree is walked once; libcst's metadata providers come from the context's
``MetadataWrapper`` (``ScopeProvider``: which names use an import, which names are bound;
``PositionProvider``: the line of each finding), each resolved only when a rule first asks. Where a
node sits is noted in the one walk that reads the tree, not by ``ParentNodeProvider``, which walks
it again.

>>> import libcst as cst
>>> from libcst.codemod import CodemodContext
>>> text = "from osmosis_ai.rollout import AgentWorkflowOutput\\n"
>>> context = CodemodContext(wrapper=cst.MetadataWrapper(cst.parse_module(text)))
>>> facts = Facts.read(context, text, entrypoint=False, decorate_configs=True)
>>> facts is facts_of(context), sorted(facts.bindings), facts.renames
(True, ['AgentWorkflowOutput'], {'AgentWorkflowOutput': 'RolloutSample'})
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import attrs
import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.metadata import CodeRange, ImportAssignment, MetadataWrapper, PositionProvider, Scope, ScopeProvider

from osmosis_migrate.codemods.syntax import (
    Import,
    alias_local,
    dotted,
    imports_reference,
    small_statements,
    split_lines,
    string_value,
)
from osmosis_migrate.names import MODULE_PATHS, NotOffered, Target, is_reference_module, resolve_name

__all__ = ["Binding", "Facts", "Position", "facts_of"]

Position = tuple[int, int]
"""A place in the original text: (1-based line, column)."""

_SCRATCH_KEY = "osmosis_migrate.facts"


def facts_of(context: CodemodContext) -> Facts:
    """The facts :meth:`Facts.read` left in ``context``."""
    facts = context.scratch[_SCRATCH_KEY]
    assert isinstance(facts, Facts)
    return facts


class _Nodes(cst.CSTVisitor):
    """Every node in source order, and the parent of each; the names inside import statements are left
    out (``ast`` keeps them as strings, and so does this migration). One pass: cheaper than libcst's
    ``ParentNodeProvider``, which walks the tree again."""

    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self._stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        if self._stack:
            self.parents[node] = self._stack[-1]
        self._stack.append(node)
        return not isinstance(node, Import)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()


@attrs.frozen
class Binding:
    """A name bound by ``from osmosis_ai... import name [as local]``."""

    module: str
    name: str
    local: str
    result: Target | NotOffered
    statement: Import


class Facts:
    """The original tree of one file and what the rules ask of it (nothing here changes it)."""

    def __init__(self, wrapper: MetadataWrapper, text: str, *, entrypoint: bool, decorate_configs: bool) -> None:
        self.wrapper = wrapper
        self.module = wrapper.module
        self.lines = split_lines(text)
        self.entrypoint = entrypoint
        self.decorate_configs = decorate_configs
        collector = _Nodes()
        self.module.visit(collector)
        self.nodes = collector.nodes
        self.parents = collector.parents
        self.index = {node: i for i, node in enumerate(self.nodes)}
        self.imports: list[Import] = []
        self.bindings: dict[str, Binding] = {}
        self.module_aliases: dict[str, str] = {}
        self.plain_modules: list[str] = []
        self.bound = self._module_bindings()
        self._collect_usage()
        self._register_bindings()

    @classmethod
    def read(cls, context: CodemodContext, text: str, *, entrypoint: bool, decorate_configs: bool) -> Facts:
        """Read the module of ``context``'s wrapper, parsed from ``text`` (with ``unsafe_skip_copy``: the
        rules key their changes by its nodes), and leave the facts in ``context.scratch``."""
        assert context.wrapper is not None
        facts = cls(context.wrapper, text, entrypoint=entrypoint, decorate_configs=decorate_configs)
        context.scratch[_SCRATCH_KEY] = facts
        return facts

    @functools.cached_property
    def positions(self) -> Mapping[cst.CSTNode, CodeRange]:
        """Where each node is (libcst's ``PositionProvider``): resolved only when a finding needs a line."""
        return self.wrapper.resolve(PositionProvider)

    @functools.cached_property
    def scopes(self) -> Mapping[cst.CSTNode, Scope | None]:
        """The scope of each node (libcst's ``ScopeProvider``): resolved only in a file that imports osmosis-ai."""
        return self.wrapper.resolve(ScopeProvider)

    @functools.cached_property
    def names(self) -> tuple[set[str], set[str]]:
        """The names bound or used anywhere (every scope), and those bound other than by an import."""
        identifiers: set[str] = set()
        rebound = set(self.declared)
        for scope in {s for s in self.scopes.values() if s is not None}:
            for assignment in scope.assignments:
                identifiers.add(assignment.name)
                if not isinstance(assignment, ImportAssignment):
                    rebound.add(assignment.name)
            for access in scope.accesses:
                if isinstance(access.node, cst.Name):
                    identifiers.add(access.node.value)
        return identifiers, rebound

    @functools.cached_property
    def renames(self) -> dict[str, str]:
        """The planned renames, ``{old local name: osmosis's name}``: the imported names osmosis renamed
        that are safe to rename where used (not rebound, not named in strings, the new name free)."""
        renames: dict[str, str] = {}
        # names the file already binds to the same osmosis object (both AgentWorkflowOutput and RolloutSample)
        same = {
            b.local: b.result
            for b in self.bindings.values()
            if isinstance(b.result, Target) and b.local == b.result.name
        }
        for b in self.bindings.values():
            if not isinstance(b.result, Target) or b.local != b.name or b.result.name == b.name:
                continue
            new = b.result.name
            identifiers, rebound = self.names
            taken = new in identifiers and same.get(new) != b.result
            in_strings = any(b.name in s for s in self.annotation_strings)
            if b.name not in rebound and not in_strings and not taken:
                renames[b.local] = new
        return renames

    def _collect_usage(self) -> None:
        """Strings that name things (annotations, ``__all__``), ``global`` names, osmosis-ai imports."""
        self.declared: set[str] = set()
        self.annotation_strings: list[str] = []
        for node in self.nodes:
            if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
                value = string_value(node)
                if value is not None and self._names_something(node):
                    self.annotation_strings.append(value)
            elif isinstance(node, cst.Global | cst.Nonlocal):
                self.declared.update(n.name.value for n in node.names)
            elif imports_reference(node):
                self.imports.append(node)

    def _names_something(self, string: cst.CSTNode) -> bool:
        """A string in an annotation or in the value of ``__all__ = [...]``."""
        child, current = string, self.parents.get(string)
        if isinstance(current, cst.ConcatenatedString):
            return False
        while current is not None and not isinstance(current, cst.BaseStatement):
            if isinstance(current, cst.Annotation):
                return True
            if isinstance(current, cst.Assign) and current.value is child:
                return any(dotted(t.target) == "__all__" for t in current.targets)
            child, current = current, self.parents.get(current)
        return False

    def _module_bindings(self) -> set[str]:
        """Names bound at module level (assignments, imports, functions, classes)."""
        bound: set[str] = set()
        self.values: dict[str, cst.BaseExpression] = {}
        for statement in small_statements(self.module.body):
            targets: list[cst.BaseExpression] = []
            value: cst.BaseExpression | None = None
            if isinstance(statement, cst.Assign):
                targets, value = [t.target for t in statement.targets], statement.value
            elif isinstance(statement, cst.AnnAssign):
                targets, value = [statement.target], statement.value
            elif isinstance(statement, cst.FunctionDef | cst.ClassDef):
                bound.add(statement.name.value)
            elif isinstance(statement, cst.Import | cst.ImportFrom) and not isinstance(statement.names, cst.ImportStar):
                bound.update(alias_local(alias) for alias in statement.names)
            for target in targets:
                if isinstance(target, cst.Name):
                    bound.add(target.value)
                    if value is not None:
                        self.values[target.value] = value
        return bound

    def _register_bindings(self) -> None:
        for node in self.imports:
            if isinstance(node, cst.ImportFrom):
                module = dotted(node.module) or ""
                if isinstance(node.names, cst.ImportStar):
                    continue
                for alias in node.names:
                    name = dotted(alias.name) or ""
                    local = alias_local(alias)
                    full = f"{module}.{name}"
                    if full in MODULE_PATHS:
                        self.module_aliases[local] = full
                    else:
                        self.bindings[local] = Binding(module, name, local, resolve_name(module, name), node)
            else:
                for alias in node.names:
                    name = dotted(alias.name) or ""
                    if not is_reference_module(name):
                        continue
                    if alias.asname is not None:
                        self.module_aliases[alias_local(alias)] = name
                    else:
                        self.plain_modules.append(name)

    # -- values -----------------------------------------------------------------------------------

    def literal(self, node: cst.BaseExpression) -> Any:
        """The literal value of an expression (as ``ast.literal_eval`` reads it), else raise ValueError."""
        try:
            return ast.literal_eval(self.module.code_for_node(node).strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(self.module.code_for_node(node)) from None

    def constant(self, node: cst.BaseExpression) -> Any:
        """The literal value of ``node`` (directly or through a module-level constant), else raise ValueError."""
        if isinstance(node, cst.Name) and node.value not in ("True", "False", "None"):
            if node.value in self.values:
                return self.literal(self.values[node.value])
            raise ValueError(node.value)
        return self.literal(node)

    def static_path(self, node: cst.CSTNode, depth: int = 0) -> PurePosixPath | None:
        """A path relative to the module's folder, when ``node`` builds one from ``__file__``; else None."""
        if depth > 8:
            return None
        if _is_file_dir(node):
            return PurePosixPath(".")
        if isinstance(node, cst.Name) and node.value in self.values:
            return self.static_path(self.values[node.value], depth + 1)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
            base = self.static_path(node.left, depth + 1)
            part = string_value(node.right) if isinstance(node.right, cst.SimpleString) else None
            return PurePosixPath(base, part) if base is not None and part is not None else None
        if isinstance(node, cst.Call):
            name = dotted(node.func)
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "joinpath":
                base, args = self.static_path(node.func.value, depth + 1), node.args
            elif name == "os.path.join" and node.args:
                base, args = self.static_path(node.args[0].value, depth + 1), node.args[1:]
            else:
                return None
            parts = [string_value(a.value) for a in args if isinstance(a.value, cst.SimpleString)]
            if base is not None and len(parts) == len(args):
                return PurePosixPath(base, *[p for p in parts if p is not None])
        return None

    # -- where a node is --------------------------------------------------------------------------

    def position(self, node: cst.CSTNode) -> Position:
        """Where ``node`` begins in the original text."""
        start = self.positions[node].start
        return start.line, start.column

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement line (or compound statement) holding ``node``."""
        current: cst.CSTNode | None = node
        while current is not None and not isinstance(
            current, cst.SimpleStatementLine | cst.BaseCompoundStatement | cst.SimpleStatementSuite
        ):
            current = self.parents.get(current)
        return current if current is not None else node

    def alone(self, small: cst.CSTNode) -> bool:
        """True when ``small`` is the only statement of its line."""
        line = self.parents.get(small)
        return isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1

    def enclosing_function(self, node: cst.CSTNode, *, outermost: bool = False) -> cst.FunctionDef | None:
        """The innermost (or ``outermost``) function holding ``node`` (None at module or class level)."""
        found: cst.FunctionDef | None = None
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, cst.FunctionDef):
                if not outermost:
                    return current
                found = current
            current = self.parents.get(current)
        return found

    def uses(self, name: str, at: cst.CSTNode | None = None) -> list[cst.Name]:
        """The names, in source order, that read the binding of ``name`` in the scope of ``at`` (an import
        statement, an assignment; the module by default), as libcst's scope analysis resolves them."""
        scope = self.scopes.get(at if at is not None else self.module)
        if scope is None or name not in scope:
            return []
        found = {
            access.node
            for assignment in scope.assignments[name]
            for access in assignment.references
            if isinstance(access.node, cst.Name) and access.node.value == name and access.node in self.index
        }
        return sorted(found, key=self.index.__getitem__)

    def ref_name(self, node: cst.CSTNode) -> str | None:
        """The osmosis-ai name an expression refers to (a bound name or ``alias.Name``), if any."""
        if isinstance(node, cst.Name) and node.value in self.bindings:
            return self.bindings[node.value].name
        if isinstance(node, cst.Attribute):
            base = dotted(node.value)
            if base is not None and (base in self.module_aliases or base in MODULE_PATHS):
                return node.attr.value
        return None


_PATH_OF_FILE = m.Call(
    func=m.Name("Path") | m.Attribute(value=m.Name("pathlib"), attr=m.Name("Path")), args=[m.Arg(m.Name("__file__"))]
)


def _is_file_dir(node: cst.CSTNode) -> bool:
    """``Path(__file__)[.resolve()|.absolute()].parent`` or ``os.path.dirname(os.path.abspath(__file__))``."""
    if isinstance(node, cst.Attribute) and node.attr.value == "parent":
        inner = node.value
        while (
            isinstance(inner, cst.Call)
            and isinstance(inner.func, cst.Attribute)
            and inner.func.attr.value in ("resolve", "absolute")
            and not inner.args
        ):
            inner = inner.func.value
        return m.matches(inner, _PATH_OF_FILE)
    if isinstance(node, cst.Call) and dotted(node.func) == "os.path.dirname" and len(node.args) == 1:
        arg = node.args[0].value
        if isinstance(arg, cst.Call) and dotted(arg.func) in ("os.path.abspath", "os.path.realpath") and arg.args:
            arg = arg.args[0].value
        return dotted(arg) == "__file__"
    return False
