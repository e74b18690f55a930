"""Rewriting one Python file written for osmosis-ai so it runs on osmosis.

The file is parsed with the standard library's :mod:`ast` (no new dependency), and every change is
a text edit at the exact position ``ast`` reports, so formatting and comments elsewhere stay as
they were. What it does:

* imports from ``osmosis_ai.rollout`` (and its integration, Harbor, server and client modules) go to
  ``osmosis_core``, ``osmosis_strands``, ``osmosis_openai_agents``, ``osmosis_harbor`` and
  ``osmosis_server``; renamed names (``AgentWorkflowOutput`` -> ``RolloutSample``, ...) are renamed
  where they are used, or imported under their old name when renaming is not safe;
* a name osmosis does not offer stays imported from its old module, marked, and is reported with
  its file:line and why;
* ``session=OsmosisMemorySession()`` is dropped (osmosis's model registers the sample);
* ``get_rollout_context().chat_completions_url`` / ``.api_key`` become ``.policy.base_url`` /
  ``.policy.api_key``;
* config classes written the pydantic way (``class C(AgentWorkflowConfig): x: int = 1``) get
  ``@attrs.define(kw_only=True)``, since osmosis's configs are attrs classes;
* a server script's ``uvicorn`` and ``osmosis_server`` imports move into the function that serves,
  so ``osmosis run`` can import the file without the server plugin;
* in an entrypoint, the configs given to ``LocalBackend`` / ``HarborBackend`` are exposed as the
  module-level ``workflow_config`` / ``grader_config`` that ``osmosis run`` reads.

>>> m = migrate_python("main.py", "from osmosis_ai.rollout import AgentWorkflowOutput\\nx = AgentWorkflowOutput\\n")
>>> print(m.new_text, end="")
from osmosis_core import RolloutSample
x = RolloutSample
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import PurePosixPath
from typing import Any, TypeGuard

import attrs

from osmosis_migrate.edits import Edit, Source
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
from osmosis_migrate.python_static import ModuleFacts, dotted, enclosing_function
from osmosis_migrate.records import Finding

__all__ = ["LEFTOVER_MARK", "BackendCall", "PythonAnalysis", "PythonMigration", "migrate_python"]

LEFTOVER_MARK = "# osmosis migrate: not offered by osmosis (see its MIGRATING.md)"
"""The comment on an import osmosis has no counterpart for (kept so the file fails loudly, not silently)."""

_SERVER_MODULES = frozenset({"osmosis_server"})
_CONFIG_BASES = {"AgentWorkflowConfig": "workflow", "GraderConfig": "grader"}
_PYDANTIC_CALLS = frozenset({"Field", "PrivateAttr", "ConfigDict"})
_PYDANTIC_DECORATORS = frozenset(
    {"field_validator", "model_validator", "validator", "root_validator", "computed_field", "field_serializer"}
)
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


@attrs.frozen
class BackendCall:
    """What an entrypoint's ``LocalBackend(...)`` / ``HarborBackend(...)`` call tells a run config."""

    kind: str
    """``local`` or ``harbor``."""
    line: int
    workflow: str | None = None
    grader: str | None = None
    """A class name or import path; ``"none"`` when the backend was built without a grader."""
    harbor: dict[str, Any] = attrs.field(factory=dict)
    """``[backend.harbor]`` keys read from the call (``task_dir`` relative to the rollout folder)."""


@attrs.frozen
class PythonAnalysis:
    """Facts about a file that the config and dependency migrations use."""

    workflow_config_fields: frozenset[str] = frozenset()
    """Fields of the workflow config classes the file defines (for ``[sampling]``)."""
    backend: BackendCall | None = None
    distributions: frozenset[str] = frozenset()
    """osmosis distributions the migrated imports need."""


@attrs.define
class PythonMigration:
    """The migrated text and what to tell the user about it."""

    new_text: str
    notes: list[Finding]
    unmapped: list[Finding]
    analysis: PythonAnalysis
    references: bool
    """The file imports osmosis-ai."""


@attrs.frozen
class _Binding:
    """A name bound by ``from osmosis_ai... import name [as local]``."""

    module: str
    name: str
    local: str
    result: Target | NotOffered
    alias: ast.alias


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


def migrate_python(
    rel: str,
    text: str,
    *,
    entrypoint: bool = False,
    decorate_configs: bool = True,
    rollout_dir: PurePosixPath | None = None,
) -> PythonMigration:
    """Migrate one file's text. ``rel`` names it in findings; ``entrypoint`` marks a rollout's main module.

    ``decorate_configs`` adds ``@attrs.define`` to config subclasses (needed unless osmosis's config
    bases turn subclasses into attrs classes themselves).
    """
    references = "osmosis_ai" in text
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        problem = Finding(rel, exc.lineno, "syntax error", f"cannot parse ({exc.msg}); fix it and migrate again")
        return PythonMigration(text, [], [problem] if references else [], PythonAnalysis(), references)
    return _Migrator(rel, text, tree, entrypoint=entrypoint, decorate_configs=decorate_configs).run()


