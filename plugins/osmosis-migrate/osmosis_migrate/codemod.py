"""The libcst transformation behind :func:`osmosis_migrate.python_source.migrate_python`.

The module is parsed once into libcst's concrete syntax tree; libcst's metadata providers answer the
questions the migration asks (``ScopeProvider``: which names use an import, which names are bound;
``PositionProvider``: the line of each finding; where a node sits is noted in the one walk that
reads the tree, not by ``ParentNodeProvider``, which walks it again). The
analysis records, per node of that tree, how it changes; one ``CSTTransformer`` pass applies the
changes and ``Module.code`` prints the result, so every byte the migration does not touch is kept.

This module imports libcst: import it only when a file is migrated.

>>> print(migrate_module("x.py", "import osmosis_ai.rollout as r\\ny = r.AgentWorkflowOutput\\n").new_text, end="")
import osmosis_core as r
y = r.RolloutSample
"""

from __future__ import annotations

import ast
import difflib
import functools
import io
import re
import tokenize
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, TypeGuard, cast

import attrs
import libcst as cst
from libcst.metadata import CodeRange, ImportAssignment, MetadataWrapper, PositionProvider, Scope, ScopeProvider

from osmosis_migrate.names import (
    ATTRIBUTE_WHY,
    DISTRIBUTIONS,
    ENUM_MEMBER_WHY,
    ENUM_MEMBERS,
    ENV_VAR_WHY,
    MODULE_PATHS,
    PLACEHOLDER_MODELS,
    NotOffered,
    Target,
    is_reference_module,
    module_target,
    resolve_name,
)
from osmosis_migrate.records import LEFTOVER_MARK, BackendCall, Finding, PythonAnalysis, PythonMigration

__all__ = ["migrate_module"]

_SERVER_MODULES = frozenset({"osmosis_server"})
_CONFIG_BASES = {"AgentWorkflowConfig": "workflow", "GraderConfig": "grader"}
_PYDANTIC_CALLS = frozenset({"Field", "PrivateAttr", "ConfigDict"})
_PYDANTIC_DECORATORS = frozenset(
    {"field_validator", "model_validator", "validator", "root_validator", "computed_field", "field_serializer"}
)
_ATTRS_DECORATORS = frozenset({"attrs.define", "attrs.frozen", "define", "frozen", "attr.s", "attrs.mutable"})
_SERVER_SETTINGS = {
    "result_wait_timeout_sec": "result_wait_sec",
    "polling_lease_timeout_sec": "lease_timeout_sec",
    "result_retention_sec": "retention_sec",
}
_CONTEXT_ATTRS = {"chat_completions_url": "policy.base_url", "api_key": "policy.api_key"}
_HARBOR_NOT_CARRIED = {
    "environment_config": (
        "the trial environment is chosen in code here; osmosis runs trials in its bubblewrap sandbox by default: "
        'set [backend.harbor.environment] type = "docker" (or "daytona", ...) to use another'
    ),
    "model_name": "osmosis sends the run's [policy] model to the endpoint",
    "native_agent_kwargs": "osmosis runs AgentWorkflow classes in trials, not Harbor's own agents",
    "bundle": "osmosis uploads the rollout folder and the osmosis packages into each trial; there is no wheel bundle",
    "patch_dockerfile_with_sdk": "osmosis uploads its packages into trials; the image needs Python and your framework",
    "prebuild_local_image": "osmosis does not pre-build images (Harbor builds them when a trial starts)",
    "prewarm": "osmosis has no prewarm step",
    "max_queue_depth": "osmosis's run loop never queues more than [run] concurrency rollouts",
    "trials_dir": "osmosis keeps trials under <run folder>/harbor-trials (or [backend.harbor] trials_dir, a path)",
    "verified_tasks": "not offered",
    "agent_setup_timeout_sec": "not offered",
}

_Import = cst.Import | cst.ImportFrom
_Position = tuple[int, int]
"""A place in the original text: (1-based line, column)."""
_Change = Callable[[cst.CSTNode, Any], Any]
"""How one node changes: ``(original, updated) -> replacement``."""


def migrate_module(rel: str, text: str, *, entrypoint: bool = False, decorate_configs: bool = True) -> PythonMigration:
    """Migrate one file's text (see :func:`osmosis_migrate.python_source.migrate_python`)."""
    references = "osmosis_ai" in text
    try:
        ast.parse(text)  # what Python compiles: libcst also parses some files Python refuses (a bad \N{...})
        module = cst.parse_module(text)
    except (SyntaxError, ValueError, cst.ParserSyntaxError) as exc:
        problem = _syntax_error(rel, exc)
        return PythonMigration(text, [], [problem] if references else [], PythonAnalysis(), references)
    return _Migrator(rel, text, module, entrypoint=entrypoint, decorate_configs=decorate_configs).run()


def _syntax_error(rel: str, exc: SyntaxError | ValueError | cst.ParserSyntaxError) -> Finding:
    """The finding for a file that does not parse, worded as Python's own parser words it."""
    if isinstance(exc, cst.ParserSyntaxError):
        line, message = exc.raw_line, exc.message
    elif isinstance(exc, SyntaxError):
        line, message = exc.lineno or 1, exc.msg
    else:  # a NUL byte
        line, message = 1, str(exc)
    return Finding(rel, line, "syntax error", f"cannot parse ({message}); fix it and migrate again")


# -- reading the tree ---------------------------------------------------------------------------------


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


