"""Rule: give config classes written the pydantic way ``@attrs.define(kw_only=True)``.

A module-level subclass of ``AgentWorkflowConfig`` / ``GraderConfig`` (or of such a subclass) with
plain annotated fields is decorated, and ``import attrs`` is added before the first osmosis-ai import
(libcst's ``AddImportsVisitor`` would put it after the module's last top import instead); one that
is already decorated, or uses pydantic features (``Field``, validators, ``model_config``), is
reported. The workflow config's fields are recorded either way: the run config checks its keys.

>>> from osmosis_migrate.codemod import migrate_module
>>> text = "from osmosis_ai.rollout import AgentWorkflowConfig\\nclass C(AgentWorkflowConfig):\\n    x: int = 1\\n"
>>> print(migrate_module("x.py", text).new_text, end="")
import attrs
from osmosis_core import AgentWorkflowConfig
@attrs.define(kw_only=True)
class C(AgentWorkflowConfig):
    x: int = 1
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from osmosis_migrate.codemods.base import MigrationRule
from osmosis_migrate.codemods.plan import Insert, decorate
from osmosis_migrate.codemods.syntax import Import, dotted, small_statements

__all__ = ["DecorateConfigClasses"]

_CONFIG_BASES = {"AgentWorkflowConfig": "workflow", "GraderConfig": "grader"}
_PYDANTIC_CALLS = frozenset({"Field", "PrivateAttr", "ConfigDict"})
_PYDANTIC_DECORATORS = frozenset(
    {"field_validator", "model_validator", "validator", "root_validator", "computed_field", "field_serializer"}
)
_ATTRS_DECORATORS = frozenset({"attrs.define", "attrs.frozen", "define", "frozen", "attr.s", "attrs.mutable"})
_IMPORT_ATTRS = m.Import(names=[m.ZeroOrMore(), m.ImportAlias(name=m.Name("attrs"), asname=None), m.ZeroOrMore()])


class DecorateConfigClasses(MigrationRule):
    """Decorates the config classes that can simply become attrs classes, reports the others, and
    records the workflow config's fields."""

    DESCRIPTION = "Decorate pydantic-style config classes with @attrs.define(kw_only=True)."

    def _config_kind(self, cls: cst.ClassDef, known: dict[str, str]) -> str | None:
        for arg in cls.bases:
            base = arg.value
            if isinstance(base, cst.Subscript):
                base = base.value
            ref = self.facts.ref_name(base)
            if ref in _CONFIG_BASES:
                return _CONFIG_BASES[ref]
            if isinstance(base, cst.Name) and base.value in known:
                return known[base.value]
        return None

    def plan_changes(self) -> None:
        known: dict[str, str] = {}
        needs_import = False
        for cls in self.facts.module.body:
            if not isinstance(cls, cst.ClassDef):
                continue
            kind = self._config_kind(cls, known)
            if kind is None:
                continue
            known[cls.name.value] = kind
            if kind == "workflow":
                self.plan.config_fields.update(_fields(cls))
            if not self.facts.decorate_configs:
                continue
            pydantic = _pydantic_features(cls)
            if cls.decorators:
                names = {
                    dotted(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
                    for d in cls.decorators
                }
                if not names & _ATTRS_DECORATORS:
                    self.unmapped(
                        cls,
                        f"class {cls.name.value}",
                        "a decorated config class: osmosis's configs are attrs classes: "
                        "add @attrs.define(kw_only=True)",
                    )
                continue
            if pydantic:
                self.unmapped(
                    pydantic[0],
                    f"class {cls.name.value}",
                    "uses pydantic features (Field, validators, model_config): osmosis's configs are attrs classes; "
                    "rewrite them with attrs.field / attrs validators, then add @attrs.define(kw_only=True)",
                )
                continue
            decorator = cst.Decorator(decorator=cst.parse_expression("attrs.define(kw_only=True)"))
            self.plan.change(cls, decorate(decorator))
            self.note(
                cls,
                f"class {cls.name.value}",
                "now an attrs class (@attrs.define(kw_only=True)): osmosis's configs are attrs",
            )
            needs_import = True
        if needs_import and not any(m.matches(s, _IMPORT_ATTRS) for s in small_statements(self.facts.module.body)):
            self._import_attrs()

    def _import_attrs(self) -> None:
        """``import attrs`` before the first osmosis-ai import line (else before the first import line)."""
        body = self.facts.module.body
        anchor = next((s for s in body if _holds(s, self.facts.imports)), None)
        if anchor is None:
            anchor = next(s for s in body if _holds(s, None))
        insert = self.plan.inserts.setdefault(anchor, Insert([], []))
        insert.statements.insert(0, cst.parse_statement("import attrs\n"))


def _holds(line: cst.BaseStatement, imports: list[Import] | None) -> bool:
    if not isinstance(line, cst.SimpleStatementLine):
        return False
    first = line.body[0]
    return isinstance(first, Import) and (imports is None or first in imports)


def _fields(cls: cst.ClassDef) -> set[str]:
    fields = set()
    for statement in small_statements(cls.body.body):
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
    for statement in small_statements(cls.body.body):
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