class _Migrator:
    def __init__(self, rel: str, text: str, tree: ast.Module, *, entrypoint: bool, decorate_configs: bool) -> None:
        self.rel = rel
        self.src = Source(text)
        self.tree = tree
        self.entrypoint = entrypoint
        self.decorate_configs = decorate_configs
        self.facts = ModuleFacts(tree)
        self.edits: list[Edit] = []
        self.notes: list[tuple[int, str, str]] = []
        self.unmapped: list[tuple[int, str, str]] = []
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.imports: list[ast.Import | ast.ImportFrom] = []
        self.bindings: dict[str, _Binding] = {}
        self.module_aliases: dict[str, str] = {}
        self.plain_modules: list[str] = []
        self.distributions: set[str] = set()
        self.renames: dict[str, str] = {}
        self.removed: set[str] = set()
        self.relocated: set[str] = set()
        self.relocations: dict[ast.FunctionDef | ast.AsyncFunctionDef, list[str]] = {}
        self.config_fields: set[str] = set()
        self.backend: BackendCall | None = None
        self._collect_usage()

    # -- facts ------------------------------------------------------------------------------------

    def _collect_usage(self) -> None:
        self.loads: dict[str, list[ast.Name]] = {}
        self.rebound: set[str] = set()
        self.identifiers: set[str] = set()
        self.annotation_strings: list[str] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name):
                self.identifiers.add(node.id)
                if isinstance(node.ctx, ast.Load):
                    self.loads.setdefault(node.id, []).append(node)
                else:
                    self.rebound.add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.identifiers.add(node.name)
                self.rebound.add(node.name)
                annotations = [node.returns] if not isinstance(node, ast.ClassDef) else []
                if not isinstance(node, ast.ClassDef):
                    args = node.args
                    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                        if arg is not None:
                            self.identifiers.add(arg.arg)
                            self.rebound.add(arg.arg)
                            annotations.append(arg.annotation)
                for annotation in annotations:
                    self._strings_in(annotation)
            elif isinstance(node, ast.AnnAssign):
                self._strings_in(node.annotation)
            elif isinstance(node, ast.Global | ast.Nonlocal):
                self.rebound.update(node.names)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.rebound.add(node.name)
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                self._strings_in(node.value)
            elif _imports_reference(node):
                self.imports.append(node)
            if isinstance(node, ast.Import | ast.ImportFrom) and node not in self.imports:
                for alias in node.names:
                    self.identifiers.add(alias.asname or alias.name.split(".")[0])
        self.imports.sort(key=lambda n: (n.lineno, n.col_offset))

    def _strings_in(self, node: ast.AST | None) -> None:
        if node is None:
            return
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                self.annotation_strings.append(sub.value)

    def _note(self, node: ast.AST | int, subject: str, why: str) -> None:
        offset = node if isinstance(node, int) else self.src.start(node)
        self.notes.append((offset, subject, why))

    def _unmapped(self, node: ast.AST | int, subject: str, why: str) -> None:
        offset = node if isinstance(node, int) else self.src.start(node)
        if (offset, subject, why) not in self.unmapped:
            self.unmapped.append((offset, subject, why))

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
        text = self.src.apply(self.edits) if self.edits else self.src.text
        new_src = Source(text)

        def finding(item: tuple[int, str, str]) -> Finding:
            offset, subject, why = item
            return Finding(self.rel, new_src.line_of(self.src.map_offset(self.edits, offset)), subject, why)

        return PythonMigration(
            new_text=text,
            notes=[finding(n) for n in sorted(self.notes)],
            unmapped=[finding(u) for u in sorted(self.unmapped)],
            analysis=PythonAnalysis(frozenset(self.config_fields), self.backend, frozenset(self.distributions)),
            references=bool(self.imports) or "osmosis_ai" in self.src.text,
        )

    def _register_bindings(self) -> None:
        for node in self.imports:
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                for alias in node.names:
                    local = alias.asname or alias.name
                    full = f"{module}.{alias.name}"
                    if full in MODULE_PATHS:
                        self.module_aliases[local] = full
                    elif alias.name != "*":
                        self.bindings[local] = _Binding(
                            module, alias.name, local, resolve_name(module, alias.name), alias
                        )
            else:
                for alias in node.names:
                    if not is_reference_module(alias.name):
                        continue
                    if alias.asname:
                        self.module_aliases[alias.asname] = alias.name
                    else:
                        self.plain_modules.append(alias.name)

    def _ref_name(self, node: ast.AST) -> str | None:
        """The osmosis-ai name an expression refers to (a bound name or ``alias.Name``), if any."""
        if isinstance(node, ast.Name) and node.id in self.bindings:
            return self.bindings[node.id].name
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            if base is not None and (base in self.module_aliases or base in MODULE_PATHS):
                return node.attr
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
            taken = new in self.identifiers and same.get(new) != b.result
            in_strings = any(b.name in s for s in self.annotation_strings)
            if b.name not in self.rebound and not in_strings and not taken:
                self.renames[b.local] = new

    # -- OsmosisMemorySession ---------------------------------------------------------------------

    def _remove_memory_sessions(self) -> None:
        locals_ = [
            b.local for b in self.bindings.values() if b.name == "OsmosisMemorySession" and "openai_agents" in b.module
        ]
        for local in locals_:
            uses = self.loads.get(local, [])
            removed_all = True
            for use in uses:
                call = self.parents.get(use)
                if not (isinstance(call, ast.Call) and call.func is use):
                    removed_all = False
                    self._unmapped(use, "OsmosisMemorySession", "used other than as a session=... argument: remove it")
                    continue
                if not self._drop_session(call):
                    removed_all = False
            if removed_all and uses:
                self.removed.add(local)

    def _drop_session(self, call: ast.Call) -> bool:
        parent = self.parents.get(call)
        why = "dropped: OsmosisRolloutModel, the model of OsmosisAgent, registers the sample itself"
        if isinstance(parent, ast.keyword) and parent.arg == "session":
            outer = self.parents.get(parent)
            if isinstance(outer, ast.Call):
                self._remove_keyword(outer, parent)
                self._note(parent, "session=OsmosisMemorySession()", why)
                return True
        assign = parent
        if (
            isinstance(assign, ast.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Name)
            and self.src.alone_on_lines(assign)
        ):
            var = assign.targets[0].id
            function = enclosing_function(assign, self.parents)
            scope: ast.AST = function if function is not None else self.tree
            uses = [
                n
                for n in ast.walk(scope)
                if isinstance(n, ast.Name) and n.id == var and isinstance(n.ctx, ast.Load) and n is not call.func
            ]
            keywords = [self.parents.get(u) for u in uses]
            if len(uses) == 1 and isinstance(keywords[0], ast.keyword) and keywords[0].arg == "session":
                keyword = keywords[0]
                outer = self.parents.get(keyword)
                if isinstance(outer, ast.Call):
                    start = self.src.line_start(self.src.start(assign))
                    self.edits.append(Edit(start, self.src.line_end(self.src.end(assign)), ""))
                    self._remove_keyword(outer, keyword)
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

    def _remove_keyword(self, call: ast.Call, keyword: ast.keyword) -> None:
        text = self.src.text
        start, end = self.src.start(keyword), self.src.end(keyword)
        after = end
        while after < len(text) and text[after] in " \t":
            after += 1
        if after < len(text) and text[after] == ",":
            line_end = self.src.line_end(after)
            rest = text[after + 1 : line_end]
            if not text[self.src.line_start(start) : start].strip() and not rest.strip():
                self.edits.append(Edit(self.src.line_start(start), line_end, ""))
                return
            after += 1
            while after < len(text) and text[after] in " \t":
                after += 1
            self.edits.append(Edit(start, after, ""))
            return
        before = start
        while before > 0 and text[before - 1] in " \t\r\n":
            before -= 1
        if before > 0 and text[before - 1] == ",":
            self.edits.append(Edit(before - 1, end, ""))
        else:
            self.edits.append(Edit(start, end, ""))

    # -- server imports into the serving function -------------------------------------------------

    def _top_function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        found: ast.FunctionDef | ast.AsyncFunctionDef | None = None
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef):
                found = current
            current = self.parents.get(current)
        return found if found is not None and self.parents.get(found) is self.tree else None

    def _relocatable(self, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef] | None:
        functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        for use in self.loads.get(name, []):
            function = self._top_function(use)
            if function is None or function.body[0].lineno == function.lineno:
                return None
            if function not in functions:
                functions.append(function)
        return functions or None

    def _plan_relocation(self) -> None:
        server = [
            b
            for b in self.bindings.values()
            if isinstance(b.result, Target) and b.result.module in _SERVER_MODULES and self._top_level(b.alias)
        ]
        if not server:
            return
        lines: dict[str, tuple[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]] = {}
        for b in server:
            assert isinstance(b.result, Target)
            statement = self.parents.get(b.alias)
            local = self.renames.get(b.local, b.local)
            functions = self._relocatable(b.local)
            if functions is None or statement is None or not self.src.alone_on_lines(statement):
                self._note(
                    b.alias,
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
        for stmt in self.tree.body:
            if (
                isinstance(stmt, ast.Import)
                and len(stmt.names) == 1
                and stmt.names[0].name == "uvicorn"
                and self.src.alone_on_lines(stmt)
            ):
                local = stmt.names[0].asname or "uvicorn"
                functions = self._relocatable(local)
                if functions:
                    text = "import uvicorn" + (f" as {local}" if local != "uvicorn" else "")
                    lines[local] = (text, functions)
                    start, end = self.src.start(stmt), self.src.end(stmt)
                    self.edits.append(Edit(self.src.line_start(start), self.src.line_end(end), ""))
        per_function: dict[ast.FunctionDef | ast.AsyncFunctionDef, list[str]] = {}
        for text, functions in lines.values():
            for function in functions:
                per_function.setdefault(function, []).append(text)
        for function, imports in per_function.items():
            first = function.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and len(function.body) > 1
            ):
                first = function.body[1]
            at = self.src.line_start(self.src.start(first))
            indent = self.src.indent_of(self.src.start(first))
            block = "".join(f"{indent}{line}\n" for line in sorted(imports, key=lambda s: (s.startswith("from"), s)))
            self.edits.append(Edit(at, at, block + "\n"))
            self._note(
                function,
                f"{function.name}(): " + ", ".join(sorted(imports)),
                "the server imports moved into the function that serves, so `osmosis run` imports this file without "
                "the server plugin (osmosis serve CONFIG replaces `python main.py`)",
            )

    def _top_level(self, alias: ast.alias) -> bool:
        return self.parents.get(self.parents.get(alias) or alias) is self.tree

    # -- import statements ------------------------------------------------------------------------

    def _rewrite_imports(self) -> None:
        chain_targets = self._rewrite_chains()
        first_plain = True
        for node in self.imports:
            if isinstance(node, ast.ImportFrom):
                groups = self._from_groups(node)
            else:
                groups = self._import_groups(node, chain_targets if first_plain else set())
                first_plain = False
            if groups is None:
                continue
            self._replace_statement(node, groups)

    def _comments(self, node: ast.stmt) -> tuple[dict[int, str], dict[int, list[str]], list[str]]:
        """Comments inside a multi-line import: after an alias, on lines before one, or elsewhere."""
        after: dict[int, str] = {}
        before: dict[int, list[str]] = {}
        other: list[str] = []
        if node.end_lineno == node.lineno:
            return after, before, other
        aliases = node.names  # type: ignore[attr-defined]
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(self.src.segment(node)).readline))
        except (tokenize.TokenError, SyntaxError):
            return after, before, other
        for tok in tokens:
            if tok.type != tokenize.COMMENT:
                continue
            line = node.lineno + tok.start[0] - 1
            index = next((i for i, a in enumerate(aliases) if a.end_lineno == line), None)
            if index is not None:
                after[index] = tok.string
                continue
            following = next((i for i, a in enumerate(aliases) if a.lineno > line), None)
            if following is not None and line != node.lineno:
                before.setdefault(following, []).append(tok.string)
            else:
                other.append(tok.string)
        return after, before, other

    def _from_groups(self, node: ast.ImportFrom) -> list[_Group] | None:
        module = node.module or ""
        after, before, _other = self._comments(node)
        leftover = _Group("from", module, leftover=True)
        groups: dict[tuple[str, str], _Group] = {}
        changed = False
        for index, alias in enumerate(node.names):
            local = alias.asname or alias.name
            comment, pre = after.get(index), before.get(index, [])
            if alias.name == "*":
                target = module_target(module)
                if isinstance(target, str):
                    groups.setdefault(("from", target), _Group("from", target)).add("*", comment, pre)
                    self.distributions.add(DISTRIBUTIONS[target])
                    self._note(node, f"from {module} import *", f"now from {target} import *: check the names you use")
                    changed = True
                else:
                    leftover.add("*", comment, pre)
                    self._unmapped(node, f"from {module} import *", target.why)
                continue
            full = f"{module}.{alias.name}"
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
                leftover.add(alias.name if not alias.asname else f"{alias.name} as {alias.asname}", comment, pre)
                self._unmapped(alias, alias.name, "not offered, because " + result.why)
                continue
            changed = True
            self.distributions.add(result.distribution)
            if alias.asname:
                item = result.name if alias.asname == result.name else f"{result.name} as {alias.asname}"
            elif local in self.renames or result.name == alias.name:
                item = result.name
            else:
                item = f"{result.name} as {alias.name}"
            groups.setdefault(("from", result.module), _Group("from", result.module)).add(item, comment, pre)
        if not changed:
            return None
        return ([leftover] if leftover.items else []) + list(groups.values())

    def _import_groups(self, node: ast.Import, chain_targets: set[str]) -> list[_Group] | None:
        keep = _Group("import", "")
        leftover = _Group("import", "", leftover=True)
        out = _Group("import", "")
        changed = False
        for alias in node.names:
            text = alias.name + (f" as {alias.asname}" if alias.asname else "")
            if not is_reference_module(alias.name):
                keep.add(text, None, [])
                continue
            target = module_target(alias.name)
            if isinstance(target, NotOffered):
                if alias.asname is None and chain_targets:
                    changed = True  # `import osmosis_ai` whose uses were all rewritten
                    continue
                leftover.add(text, None, [])
                self._unmapped(alias, f"import {alias.name}", "not offered, because " + target.why)
                continue
            changed = True
            self.distributions.add(DISTRIBUTIONS[target])
            if alias.asname:
                out.add(target if alias.asname == target else f"{target} as {alias.asname}", None, [])
            else:
                out.add(target, None, [])
        for target in sorted(chain_targets):
            out.add(target, None, [])
        if not changed:
            return None
        return [g for g in (leftover, keep, out) if g.items]

    def _rewrite_chains(self) -> set[str]:
        """``osmosis_ai.rollout.X`` written out in full (after ``import osmosis_ai.rollout``)."""
        targets: set[str] = set()
        if not self.plain_modules or "osmosis_ai" in self.rebound:
            return targets
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Attribute):
                continue
            path = dotted(node)
            parent = self.parents.get(node)
            if path is None or path not in MODULE_PATHS:
                continue
            if isinstance(parent, ast.Attribute) and dotted(parent) in MODULE_PATHS:
                continue
            target = module_target(path)
            if isinstance(target, NotOffered):
                self._unmapped(node, path, target.why)
                continue
            self.edits.append(Edit(self.src.start(node), self.src.end(node), target))
            targets.add(target)
            self.distributions.add(DISTRIBUTIONS[target])
            if isinstance(parent, ast.Attribute):
                self._rename_attribute(parent, path)
        return targets

    def _rename_attribute(self, node: ast.Attribute, module: str) -> None:
        result = resolve_name(module, node.attr)
        if isinstance(result, NotOffered):
            self._unmapped(node, node.attr, "not offered, because " + result.why)
            return
        self.distributions.add(result.distribution)
        if result.name != node.attr:
            end = self.src.end(node)
            start = end - len(node.attr)
            if self.src.text[start:end] == node.attr:
                self.edits.append(Edit(start, end, result.name))

    def _replace_statement(self, node: ast.stmt, groups: list[_Group]) -> None:
        start, end = self.src.start(node), self.src.end(node)
        alone = self.src.alone_on_lines(node)
        if not groups:
            if alone:
                self.edits.append(Edit(self.src.line_start(start), self.src.line_end(end), ""))
            else:
                self.edits.append(Edit(start, end, "pass"))
            return
        indent = self.src.text[self.src.line_start(start) : start]
        separator = "\n" + indent if not indent.strip() else "; "
        multiline = node.end_lineno != node.lineno
        names = node.names  # type: ignore[attr-defined]
        item_indent = self.src.indent_of(self.src.start(names[0])) if multiline else indent + "    "
        _after, _before, other = self._comments(node)
        texts = []
        for position, group in enumerate(groups):
            head = f"from {group.module} import " if group.kind == "from" else "import "
            mark = f"  {LEFTOVER_MARK}" if group.leftover else ""
            if multiline and group.kind == "from" and separator != "; ":
                extra = "".join(f"  {c}" for c in other) if position == 0 else ""
                body: list[str] = []
                for i, item in enumerate(group.items):
                    body.extend(f"{item_indent}{c}\n" for c in group.before.get(i, []))
                    comment = f"  {group.comments[i]}" if i in group.comments else ""
                    body.append(f"{item_indent}{item},{comment}\n")
                texts.append(f"{head}({mark}{extra}\n{''.join(body)}{indent})")
            else:
                comments = [group.comments[i] for i in sorted(group.comments)]
                if separator == "; ":
                    mark, comments = "", []
                tail = "".join(f"  {c}" for c in comments) if comments and not mark else ""
                texts.append(f"{head}{', '.join(group.items)}{mark}{tail}")
        self.edits.append(Edit(start, end, separator.join(texts)))

    # -- names ------------------------------------------------------------------------------------

    def _rewrite_names(self) -> None:
        for old, new in self.renames.items():
            binding = self.bindings[old]
            if old in self.removed:
                continue
            for use in self.loads.get(old, []):
                self.edits.append(Edit(self.src.start(use), self.src.end(use), new))
            self._note(binding.alias, f"{old} -> {new}", "renamed where used (osmosis's name for it)")
        for node in ast.walk(self.tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in self.module_aliases
            ):
                self._rename_attribute(node, self.module_aliases[node.value.id])

    def _rewrite_context_attributes(self) -> None:
        getters = {b.local for b in self.bindings.values() if b.name == "get_rollout_context"}
        classes = {b.local for b in self.bindings.values() if b.name == "RolloutContext"}
        if not getters and not classes and not self.module_aliases:
            return

        def is_getter_call(node: ast.AST) -> bool:
            return isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Name) and node.func.id in getters)
                or (isinstance(node.func, ast.Attribute) and self._ref_name(node.func) == "get_rollout_context")
            )

        contexts: dict[ast.AST | None, set[str]] = {}
        for node in ast.walk(self.tree):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and is_getter_call(node.value)
            ):
                contexts.setdefault(enclosing_function(node, self.parents), set()).add(node.targets[0].id)
            elif isinstance(node, ast.With | ast.AsyncWith):
                for item in node.items:
                    if is_getter_call(item.context_expr) and isinstance(item.optional_vars, ast.Name):
                        contexts.setdefault(enclosing_function(node, self.parents), set()).add(item.optional_vars.id)
            elif isinstance(node, ast.arg) and node.annotation is not None:
                annotation = node.annotation
                if (isinstance(annotation, ast.Name) and annotation.id in classes) or (
                    isinstance(annotation, ast.Constant) and annotation.value in classes
                ):
                    contexts.setdefault(enclosing_function(node, self.parents), set()).add(node.arg)
        done = False
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Attribute) or node.attr not in _CONTEXT_ATTRS:
                continue
            value = node.value
            known = is_getter_call(value) or (
                isinstance(value, ast.Name)
                and value.id in contexts.get(enclosing_function(node, self.parents), set()) | contexts.get(None, set())
            )
            if not known:
                continue
            end = self.src.end(node)
            start = end - len(node.attr)
            if self.src.text[start:end] == node.attr:
                self.edits.append(Edit(start, end, _CONTEXT_ATTRS[node.attr]))
                done = True
        if done:
            self._note(
                self.imports[0],
                "rollout context: .chat_completions_url -> .policy.base_url, .api_key -> .policy.api_key",
                "osmosis's RolloutContext keeps the endpoint in .policy (same base URL, same key)",
            )

    # -- config classes ---------------------------------------------------------------------------

    def _config_kind(self, cls: ast.ClassDef, known: dict[str, str]) -> str | None:
        for base in cls.bases:
            if isinstance(base, ast.Subscript):
                base = base.value
            ref = self._ref_name(base)
            if ref in _CONFIG_BASES:
                return _CONFIG_BASES[ref]
            if isinstance(base, ast.Name) and base.id in known:
                return known[base.id]
        return None

    def _config_classes(self) -> list[tuple[ast.ClassDef, str]]:
        known: dict[str, str] = {}
        found = []
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef):
                kind = self._config_kind(node, known)
                if kind is not None:
                    known[node.name] = kind
                    found.append((node, kind))
        return found

    def _decorate_config_classes(self) -> None:
        needs_import = False
        for cls, kind in self._config_classes():
            if kind == "workflow":
                self.config_fields.update(_fields(cls))
            if not self.decorate_configs:
                continue
            pydantic = _pydantic_features(cls)
            if cls.decorator_list:
                names = {dotted(d.func if isinstance(d, ast.Call) else d) for d in cls.decorator_list}
                if not names & {"attrs.define", "attrs.frozen", "define", "frozen", "attr.s", "attrs.mutable"}:
                    self._unmapped(
                        cls,
                        f"class {cls.name}",
                        "a decorated config class: osmosis's configs are attrs classes: "
                        "add @attrs.define(kw_only=True)",
                    )
                continue
            if pydantic:
                self._unmapped(
                    pydantic[0],
                    f"class {cls.name}",
                    "uses pydantic features (Field, validators, model_config): osmosis's configs are attrs classes; "
                    "rewrite them with attrs.field / attrs validators, then add @attrs.define(kw_only=True)",
                )
                continue
            at = self.src.line_start(self.src.start(cls))
            indent = self.src.indent_of(self.src.start(cls))
            self.edits.append(Edit(at, at, f"{indent}@attrs.define(kw_only=True)\n"))
            self._note(
                cls,
                f"class {cls.name}",
                "now an attrs class (@attrs.define(kw_only=True)): osmosis's configs are attrs",
            )
            needs_import = True
        if needs_import and not any(
            isinstance(s, ast.Import) and any(a.name == "attrs" and not a.asname for a in s.names)
            for s in self.tree.body
        ):
            anchor = next((s for s in self.tree.body if s in self.imports), None)
            if anchor is None:
                anchor = next(s for s in self.tree.body if isinstance(s, ast.Import | ast.ImportFrom))
            at = self.src.line_start(self.src.start(anchor))
            self.edits.append(Edit(at, at, "import attrs\n"))

    # -- what cannot be rewritten -----------------------------------------------------------------

    def _check_usage(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute):
                ref = self._ref_name(node.value)
                if ref in ENUM_MEMBERS and node.attr not in ENUM_MEMBERS[ref]:
                    why = ENUM_MEMBER_WHY.get(node.attr, f"osmosis's enum has no {node.attr}")
                    self._unmapped(node, f"{ref}.{node.attr}", why)
                elif node.attr in ATTRIBUTE_WHY and not self._rewritten(node):
                    self._unmapped(node, f".{node.attr}", ATTRIBUTE_WHY[node.attr])
            elif isinstance(node, ast.Call):
                self._check_call(node)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if "osmosis_ai" in node.value and not _is_docstring(node, self.parents):
                    self._unmapped(node, repr(node.value)[:60], "a string naming osmosis_ai: update it by hand")
                elif node.value in ENV_VAR_WHY:
                    self._unmapped(node, repr(node.value), ENV_VAR_WHY[node.value])
                elif node.value in PLACEHOLDER_MODELS:
                    self._unmapped(
                        node,
                        f"model {node.value!r}",
                        "osmosis-ai's gateway ignored this name; osmosis sends it to your endpoint as it is: "
                        "use get_rollout_context().policy.model",
                    )

    def _rewritten(self, node: ast.Attribute) -> bool:
        end = self.src.end(node)
        return any(e.start == end - len(node.attr) and e.end == end for e in self.edits)

    def _rename_keyword(self, keyword: ast.keyword, new: str, why: str) -> None:
        assert keyword.arg is not None
        start = self.src.start(keyword)
        if self.src.text[start : start + len(keyword.arg)] == keyword.arg:
            self.edits.append(Edit(start, start + len(keyword.arg), new))
            self._note(keyword, f"{keyword.arg}= -> {new}=", why)

    def _check_call(self, call: ast.Call) -> None:
        ref = self._ref_name(call.func)
        if ref in ("AgentWorkflowOutput", "RolloutSample"):
            fields = _record_fields("RolloutSample")
            for keyword in call.keywords:
                if keyword.arg is None or keyword.arg in fields:
                    continue
                if keyword.arg == "trajectory_messages" and "chat_messages" in fields:
                    self._rename_keyword(keyword, "chat_messages", "osmosis's chat-shaped copy of the history")
                elif keyword.arg == "info":
                    self._unmapped(keyword, "info=", "RolloutSample has no info: put numbers in metrics")
                elif keyword.arg == "label":
                    self._unmapped(keyword, "label=", "samples carry no label in osmosis: the grader gets ctx.label")
                else:
                    why = ATTRIBUTE_WHY.get(keyword.arg, f"RolloutSample has no {keyword.arg}")
                    self._unmapped(keyword, f"{keyword.arg}=", why)
        elif ref == "RolloutContext":
            self._unmapped(
                call,
                "RolloutContext(...)",
                "osmosis's is RolloutContext(rollout_id, policy: PolicyEndpoint); backends install it for you",
            )
        elif ref == "ExecutionRequest":
            fields = _record_fields("ExecutionRequest")
            given = {k.arg for k in call.keywords}
            for keyword in call.keywords:
                if keyword.arg == "id" and "rollout_id" in fields:
                    self._rename_keyword(keyword, "rollout_id", "osmosis's name for the rollout id")
                elif keyword.arg is not None and keyword.arg not in fields:
                    self._unmapped(
                        keyword, f"ExecutionRequest({keyword.arg}=...)", "osmosis's ExecutionRequest has no such field"
                    )
            if "policy" in fields and "policy" not in given and not call.args:
                self._unmapped(
                    call,
                    "ExecutionRequest(...)",
                    "osmosis's needs policy=PolicyEndpoint(base_url, model): the endpoint the rollout calls",
                )
        elif ref == "create_rollout_server":
            for keyword in call.keywords:
                if keyword.arg == "api_key":
                    self._rename_keyword(
                        keyword,
                        "token",
                        "the server's bearer token (create_app's api_key is the policy's key, not the server's)",
                    )
                elif keyword.arg in _SERVER_SETTINGS:
                    self._unmapped(
                        keyword,
                        f"create_rollout_server({keyword.arg}=...)",
                        f"give osmosis_server.create_app settings=ServerSettings({_SERVER_SETTINGS[keyword.arg]}=...)",
                    )
                elif keyword.arg not in (None, "backend", "configure_logging"):
                    self._unmapped(
                        keyword,
                        f"create_rollout_server({keyword.arg}=...)",
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
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Call) and self._backend_name(n.func) in ("LocalBackend", "HarborBackend")
        ]
        if not calls:
            return
        calls.sort(key=lambda n: (n.lineno, n.col_offset))
        call = calls[0]
        if len(calls) > 1:
            self._unmapped(calls[1], "a second backend", "a run config names one rollout: only the first was read")
        kind = "harbor" if self._backend_name(call.func) == "HarborBackend" else "local"
        values: dict[str, Any] = {"workflow": None, "grader": "none" if kind == "local" else None}
        harbor: dict[str, Any] = {}
        configs: dict[str, str] = {}
        for keyword in call.keywords:
            name = keyword.arg
            value = keyword.value
            if name in ("workflow", "agent"):
                values["workflow"] = self._class_spec(value, keyword, harbor_agent=kind == "harbor")
            elif name == "grader":
                spec = self._class_spec(value, keyword, harbor_agent=False)
                values["grader"] = "none" if spec is None and _is_none(value) else spec
            elif name in ("workflow_config", "grader_config"):
                self._read_config_object(name, value, keyword, configs)
            elif kind == "harbor" and name is not None:
                self._read_harbor_keyword(name, value, keyword, harbor)
            else:
                self._unmapped(
                    keyword, f"{self._backend_name(call.func)}({name}=...)", "not carried into the run config"
                )
        if call.args:
            self._unmapped(
                call.args[0], "positional backend arguments", "give them by keyword (workflow=..., grader=...)"
            )
        if self.imports:
            self._expose_configs(configs)
        self.backend = BackendCall(
            kind=kind,
            line=call.lineno,
            workflow=values["workflow"],
            grader=values["grader"],
            harbor=harbor,
        )

    def _backend_name(self, node: ast.AST) -> str | None:
        ref = self._ref_name(node)
        if ref is not None:
            return ref
        name = dotted(node)
        return (
            name.rsplit(".", 1)[-1] if name in ("LocalBackend", "HarborBackend", "osmosis_core.LocalBackend") else None
        )

    def _class_spec(self, value: ast.expr, keyword: ast.keyword, *, harbor_agent: bool) -> str | None:
        if isinstance(value, ast.Name) and value.id in self.facts.bound:
            return value.id
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if ":" in value.value:
                return value.value
            if harbor_agent:
                self._unmapped(
                    keyword,
                    f"agent={value.value!r}",
                    "a Harbor native agent: osmosis runs AgentWorkflow classes in trials, not Harbor's own agents",
                )
                return None
            return value.value
        if not _is_none(value):
            self._unmapped(
                keyword, f"{keyword.arg}=...", "not a module-level class or import path: name it in [rollout]"
            )
        return None

    def _read_config_object(self, name: str, value: ast.expr, keyword: ast.keyword, configs: dict[str, str]) -> None:
        if isinstance(value, ast.Name) and value.id in self.facts.bound:
            if value.id != name:
                configs[name] = value.id
        elif not _is_none(value):
            self._unmapped(
                keyword,
                f"{name}=...",
                f"built where `osmosis run` cannot find it: define it at module level as `{name} = ...`",
            )

    def _expose_configs(self, configs: dict[str, str]) -> None:
        todo = {k: v for k, v in configs.items() if k not in self.facts.bound}
        if not todo:
            return
        main_guard = next(
            (
                s
                for s in self.tree.body
                if isinstance(s, ast.If)
                and isinstance(s.test, ast.Compare)
                and dotted(s.test.left) == "__name__"
                and self.parents.get(s) is self.tree
            ),
            None,
        )
        lines = "".join(f"{k} = {v}\n" for k, v in todo.items())
        block = "# the configs `osmosis run` and `osmosis serve` use (osmosis migrate)\n" + lines
        if main_guard is not None:
            at = self.src.line_start(self.src.start(main_guard))
            self.edits.append(Edit(at, at, block + "\n\n"))
        else:
            text = self.src.text
            prefix = "" if text.endswith("\n") else "\n"
            self.edits.append(Edit(len(text), len(text), prefix + "\n\n" + block))
        self._note(
            main_guard if main_guard is not None else len(self.src.text),
            ", ".join(f"{k} = {v}" for k, v in todo.items()),
            "osmosis run reads a rollout's configs from these module-level names",
        )

    def _read_harbor_keyword(self, name: str, value: ast.expr, keyword: ast.keyword, harbor: dict[str, Any]) -> None:
        subject = f"HarborBackend({name}=...)"
        if name in ("tasks_dir", "task_dir"):
            path = self.facts.static_path(value)
            if path is None:
                self._unmapped(keyword, subject, "not a path next to main.py: set [backend.harbor] task_dir")
            else:
                harbor["task_dir"] = path
        elif name == "task_mode":
            mode = value.value if isinstance(value, ast.Constant) else getattr(value, "attr", "")
            if str(mode).lower() in ("template", "dataset"):
                harbor["mode"] = str(mode).lower()
            else:
                self._unmapped(keyword, subject, "not a literal mode: set [backend.harbor] mode")
        elif name in ("code_dir", "user_code_dir"):
            if self.facts.static_path(value) != PurePosixPath("."):
                self._unmapped(keyword, subject, "osmosis mounts the rollout folder; set [backend.harbor] code_dir")
        elif name == "cleanup_successful_trials":
            try:
                harbor["keep_successful_trials"] = not bool(self.facts.constant(value))
            except ValueError:
                self._unmapped(keyword, subject, "not a literal: set [backend.harbor] keep_successful_trials")
        elif name == "orchestrator":
            self._read_trial_queue(value, keyword, harbor)
        else:
            self._unmapped(keyword, subject, _HARBOR_NOT_CARRIED.get(name, "not carried into [backend.harbor]"))

    def _read_trial_queue(self, value: ast.expr, keyword: ast.keyword, harbor: dict[str, Any]) -> None:
        if not (isinstance(value, ast.Call) and (dotted(value.func) or "").endswith("TrialQueue")):
            self._unmapped(keyword, "HarborBackend(orchestrator=...)", "osmosis builds Harbor's TrialQueue itself")
            return
        for item in value.keywords:
            if item.arg == "n_concurrent":
                try:
                    harbor["n_concurrent"] = int(self.facts.constant(item.value))
                except (ValueError, TypeError):
                    self._unmapped(
                        item, "TrialQueue(n_concurrent=...)", "not a literal: set [backend.harbor] n_concurrent"
                    )
            elif item.arg == "retry_config" or item.arg == "max_retries":
                self._unmapped(item, f"TrialQueue({item.arg}=...)", "set [backend.harbor] max_retries")
            else:
                self._unmapped(item, f"TrialQueue({item.arg}=...)", "osmosis builds Harbor's TrialQueue itself")