def _string(node: cst.CSTNode | None) -> str | None:
    """The value of a string literal (plain or implicitly concatenated), else None."""
    if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _is_none(node: cst.CSTNode | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _keyword(arg: cst.Arg) -> str | None:
    return arg.keyword.value if arg.keyword is not None else None


def _keywords(call: cst.Call) -> list[cst.Arg]:
    """The keyword arguments of a call (``**kwargs`` too, as ``ast`` lists them)."""
    return [a for a in call.args if a.keyword is not None or a.star == "**"]


def _positional(call: cst.Call) -> list[cst.Arg]:
    return [a for a in call.args if a.keyword is None and a.star != "**"]


def _alias_local(alias: cst.ImportAlias) -> str:
    """The name an import alias binds (``a`` for ``import a.b``)."""
    return _asname(alias) or (dotted(alias.name) or "").split(".")[0]


def _asname(alias: cst.ImportAlias) -> str | None:
    """The ``as`` name of an import alias, if any."""
    return alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else None


def _leading(statement: cst.BaseStatement) -> list[cst.EmptyLine]:
    """The comment and blank lines above a statement."""
    return list(cast(cst.SimpleStatementLine | cst.BaseCompoundStatement, statement).leading_lines)


def _with_leading(statement: cst.BaseStatement, lines: Sequence[cst.EmptyLine]) -> cst.BaseStatement:
    return statement.with_changes(leading_lines=list(lines))


def _small_statements(module: cst.Module) -> Iterator[cst.BaseSmallStatement | cst.BaseCompoundStatement]:
    """The module's top-level statements, each small statement of a line on its own."""
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            yield from statement.body
        else:
            yield statement


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
        return not isinstance(node, _Import)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()


@attrs.frozen
class _Binding:
    """A name bound by ``from osmosis_ai... import name [as local]``."""

    module: str
    name: str
    local: str
    result: Target | NotOffered
    alias: cst.ImportAlias
    statement: _Import


@attrs.define
class _Group:
    """One import statement to write: ``from module import items`` or ``import items``."""

    kind: str
    module: str
    items: list[str] = attrs.field(factory=list)
    comments: dict[int, str] = attrs.field(factory=dict)
    before: dict[int, list[str]] = attrs.field(factory=dict)
    leftover: bool = False

    def add(self, item: str, comment: str | None, before: list[str]) -> None:
        if item in self.items:
            return
        if comment:
            self.comments[len(self.items)] = comment
        if before:
            self.before[len(self.items)] = before
        self.items.append(item)


@attrs.define
class _Insert:
    """Statements to put before a statement (after its leading comments), and the lines it keeps above it."""

    statements: list[cst.BaseStatement]
    lines_above: list[cst.EmptyLine]


class _Apply(cst.CSTTransformer):
    """Applies the planned changes, keyed by the nodes of the original tree; it enters only the nodes
    on the way to a change (the rest of the tree is kept as it is, without being walked)."""

    def __init__(self, migrator: _Migrator) -> None:
        super().__init__()
        self.m = migrator
        self.paths: set[cst.CSTNode] = set()
        for node in [*migrator.changes, *migrator.dropped, *migrator.expanded, *migrator.inserts]:
            current: cst.CSTNode | None = node
            while current is not None and current not in self.paths:
                self.paths.add(current)
                current = migrator.parents.get(current)
        self.paths.add(migrator.module)

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.paths

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
        result: Any = updated_node
        for change in self.m.changes.get(original_node, ()):
            result = change(original_node, result)
        if isinstance(original_node, cst.Module | cst.IndentedBlock):
            result = self.m.rebuild_body(original_node, result)
        return result


# -- the migration ------------------------------------------------------------------------------------


class _Migrator:
    def __init__(self, rel: str, text: str, module: cst.Module, *, entrypoint: bool, decorate_configs: bool) -> None:
        self.rel = rel
        self.text = text
        self.lines = _split_lines(text)
        self.entrypoint = entrypoint
        self.decorate_configs = decorate_configs
        self.wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        self.module = self.wrapper.module
        collector = _Nodes()
        self.module.visit(collector)
        self.nodes = collector.nodes
        self.parents = collector.parents
        self.index = {node: i for i, node in enumerate(self.nodes)}
        self.changes: dict[cst.CSTNode, list[_Change]] = {}
        self.dropped: set[cst.CSTNode] = set()
        self.expanded: dict[cst.CSTNode, list[cst.BaseStatement]] = {}
        self.inserts: dict[cst.CSTNode, _Insert] = {}
        self.appended: list[cst.BaseStatement] = []
        self.notes: list[tuple[_Position, str, str]] = []
        self.unmapped: list[tuple[_Position, str, str]] = []
        self.imports: list[_Import] = []
        self.bindings: dict[str, _Binding] = {}
        self.module_aliases: dict[str, str] = {}
        self.plain_modules: list[str] = []
        self.distributions: set[str] = set()
        self.renames: dict[str, str] = {}
        self.removed: set[str] = set()
        self.relocated: set[str] = set()
        self.renamed_attributes: set[cst.Attribute] = set()
        self.config_fields: set[str] = set()
        self.backend: BackendCall | None = None
        self.bound = self._module_bindings()
        self._collect_usage()

    # -- facts ------------------------------------------------------------------------------------

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

    def _collect_usage(self) -> None:
        """Strings that name things (annotations, ``__all__``), ``global`` names, osmosis-ai imports."""
        self.declared: set[str] = set()
        self.annotation_strings: list[str] = []
        for node in self.nodes:
            if isinstance(node, cst.SimpleString | cst.ConcatenatedString):
                value = _string(node)
                if value is not None and self._names_something(node):
                    self.annotation_strings.append(value)
            elif isinstance(node, cst.Global | cst.Nonlocal):
                self.declared.update(n.name.value for n in node.names)
            elif _imports_reference(node):
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
        for statement in _small_statements(self.module):
            targets: list[cst.BaseExpression] = []
            value: cst.BaseExpression | None = None
            if isinstance(statement, cst.Assign):
                targets, value = [t.target for t in statement.targets], statement.value
            elif isinstance(statement, cst.AnnAssign):
                targets, value = [statement.target], statement.value
            elif isinstance(statement, cst.FunctionDef | cst.ClassDef):
                bound.add(statement.name.value)
            elif isinstance(statement, cst.Import | cst.ImportFrom) and not isinstance(statement.names, cst.ImportStar):
                bound.update(_alias_local(alias) for alias in statement.names)
            for target in targets:
                if isinstance(target, cst.Name):
                    bound.add(target.value)
                    if value is not None:
                        self.values[target.value] = value
        return bound

    def _literal(self, node: cst.BaseExpression) -> Any:
        """The literal value of an expression (as ``ast.literal_eval`` reads it), else raise ValueError."""
        try:
            return ast.literal_eval(self.module.code_for_node(node).strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(self.module.code_for_node(node)) from None

    def constant(self, node: cst.BaseExpression) -> Any:
        """The literal value of ``node`` (directly or through a module-level constant), else raise ValueError."""
        if isinstance(node, cst.Name) and node.value not in ("True", "False", "None"):
            if node.value in self.values:
                return self._literal(self.values[node.value])
            raise ValueError(node.value)
        return self._literal(node)

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
            part = _string(node.right) if isinstance(node.right, cst.SimpleString) else None
            return PurePosixPath(base, part) if base is not None and part is not None else None
        if isinstance(node, cst.Call):
            name = dotted(node.func)
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "joinpath":
                base, args = self.static_path(node.func.value, depth + 1), node.args
            elif name == "os.path.join" and node.args:
                base, args = self.static_path(node.args[0].value, depth + 1), node.args[1:]
            else:
                return None
            parts = [_string(a.value) for a in args if isinstance(a.value, cst.SimpleString)]
            if base is not None and len(parts) == len(args):
                return PurePosixPath(base, *[p for p in parts if p is not None])
        return None

    def position(self, node: cst.CSTNode) -> _Position:
        """Where ``node`` begins in the original text."""
        start = self.positions[node].start
        return start.line, start.column

    def _anchor(self, node: cst.CSTNode | _Position) -> _Position:
        if isinstance(node, tuple):
            return node
        if isinstance(node, cst.FunctionDef | cst.ClassDef):
            node = node.name  # ``ast`` places a decorated definition on its ``def`` / ``class`` line
        return self.position(node)

    def _note(self, node: cst.CSTNode | _Position, subject: str, why: str) -> None:
        self.notes.append((self._anchor(node), subject, why))

    def _unmapped(self, node: cst.CSTNode | _Position, subject: str, why: str) -> None:
        item = (self._anchor(node), subject, why)
        if item not in self.unmapped:
            self.unmapped.append(item)

    def change(self, node: cst.CSTNode, how: _Change) -> None:
        self.changes.setdefault(node, []).append(how)

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

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The innermost function holding ``node`` (None at module or class level)."""
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, cst.FunctionDef):
                return current
            current = self.parents.get(current)
        return None

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

    # -- the whole file ---------------------------------------------------------------------------

    def run(self) -> PythonMigration:
        self._register_bindings()
        if self.imports:
            self._plan_renames()
            self._remove_memory_sessions()
            self._plan_relocation()
            self._rewrite_imports()
            self._rewrite_names()
            self._rewrite_context_attributes()
            self._decorate_config_classes()
            self._check_usage()
        if self.entrypoint:
            self._read_backend_call(report=bool(self.imports))
        changed = self.changes or self.dropped or self.expanded or self.inserts or self.appended
        text = self.wrapper.module.visit(_Apply(self)).code if changed else self.text
        line_of = _line_map(self.lines, _split_lines(text)) if changed else _same_line

        def finding(item: tuple[_Position, str, str]) -> Finding:
            (line, _column), subject, why = item
            return Finding(self.rel, line_of(line), subject, why)

        return PythonMigration(
            new_text=text,
            notes=[finding(n) for n in sorted(self.notes)],
            unmapped=[finding(u) for u in sorted(self.unmapped)],
            analysis=PythonAnalysis(frozenset(self.config_fields), self.backend, frozenset(self.distributions)),
            references=bool(self.imports) or "osmosis_ai" in self.text,
        )

    def rebuild_body(self, original: cst.Module | cst.IndentedBlock, updated: Any) -> Any:
        """The block's statements with the planned removals, expansions and insertions: a removed line's
        comments and blank lines stay above whatever comes next."""
        if not isinstance(updated, cst.Module | cst.IndentedBlock):
            return updated
        body: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        for before, after in zip(original.body, updated.body, strict=True):
            if before in self.dropped:
                carried += _leading(after)
                continue
            insert = self.inserts.get(before)
            lines = [*carried, *_leading(after)]
            statements = list(self.expanded.get(before, [_with_leading(after, [])]))
            carried = []
            if insert is not None:
                statements[0] = _with_leading(statements[0], insert.lines_above)
                statements = [*insert.statements, *statements]
            statements[0] = _with_leading(statements[0], [*lines, *_leading(statements[0])])
            body += statements
        if isinstance(updated, cst.Module):
            footer = [*carried, *updated.footer]
            if self.appended:
                body += [_with_leading(self.appended[0], [*footer, *_leading(self.appended[0])]), *self.appended[1:]]
                footer = []
            return updated.with_changes(body=body, footer=footer, has_trailing_newline=True)
        if not body:
            body = [cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried)]
            carried = []
        return updated.with_changes(body=body, footer=[*carried, *updated.footer])

    def _register_bindings(self) -> None:
        for node in self.imports:
            if isinstance(node, cst.ImportFrom):
                module = dotted(node.module) or ""
                if isinstance(node.names, cst.ImportStar):
                    continue
                for alias in node.names:
                    name = dotted(alias.name) or ""
                    local = _alias_local(alias)
                    full = f"{module}.{name}"
                    if full in MODULE_PATHS:
                        self.module_aliases[local] = full
                    else:
                        self.bindings[local] = _Binding(module, name, local, resolve_name(module, name), alias, node)
            else:
                for alias in node.names:
                    name = dotted(alias.name) or ""
                    if not is_reference_module(name):
                        continue
                    if alias.asname is not None:
                        self.module_aliases[_alias_local(alias)] = name
                    else:
                        self.plain_modules.append(name)

    def _ref_name(self, node: cst.CSTNode) -> str | None:
        """The osmosis-ai name an expression refers to (a bound name or ``alias.Name``), if any."""
        if isinstance(node, cst.Name) and node.value in self.bindings:
            return self.bindings[node.value].name
        if isinstance(node, cst.Attribute):
            base = dotted(node.value)
            if base is not None and (base in self.module_aliases or base in MODULE_PATHS):
                return node.attr.value
        return None

    # -- renames ----------------------------------------------------------------------------------

    def _plan_renames(self) -> None:
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
                self.renames[b.local] = new

    # -- OsmosisMemorySession ---------------------------------------------------------------------

    def _remove_memory_sessions(self) -> None:
        sessions = [
            b for b in self.bindings.values() if b.name == "OsmosisMemorySession" and "openai_agents" in b.module
        ]
        for binding in sessions:
            local = binding.local
            uses = self.uses(local, at=binding.statement)
            removed_all = True
            for use in uses:
                call = self.parents.get(use)
                if not (isinstance(call, cst.Call) and call.func is use):
                    removed_all = False
                    self._unmapped(use, "OsmosisMemorySession", "used other than as a session=... argument: remove it")
                    continue
                if not self._drop_session(call):
                    removed_all = False
            if removed_all and uses:
                self.removed.add(local)

    def _drop_session(self, call: cst.Call) -> bool:
        parent = self.parents.get(call)
        why = "dropped: OsmosisRolloutModel, the model of OsmosisAgent, registers the sample itself"
        if isinstance(parent, cst.Arg) and _keyword(parent) == "session":
            outer = self.parents.get(parent)
            if isinstance(outer, cst.Call):
                self._remove_argument(outer, parent)
                self._note(parent, "session=OsmosisMemorySession()", why)
                return True
        assign = parent
        if (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and self.alone(assign)
        ):
            var = assign.targets[0].target.value
            uses = self.uses(var, at=assign)
            arguments = [self.parents.get(u) for u in uses]
            argument = arguments[0] if len(uses) == 1 else None
            if isinstance(argument, cst.Arg) and _keyword(argument) == "session":
                outer = self.parents.get(argument)
                if isinstance(outer, cst.Call):
                    line = self.parents.get(assign)
                    assert line is not None
                    self.dropped.add(line)
                    self._remove_argument(outer, argument)
                    self._note(assign, f"{var} = OsmosisMemorySession() and session={var}", why)
                    return True
            if len(uses) > 1:
                self._unmapped(
                    call,
                    "OsmosisMemorySession",
                    f"{var} is used {len(uses)} times (memory across Runner.run calls?): pass the conversation "
                    "yourself, or use an agents session such as agents.SQLiteSession",
                )
                return False
        self._unmapped(call, "OsmosisMemorySession()", "not passed as session=...: remove it by hand")
        return False

    def _remove_argument(self, call: cst.Call, argument: cst.Arg) -> None:
        """Drop one argument; the one before it takes over its comma and trailing whitespace when it was last."""
        index = call.args.index(argument)

        def remove(_original: cst.CSTNode, updated: cst.Call) -> cst.Call:
            args = list(updated.args)
            gone = args.pop(index)
            if index == len(args) and index > 0:
                previous = args[-1]
                if isinstance(gone.comma, cst.Comma) and isinstance(previous.comma, cst.Comma):
                    previous = previous.with_changes(
                        comma=previous.comma.with_changes(whitespace_after=gone.comma.whitespace_after)
                    )
                else:
                    previous = previous.with_changes(comma=gone.comma, whitespace_after_arg=gone.whitespace_after_arg)
                args[-1] = previous
            return updated.with_changes(args=args)

        self.change(call, remove)

    # -- server imports into the serving function -------------------------------------------------

    def _top_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        found: cst.FunctionDef | None = None
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, cst.FunctionDef):
                found = current
            current = self.parents.get(current)
        return found if found is not None and self.parents.get(found) is self.module else None

    def _relocatable(self, name: str) -> list[cst.FunctionDef] | None:
        functions: list[cst.FunctionDef] = []
        for use in self.uses(name):
            function = self._top_function(use)
            if function is None or not isinstance(function.body, cst.IndentedBlock):
                return None
            if function not in functions:
                functions.append(function)
        return functions or None

    def _plan_relocation(self) -> None:
        server = [
            b
            for b in self.bindings.values()
            if isinstance(b.result, Target)
            and b.result.module in _SERVER_MODULES
            and self.parents.get(self.statement_of(b.statement)) is self.module
        ]
        if not server:
            return
        lines: dict[str, tuple[str, list[cst.FunctionDef]]] = {}
        for b in server:
            assert isinstance(b.result, Target)
            local = self.renames.get(b.local, b.local)
            functions = self._relocatable(b.local)
            if functions is None or not self.alone(b.statement):
                self._note(
                    self.position(b.statement),
                    f"{b.result.module}.{b.result.name}",
                    "imported at module level: `osmosis run` needs the osmosis-server plugin to import this file",
                )
                continue
            item = b.result.name if local == b.result.name else f"{b.result.name} as {local}"
            lines[b.local] = (f"from {b.result.module} import {item}", functions)
            self.relocated.add(b.local)
            self.distributions.add(b.result.distribution)
        if not self.relocated:
            return
        for line in self.module.body:
            if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
                continue
            statement = line.body[0]
            if isinstance(statement, cst.Import) and len(statement.names) == 1:
                alias = statement.names[0]
                if dotted(alias.name) != "uvicorn":
                    continue
                local = _alias_local(alias)
                functions = self._relocatable(local)
                if functions:
                    text = "import uvicorn" + (f" as {local}" if local != "uvicorn" else "")
                    lines[local] = (text, functions)
                    self.dropped.add(line)
        per_function: dict[cst.FunctionDef, list[str]] = {}
        for text, functions in lines.values():
            for function in functions:
                per_function.setdefault(function, []).append(text)
        for function, imports in per_function.items():
            assert isinstance(function.body, cst.IndentedBlock)
            body = function.body.body
            first = body[0]
            if _is_docstring_statement(first) and len(body) > 1:
                first = body[1]
            block = "".join(f"{line}\n" for line in sorted(imports, key=lambda s: (s.startswith("from"), s)))
            self.inserts[first] = _Insert(list(cst.parse_module(block).body), [cst.EmptyLine(indent=False)])
            self._note(
                function,
                f"{function.name.value}(): " + ", ".join(sorted(imports)),
                "the server imports moved into the function that serves, so `osmosis run` imports this file without "
                "the server plugin (osmosis serve CONFIG replaces `python main.py`)",
            )

    # -- import statements ------------------------------------------------------------------------

    def _rewrite_imports(self) -> None:
        chain_targets = self._rewrite_chains()
        first_plain = True
        for node in self.imports:
            if isinstance(node, cst.ImportFrom):
                groups = self._from_groups(node)
            else:
                groups = self._import_groups(node, chain_targets if first_plain else set())
                first_plain = False
            if groups is None:
                continue
            self._replace_statement(node, groups)

    def _comments(self, node: _Import) -> tuple[dict[int, str], dict[int, list[str]], list[str]]:
        """Comments inside a multi-line import: after an alias, on lines before one, or elsewhere."""
        after: dict[int, str] = {}
        before: dict[int, list[str]] = {}
        other: list[str] = []
        where = self.positions[node]
        if where.end.line == where.start.line or isinstance(node.names, cst.ImportStar):
            return after, before, other
        ends = [self.positions[a.asname.name if a.asname else a.name].end.line for a in node.names]
        starts = [self.positions[a].start.line for a in node.names]
        lines = self.lines[where.start.line - 1 : where.end.line]
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

    def _from_groups(self, node: cst.ImportFrom) -> list[_Group] | None:
        module = dotted(node.module) or ""
        after, before, _other = self._comments(node)
        leftover = _Group("from", module, leftover=True)
        groups: dict[tuple[str, str], _Group] = {}
        changed = False
        at = self.position(node)
        if isinstance(node.names, cst.ImportStar):
            target = module_target(module)
            if isinstance(target, str):
                groups[("from", target)] = _Group("from", target, ["*"])
                self.distributions.add(DISTRIBUTIONS[target])
                self._note(at, f"from {module} import *", f"now from {target} import *: check the names you use")
                return list(groups.values())
            self._unmapped(at, f"from {module} import *", target.why)
            return None
        unmapped: list[tuple[cst.ImportAlias, str]] = []
        for index, alias in enumerate(node.names):
            name = dotted(alias.name) or ""
            local = _alias_local(alias)
            asname = _asname(alias)
            comment, pre = after.get(index), before.get(index, [])
            full = f"{module}.{name}"
            if full in MODULE_PATHS:
                target = module_target(full)
                assert isinstance(target, str)
                item = target if local == target else f"{target} as {local}"
                groups.setdefault(("import", item), _Group("import", "")).add(item, comment, pre)
                self.distributions.add(DISTRIBUTIONS[target])
                changed = True
                continue
            binding = self.bindings[local]
            result = binding.result
            if local in self.removed or local in self.relocated:
                changed = True
                continue
            if isinstance(result, NotOffered):
                leftover.add(name if not asname else f"{name} as {asname}", comment, pre)
                unmapped.append((alias, "not offered, because " + result.why))
                continue
            changed = True
            self.distributions.add(result.distribution)
            if asname:
                item = result.name if asname == result.name else f"{result.name} as {asname}"
            elif local in self.renames or result.name == name:
                item = result.name
            else:
                item = f"{result.name} as {name}"
            groups.setdefault(("from", result.module), _Group("from", result.module)).add(item, comment, pre)
        for alias, why in unmapped:  # a rewritten statement is reported on its (new) first line
            self._unmapped(at if changed else alias, dotted(alias.name) or "", why)
        if not changed:
            return None
        return ([leftover] if leftover.items else []) + list(groups.values())

    def _import_groups(self, node: cst.Import, chain_targets: set[str]) -> list[_Group] | None:
        keep = _Group("import", "")
        leftover = _Group("import", "", leftover=True)
        out = _Group("import", "")
        changed = False
        unmapped: list[tuple[cst.ImportAlias, str, str]] = []
        for alias in node.names:
            name = dotted(alias.name) or ""
            asname = _asname(alias)
            text = name + (f" as {asname}" if asname else "")
            if not is_reference_module(name):
                keep.add(text, None, [])
                continue
            target = module_target(name)
            if isinstance(target, NotOffered):
                if asname is None and chain_targets:
                    changed = True  # `import osmosis_ai` whose uses were all rewritten
                    continue
                leftover.add(text, None, [])
                unmapped.append((alias, f"import {name}", "not offered, because " + target.why))
                continue
            changed = True
            self.distributions.add(DISTRIBUTIONS[target])
            if asname:
                out.add(target if asname == target else f"{target} as {asname}", None, [])
            else:
                out.add(target, None, [])
        for target in sorted(chain_targets):
            out.add(target, None, [])
        for alias, subject, why in unmapped:
            self._unmapped(self.position(node) if changed else alias, subject, why)
        if not changed:
            return None
        return [g for g in (leftover, keep, out) if g.items]

    def _rewrite_chains(self) -> set[str]:
        """``osmosis_ai.rollout.X`` written out in full (after ``import osmosis_ai.rollout``)."""
        targets: set[str] = set()
        if not self.plain_modules or "osmosis_ai" in self.names[1]:
            return targets
        for node in self.nodes:
            if not isinstance(node, cst.Attribute):
                continue
            path = dotted(node)
            parent = self.parents.get(node)
            if path is None or path not in MODULE_PATHS:
                continue
            if isinstance(parent, cst.Attribute) and dotted(parent) in MODULE_PATHS:
                continue
            target = module_target(path)
            if isinstance(target, NotOffered):
                self._unmapped(node, path, target.why)
                continue
            self.change(node, _replace_expression(cst.parse_expression(target)))
            targets.add(target)
            self.distributions.add(DISTRIBUTIONS[target])
            if isinstance(parent, cst.Attribute) and parent.value is node:
                self._rename_attribute(parent, path)
        return targets

    def _rename_attribute(self, node: cst.Attribute, module: str) -> None:
        result = resolve_name(module, node.attr.value)
        if isinstance(result, NotOffered):
            self._unmapped(node, node.attr.value, "not offered, because " + result.why)
            return
        self.distributions.add(result.distribution)
        if result.name != node.attr.value:
            self.renamed_attributes.add(node)
            new = result.name
            self.change(node, lambda _o, updated: updated.with_changes(attr=updated.attr.with_changes(value=new)))

    def _replace_statement(self, node: _Import, groups: list[_Group]) -> None:
        line = self.parents.get(node)
        assert isinstance(line, cst.SimpleStatementLine | cst.SimpleStatementSuite)
        own_line = isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
        if not groups:
            if own_line:
                self.dropped.add(line)
            elif len(line.body) == 1:
                self.change(node, lambda _o, _u: cst.Pass())
            else:
                self.change(node, lambda _o, _u: cst.RemoveFromParent())
                self._keep_semicolons(line)
            return
        start = self.positions[node].start
        indent = self.lines[start.line - 1][: start.column]
        multiline = self.positions[node].end.line != start.line
        names = node.names
        if multiline and not isinstance(names, cst.ImportStar):
            first = self.positions[names[0]].start.line
            text = self.lines[first - 1]
            item_indent = text[: len(text) - len(text.lstrip(" \t"))]
            item_indent = item_indent[len(indent) :] if item_indent.startswith(indent) else item_indent
        else:
            item_indent = "    "
        _after, _before, other = self._comments(node)
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
            self.expanded[line] = list(cst.parse_module("\n".join(texts) + end + "\n").body)
            return
        replacement = cst.parse_statement("; ".join(texts) + "\n")
        assert isinstance(replacement, cst.SimpleStatementLine)
        self.change(node, lambda _o, _u: cst.FlattenSentinel(replacement.body))
        self._keep_semicolons(line)

    def _keep_semicolons(self, line: cst.SimpleStatementLine | cst.SimpleStatementSuite) -> None:
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

        self.change(line, fix)  # idempotent: twice for a line holding two imports is the same

    # -- names ------------------------------------------------------------------------------------

    def _rewrite_names(self) -> None:
        for old, new in self.renames.items():
            binding = self.bindings[old]
            if old in self.removed:
                continue
            for use in self.uses(old, at=binding.statement):
                self.change(use, _rename(new))
            self._note(
                self.position(binding.statement), f"{old} -> {new}", "renamed where used (osmosis's name for it)"
            )
        for node in self.nodes:
            if (
                isinstance(node, cst.Attribute)
                and isinstance(node.value, cst.Name)
                and node.value.value in self.module_aliases
            ):
                self._rename_attribute(node, self.module_aliases[node.value.value])

    def _rewrite_context_attributes(self) -> None:
        getters = {b.local for b in self.bindings.values() if b.name == "get_rollout_context"}
        classes = {b.local for b in self.bindings.values() if b.name == "RolloutContext"}
        if not getters and not classes and not self.module_aliases:
            return

        def is_getter_call(node: cst.CSTNode | None) -> bool:
            return isinstance(node, cst.Call) and (
                (isinstance(node.func, cst.Name) and node.func.value in getters)
                or (isinstance(node.func, cst.Attribute) and self._ref_name(node.func) == "get_rollout_context")
            )

        contexts: dict[cst.CSTNode | None, set[str]] = {}
        for node in self.nodes:
            if (
                isinstance(node, cst.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0].target, cst.Name)
                and is_getter_call(node.value)
            ):
                contexts.setdefault(self.enclosing_function(node), set()).add(node.targets[0].target.value)
            elif isinstance(node, cst.With):
                for item in node.items:
                    if is_getter_call(item.item) and item.asname is not None and isinstance(item.asname.name, cst.Name):
                        contexts.setdefault(self.enclosing_function(node), set()).add(item.asname.name.value)
            elif isinstance(node, cst.Param) and node.annotation is not None:
                annotation = node.annotation.annotation
                if (isinstance(annotation, cst.Name) and annotation.value in classes) or _string(annotation) in classes:
                    contexts.setdefault(self.enclosing_function(node), set()).add(node.name.value)
        done = False
        for node in self.nodes:
            if not isinstance(node, cst.Attribute) or node.attr.value not in _CONTEXT_ATTRS:
                continue
            value = node.value
            known = is_getter_call(value) or (
                isinstance(value, cst.Name)
                and value.value in contexts.get(self.enclosing_function(node), set()) | contexts.get(None, set())
            )
            if not known:
                continue
            self.renamed_attributes.add(node)
            outer, _, inner = _CONTEXT_ATTRS[node.attr.value].rpartition(".")

            def policy(
                _o: cst.CSTNode, updated: cst.Attribute, outer: str = outer, inner: str = inner
            ) -> cst.Attribute:
                holder = cst.Attribute(value=updated.value, dot=updated.dot, attr=cst.Name(outer))
                return updated.with_changes(value=holder, dot=cst.Dot(), attr=updated.attr.with_changes(value=inner))

            self.change(node, policy)
            done = True
        if done:
            self._note(
                self.position(self.imports[0]),
                "rollout context: .chat_completions_url -> .policy.base_url, .api_key -> .policy.api_key",
                "osmosis's RolloutContext keeps the endpoint in .policy (same base URL, same key)",
            )

    # -- config classes ---------------------------------------------------------------------------

    def _config_kind(self, cls: cst.ClassDef, known: dict[str, str]) -> str | None:
        for arg in cls.bases:
            base = arg.value
            if isinstance(base, cst.Subscript):
                base = base.value
            ref = self._ref_name(base)
            if ref in _CONFIG_BASES:
                return _CONFIG_BASES[ref]
            if isinstance(base, cst.Name) and base.value in known:
                return known[base.value]
        return None

    def _decorate_config_classes(self) -> None:
        known: dict[str, str] = {}
        needs_import = False
        for cls in self.module.body:
            if not isinstance(cls, cst.ClassDef):
                continue
            kind = self._config_kind(cls, known)
            if kind is None:
                continue
            known[cls.name.value] = kind
            if kind == "workflow":
                self.config_fields.update(_fields(cls))
            if not self.decorate_configs:
                continue
            pydantic = _pydantic_features(cls)
            if cls.decorators:
                names = {
                    dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
                    for d in cls.decorators
                }
                if not names & _ATTRS_DECORATORS:
                    self._unmapped(
                        cls,
                        f"class {cls.name.value}",
                        "a decorated config class: osmosis's configs are attrs classes: "
                        "add @attrs.define(kw_only=True)",
                    )
                continue
            if pydantic:
                self._unmapped(
                    pydantic[0],
                    f"class {cls.name.value}",
                    "uses pydantic features (Field, validators, model_config): osmosis's configs are attrs classes; "
                    "rewrite them with attrs.field / attrs validators, then add @attrs.define(kw_only=True)",
                )
                continue
            decorator = cst.Decorator(decorator=cst.parse_expression("attrs.define(kw_only=True)"))
            self.change(cls, _decorate(decorator))
            self._note(
                cls,
                f"class {cls.name.value}",
                "now an attrs class (@attrs.define(kw_only=True)): osmosis's configs are attrs",
            )
            needs_import = True
        has_attrs = any(
            isinstance(s, cst.Import) and any(dotted(a.name) == "attrs" and a.asname is None for a in s.names)
            for s in _small_statements(self.module)
        )
        if needs_import and not has_attrs:
            anchor = next((s for s in self.module.body if self._holds(s, self.imports)), None)
            if anchor is None:
                anchor = next(s for s in self.module.body if self._holds(s, None))
            statement = cst.parse_statement("import attrs\n")
            insert = self.inserts.setdefault(anchor, _Insert([], []))
            insert.statements.insert(0, statement)

    def _holds(self, line: cst.BaseStatement, imports: list[_Import] | None) -> bool:
        if not isinstance(line, cst.SimpleStatementLine):
            return False
        first = line.body[0]
        return isinstance(first, _Import) and (imports is None or first in imports)

    # -- what cannot be rewritten -----------------------------------------------------------------

    def _check_usage(self) -> None:
        for node in self.nodes:
            if isinstance(node, cst.Attribute):
                ref = self._ref_name(node.value)
                attr = node.attr.value
                if ref in ENUM_MEMBERS and attr not in ENUM_MEMBERS[ref]:
                    why = ENUM_MEMBER_WHY.get(attr, f"osmosis's enum has no {attr}")
                    self._unmapped(node, f"{ref}.{attr}", why)
                elif attr in ATTRIBUTE_WHY and node not in self.renamed_attributes:
                    self._unmapped(node, f".{attr}", ATTRIBUTE_WHY[attr])
            elif isinstance(node, cst.Call):
                self._check_call(node)
            elif isinstance(node, cst.SimpleString | cst.ConcatenatedString | cst.FormattedStringText):
                if isinstance(node, cst.FormattedStringText):  # the literal text between an f-string's {fields}
                    value: str | None = node.value.replace("{{", "{").replace("}}", "}")
                else:
                    value = _string(node)
                if value is None or isinstance(self.parents.get(node), cst.ConcatenatedString):
                    continue
                if "osmosis_ai" in value and not self._is_docstring(node):
                    self._unmapped(node, repr(value)[:60], "a string naming osmosis_ai: update it by hand")
                elif value in ENV_VAR_WHY:
                    self._unmapped(node, repr(value), ENV_VAR_WHY[value])
                elif value in PLACEHOLDER_MODELS:
                    self._unmapped(
                        node,
                        f"model {value!r}",
                        "osmosis-ai's gateway ignored this name; osmosis sends it to your endpoint as it is: "
                        "use get_rollout_context().policy.model",
                    )

    def _is_docstring(self, node: cst.CSTNode) -> bool:
        expression = self.parents.get(node)
        line = self.parents.get(expression) if isinstance(expression, cst.Expr) else None
        block = self.parents.get(line) if isinstance(line, cst.SimpleStatementLine) else None
        body = getattr(block, "body", None)
        return isinstance(body, Sequence) and bool(body) and body[0] is line

    def _rename_keyword(self, argument: cst.Arg, new: str, why: str) -> None:
        old = _keyword(argument)
        self.change(argument, lambda _o, updated: updated.with_changes(keyword=cst.Name(new)))
        self._note(argument, f"{old}= -> {new}=", why)

    def _check_call(self, call: cst.Call) -> None:
        ref = self._ref_name(call.func)
        keywords = _keywords(call)
        if ref in ("AgentWorkflowOutput", "RolloutSample"):
            fields = _record_fields("RolloutSample")
            for argument in keywords:
                name = _keyword(argument)
                if name is None or name in fields:
                    continue
                if name == "trajectory_messages" and "chat_messages" in fields:
                    self._rename_keyword(argument, "chat_messages", "osmosis's chat-shaped copy of the history")
                elif name == "info":
                    self._unmapped(argument, "info=", "RolloutSample has no info: put numbers in metrics")
                elif name == "label":
                    self._unmapped(argument, "label=", "samples carry no label in osmosis: the grader gets ctx.label")
                else:
                    why = ATTRIBUTE_WHY.get(name, f"RolloutSample has no {name}")
                    self._unmapped(argument, f"{name}=", why)
        elif ref == "RolloutContext":
            self._unmapped(
                call,
                "RolloutContext(...)",
                "osmosis's is RolloutContext(rollout_id, policy: PolicyEndpoint); backends install it for you",
            )
        elif ref == "ExecutionRequest":
            fields = _record_fields("ExecutionRequest")
            given = {_keyword(a) for a in keywords}
            for argument in keywords:
                name = _keyword(argument)
                if name == "id" and "rollout_id" in fields:
                    self._rename_keyword(argument, "rollout_id", "osmosis's name for the rollout id")
                elif name is not None and name not in fields:
                    self._unmapped(
                        argument, f"ExecutionRequest({name}=...)", "osmosis's ExecutionRequest has no such field"
                    )
            if "policy" in fields and "policy" not in given and not _positional(call):
                self._unmapped(
                    call,
                    "ExecutionRequest(...)",
                    "osmosis's needs policy=PolicyEndpoint(base_url, model): the endpoint the rollout calls",
                )
        elif ref == "create_rollout_server":
            for argument in keywords:
                name = _keyword(argument)
                if name == "api_key":
                    self._rename_keyword(
                        argument,
                        "token",
                        "the server's bearer token (create_app's api_key is the policy's key, not the server's)",
                    )
                elif name in _SERVER_SETTINGS:
                    self._unmapped(
                        argument,
                        f"create_rollout_server({name}=...)",
                        f"give osmosis_server.create_app settings=ServerSettings({_SERVER_SETTINGS[name]}=...)",
                    )
                elif name not in (None, "backend", "configure_logging"):
                    self._unmapped(
                        argument,
                        f"create_rollout_server({name}=...)",
                        "osmosis_server.create_app has no such parameter",
                    )

    # -- the entrypoint's backend -----------------------------------------------------------------

    def _read_backend_call(self, *, report: bool) -> None:
        """Read the backend call; ``report`` what it cannot carry over (only in a file being migrated)."""
        unmapped = list(self.unmapped)
        self._read_backend_call_into()
        if not report:
            self.unmapped = unmapped

    def _read_backend_call_into(self) -> None:
        calls = [
            n
            for n in self.nodes
            if isinstance(n, cst.Call) and self._backend_name(n.func) in ("LocalBackend", "HarborBackend")
        ]
        if not calls:
            return
        call = calls[0]
        if len(calls) > 1:
            self._unmapped(calls[1], "a second backend", "a run config names one rollout: only the first was read")
        kind = "harbor" if self._backend_name(call.func) == "HarborBackend" else "local"
        values: dict[str, Any] = {"workflow": None, "grader": "none" if kind == "local" else None}
        harbor: dict[str, Any] = {}
        configs: dict[str, str] = {}
        for argument in _keywords(call):
            name = _keyword(argument)
            value = argument.value
            if name in ("workflow", "agent"):
                values["workflow"] = self._class_spec(value, argument, harbor_agent=kind == "harbor")
            elif name == "grader":
                spec = self._class_spec(value, argument, harbor_agent=False)
                values["grader"] = "none" if spec is None and _is_none(value) else spec
            elif name in ("workflow_config", "grader_config"):
                self._read_config_object(name, value, argument, configs)
            elif kind == "harbor" and name is not None:
                self._read_harbor_keyword(name, value, argument, harbor)
            else:
                self._unmapped(
                    argument, f"{self._backend_name(call.func)}({name}=...)", "not carried into the run config"
                )
        positional = _positional(call)
        if positional:
            self._unmapped(
                positional[0], "positional backend arguments", "give them by keyword (workflow=..., grader=...)"
            )
        if self.imports:
            self._expose_configs(configs)
        self.backend = BackendCall(
            kind=kind,
            line=self.position(call)[0],
            workflow=values["workflow"],
            grader=values["grader"],
            harbor=harbor,
        )

    def _backend_name(self, node: cst.CSTNode) -> str | None:
        ref = self._ref_name(node)
        if ref is not None:
            return ref
        name = dotted(node)
        return (
            name.rsplit(".", 1)[-1] if name in ("LocalBackend", "HarborBackend", "osmosis_core.LocalBackend") else None
        )

    def _class_spec(self, value: cst.BaseExpression, argument: cst.Arg, *, harbor_agent: bool) -> str | None:
        if isinstance(value, cst.Name) and value.value in self.bound:
            return value.value
        text = _string(value)
        if text is not None:
            if ":" in text:
                return text
            if harbor_agent:
                self._unmapped(
                    argument,
                    f"agent={text!r}",
                    "a Harbor native agent: osmosis runs AgentWorkflow classes in trials, not Harbor's own agents",
                )
                return None
            return text
        if not _is_none(value):
            self._unmapped(
                argument, f"{_keyword(argument)}=...", "not a module-level class or import path: name it in [rollout]"
            )
        return None

    def _read_config_object(
        self, name: str, value: cst.BaseExpression, argument: cst.Arg, configs: dict[str, str]
    ) -> None:
        if isinstance(value, cst.Name) and value.value in self.bound:
            if value.value != name:
                configs[name] = value.value
        elif not _is_none(value):
            self._unmapped(
                argument,
                f"{name}=...",
                f"built where `osmosis run` cannot find it: define it at module level as `{name} = ...`",
            )

    def _expose_configs(self, configs: dict[str, str]) -> None:
        todo = {k: v for k, v in configs.items() if k not in self.bound}
        if not todo:
            return
        main_guard = next(
            (
                s
                for s in self.module.body
                if isinstance(s, cst.If) and isinstance(s.test, cst.Comparison) and dotted(s.test.left) == "__name__"
            ),
            None,
        )
        statements: list[cst.BaseStatement] = list(
            cst.parse_module("".join(f"{k} = {v}\n" for k, v in todo.items())).body
        )
        comment = cst.EmptyLine(
            comment=cst.Comment("# the configs `osmosis run` and `osmosis serve` use (osmosis migrate)")
        )
        statements[0] = _with_leading(statements[0], [comment])
        if main_guard is not None:
            self.inserts[main_guard] = _Insert(statements, [cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)])
            where: _Position = self._anchor(main_guard)
        else:
            statements[0] = _with_leading(
                statements[0], [cst.EmptyLine(indent=False), cst.EmptyLine(indent=False), comment]
            )
            self.appended = statements
            where = (len(self.lines) + 1, 0)
        self._note(
            where,
            ", ".join(f"{k} = {v}" for k, v in todo.items()),
            "osmosis run reads a rollout's configs from these module-level names",
        )

    def _read_harbor_keyword(
        self, name: str, value: cst.BaseExpression, argument: cst.Arg, harbor: dict[str, Any]
    ) -> None:
        subject = f"HarborBackend({name}=...)"
        if name in ("tasks_dir", "task_dir"):
            path = self.static_path(value)
            if path is None:
                self._unmapped(argument, subject, "not a path next to main.py: set [backend.harbor] task_dir")
            else:
                harbor["task_dir"] = path
        elif name == "task_mode":
            try:
                mode = self._literal(value)
            except ValueError:
                mode = value.attr.value if isinstance(value, cst.Attribute) else ""
            if str(mode).lower() in ("template", "dataset"):
                harbor["mode"] = str(mode).lower()
            else:
                self._unmapped(argument, subject, "not a literal mode: set [backend.harbor] mode")
        elif name in ("code_dir", "user_code_dir"):
            if self.static_path(value) != PurePosixPath("."):
                self._unmapped(argument, subject, "osmosis mounts the rollout folder; set [backend.harbor] code_dir")
        elif name == "cleanup_successful_trials":
            try:
                harbor["keep_successful_trials"] = not bool(self.constant(value))
            except ValueError:
                self._unmapped(argument, subject, "not a literal: set [backend.harbor] keep_successful_trials")
        elif name == "orchestrator":
            self._read_trial_queue(value, argument, harbor)
        else:
            self._unmapped(argument, subject, _HARBOR_NOT_CARRIED.get(name, "not carried into [backend.harbor]"))

    def _read_trial_queue(self, value: cst.BaseExpression, argument: cst.Arg, harbor: dict[str, Any]) -> None:
        if not (isinstance(value, cst.Call) and (dotted(value.func) or "").endswith("TrialQueue")):
            self._unmapped(argument, "HarborBackend(orchestrator=...)", "osmosis builds Harbor's TrialQueue itself")
            return
        for item in _keywords(value):
            name = _keyword(item)
            if name == "n_concurrent":
                try:
                    harbor["n_concurrent"] = int(self.constant(item.value))
                except (ValueError, TypeError):
                    self._unmapped(
                        item, "TrialQueue(n_concurrent=...)", "not a literal: set [backend.harbor] n_concurrent"
                    )
            elif name in ("retry_config", "max_retries"):
                self._unmapped(item, f"TrialQueue({name}=...)", "set [backend.harbor] max_retries")
            else:
                self._unmapped(item, f"TrialQueue({name}=...)", "osmosis builds Harbor's TrialQueue itself")


def _replace_expression(new: cst.BaseExpression) -> _Change:
    """Put ``new`` where an expression was (in its parentheses)."""
    return lambda _original, updated: new.with_changes(lpar=updated.lpar, rpar=updated.rpar)


def _rename(new: str) -> _Change:
    return lambda _original, updated: updated.with_changes(value=new)


def _decorate(decorator: cst.Decorator) -> _Change:
    return lambda _original, updated: updated.with_changes(decorators=[decorator])


def _split_lines(text: str) -> list[str]:
    """The lines of ``text`` as Python counts them (``str.splitlines`` also splits at form feeds and
    other separators the parser does not count)."""
    return _LINE.findall(text)


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


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


def _record_fields(name: str) -> frozenset[str]:
    """The constructor keywords of one of osmosis_core's records (read from the code, not a copy)."""
    import osmosis_core

    return frozenset(a.alias or a.name for a in attrs.fields(getattr(osmosis_core, name)))


def _imports_reference(node: cst.CSTNode) -> TypeGuard[_Import]:
    """An import statement of osmosis-ai (``from osmosis_ai... import`` or ``import osmosis_ai...``)."""
    if isinstance(node, cst.ImportFrom):
        return not node.relative and is_reference_module(dotted(node.module) or "")
    return isinstance(node, cst.Import) and any(is_reference_module(dotted(a.name) or "") for a in node.names)


def _is_docstring_statement(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and _string(statement.body[0].value) is not None
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
        return (
            isinstance(inner, cst.Call)
            and dotted(inner.func) in ("Path", "pathlib.Path")
            and len(inner.args) == 1
            and dotted(inner.args[0].value) == "__file__"
        )
    if isinstance(node, cst.Call) and dotted(node.func) == "os.path.dirname" and len(node.args) == 1:
        arg = node.args[0].value
        if isinstance(arg, cst.Call) and dotted(arg.func) in ("os.path.abspath", "os.path.realpath") and arg.args:
            arg = arg.args[0].value
        return dotted(arg) == "__file__"
    return False


def _class_statements(cls: cst.ClassDef) -> Iterator[cst.CSTNode]:
    for line in cls.body.body:
        if isinstance(line, cst.SimpleStatementLine):
            yield from line.body
        else:
            yield line


def _fields(cls: cst.ClassDef) -> set[str]:
    fields = set()
    for statement in _class_statements(cls):
        if isinstance(statement, cst.AnnAssign) and isinstance(statement.target, cst.Name):
            annotation = statement.annotation.annotation
            if dotted(annotation.value if isinstance(annotation, cst.Subscript) else annotation) not in (
                "ClassVar",
                "typing.ClassVar",
            ):
                fields.add(statement.target.value)
    return fields


def _pydantic_features(cls: cst.ClassDef) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    for statement in _class_statements(cls):
        if isinstance(statement, cst.Assign | cst.AnnAssign):
            targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
            if any(dotted(t) == "model_config" for t in targets):
                found.append(statement)
            value = statement.value
            if isinstance(value, cst.Call) and (dotted(value.func) or "").split(".")[-1] in _PYDANTIC_CALLS:
                found.append(statement)
        elif isinstance(statement, cst.FunctionDef):
            for decorator in statement.decorators:
                expression = decorator.decorator
                name = dotted(expression.func if isinstance(expression, cst.Call) else expression) or ""
                if name.split(".")[-1] in _PYDANTIC_DECORATORS:
                    found.append(statement)
            if statement.name.value == "model_post_init":
                found.append(statement)
    return found
