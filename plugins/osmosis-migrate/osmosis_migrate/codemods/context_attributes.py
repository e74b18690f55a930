"""Rule: ``.chat_completions_url`` / ``.api_key`` of a rollout context -> ``.policy.base_url`` / ``.policy.api_key``.

A rollout context is ``get_rollout_context()``, a name assigned from it (or bound by ``with ... as``)
in the same function or at module level, or a parameter annotated ``RolloutContext``.

>>> from osmosis_migrate.codemod import migrate_module
>>> text = "from osmosis_ai.rollout import get_rollout_context\\nurl = get_rollout_context().chat_completions_url\\n"
>>> print(migrate_module("x.py", text).new_text, end="")
from osmosis_core import get_rollout_context
url = get_rollout_context().policy.base_url
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from osmosis_migrate.codemods.base import MigrationRule
from osmosis_migrate.codemods.syntax import string_value

__all__ = ["RewriteContextAttributes"]

_CONTEXT_ATTRS = {"chat_completions_url": "policy.base_url", "api_key": "policy.api_key"}


class RewriteContextAttributes(MigrationRule):
    """Moves the endpoint attributes of a rollout context under ``.policy``, noted once (on the first
    osmosis-ai import)."""

    DESCRIPTION = "Rewrite a rollout context's .chat_completions_url / .api_key to .policy.base_url / .policy.api_key."

    def plan_changes(self) -> None:
        facts = self.facts
        getters = {b.local for b in facts.bindings.values() if b.name == "get_rollout_context"}
        classes = {b.local for b in facts.bindings.values() if b.name == "RolloutContext"}
        if not getters and not classes and not facts.module_aliases:
            return

        def is_getter_call(node: cst.CSTNode | None) -> bool:
            return isinstance(node, cst.Call) and (
                (isinstance(node.func, cst.Name) and node.func.value in getters)
                or (isinstance(node.func, cst.Attribute) and facts.ref_name(node.func) == "get_rollout_context")
            )

        getter_call: m.MatchIfTrue[cst.BaseExpression] = m.MatchIfTrue(is_getter_call)
        assigned = m.Assign(targets=[m.AssignTarget(target=m.Name())], value=getter_call)
        contexts: dict[cst.CSTNode | None, set[str]] = {}
        for node in facts.nodes:
            if isinstance(node, cst.Assign) and m.matches(node, assigned):
                target = node.targets[0].target
                assert isinstance(target, cst.Name)
                contexts.setdefault(facts.enclosing_function(node), set()).add(target.value)
            elif isinstance(node, cst.With):
                for item in node.items:
                    if is_getter_call(item.item) and item.asname is not None and isinstance(item.asname.name, cst.Name):
                        contexts.setdefault(facts.enclosing_function(node), set()).add(item.asname.name.value)
            elif isinstance(node, cst.Param) and node.annotation is not None:
                annotation = node.annotation.annotation
                if (isinstance(annotation, cst.Name) and annotation.value in classes) or string_value(
                    annotation
                ) in classes:
                    contexts.setdefault(facts.enclosing_function(node), set()).add(node.name.value)
        done = False
        for node in facts.nodes:
            if not isinstance(node, cst.Attribute) or node.attr.value not in _CONTEXT_ATTRS:
                continue
            value = node.value
            known = is_getter_call(value) or (
                isinstance(value, cst.Name)
                and value.value in contexts.get(facts.enclosing_function(node), set()) | contexts.get(None, set())
            )
            if not known:
                continue
            self.plan.renamed_attributes.add(node)
            outer, _, inner = _CONTEXT_ATTRS[node.attr.value].rpartition(".")

            def policy(
                _o: cst.CSTNode, updated: cst.Attribute, outer: str = outer, inner: str = inner
            ) -> cst.Attribute:
                holder = cst.Attribute(value=updated.value, dot=updated.dot, attr=cst.Name(outer))
                return updated.with_changes(value=holder, dot=cst.Dot(), attr=updated.attr.with_changes(value=inner))

            self.plan.change(node, policy)
            done = True
        if done:
            self.note(
                facts.position(facts.imports[0]),
                "rollout context: .chat_completions_url -> .policy.base_url, .api_key -> .policy.api_key",
                "osmosis's RolloutContext keeps the endpoint in .policy (same base URL, same key)",
            )