def _record_fields(name: str) -> frozenset[str]:
    """The constructor keywords of one of osmosis_core's records (read from the code, not a copy)."""
    import osmosis_core

    return frozenset(a.alias or a.name for a in attrs.fields(getattr(osmosis_core, name)))


def _imports_reference(node: ast.AST) -> TypeGuard[ast.Import | ast.ImportFrom]:
    """An import statement of osmosis-ai (``from osmosis_ai... import`` or ``import osmosis_ai...``)."""
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and is_reference_module(node.module or "")
    return isinstance(node, ast.Import) and any(is_reference_module(a.name) for a in node.names)


def _is_docstring(node: ast.Constant, parents: dict[ast.AST, ast.AST]) -> bool:
    statement = parents.get(node)
    holder = parents.get(statement) if isinstance(statement, ast.Expr) else None
    body = getattr(holder, "body", None)
    return isinstance(body, list) and bool(body) and body[0] is statement


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _fields(cls: ast.ClassDef) -> set[str]:
    fields = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            annotation = dotted(
                stmt.annotation.value if isinstance(stmt.annotation, ast.Subscript) else stmt.annotation
            )
            if annotation not in ("ClassVar", "typing.ClassVar"):
                fields.add(stmt.target.id)
    return fields


def _pydantic_features(cls: ast.ClassDef) -> list[ast.AST]:
    found: list[ast.AST] = []
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == "model_config" for t in targets):
                found.append(stmt)
            value = stmt.value
            if isinstance(value, ast.Call) and (dotted(value.func) or "").split(".")[-1] in _PYDANTIC_CALLS:
                found.append(stmt)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in stmt.decorator_list:
                name = dotted(decorator.func if isinstance(decorator, ast.Call) else decorator) or ""
                if name.split(".")[-1] in _PYDANTIC_DECORATORS:
                    found.append(stmt)
            if stmt.name == "model_post_init":
                found.append(stmt)
    return found
