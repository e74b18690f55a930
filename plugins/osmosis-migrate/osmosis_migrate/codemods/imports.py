"""Rule: rewrite the osmosis-ai import statements for osmosis's packages.

``from osmosis_ai.rollout import X`` becomes ``from osmosis_core import Y`` (and the other packages:
``osmosis_strands``, ``osmosis_openai_agents``, ``osmosis_harbor``, ``osmosis_server``), under the old
name when the planned renames leave it; a name osmosis does not offer stays imported from its old
module, marked, and is reported. ``import osmosis_ai.rollout`` becomes ``import osmosis_core``, and
``osmosis_ai.rollout.X`` written out in full becomes ``osmosis_core.Y``. The statements are written
by :mod:`osmosis_migrate.codemods.import_writer`, which keeps their comments and layout.

>>> from osmosis_migrate.codemod import migrate_module
>>> print(migrate_module("x.py", "from osmosis_ai.rollout import AgentWorkflow  # the base\\n").new_text, end="")
from osmosis_core import AgentWorkflow  # the base
"""

from __future__ import annotations

import libcst as cst

from osmosis_migrate.codemods.base import MigrationRule
from osmosis_migrate.codemods.import_writer import Group, import_comments, write_statement
from osmosis_migrate.codemods.plan import replace_expression
from osmosis_migrate.codemods.syntax import alias_local, asname, dotted
from osmosis_migrate.names import DISTRIBUTIONS, MODULE_PATHS, NotOffered, is_reference_module, module_target

__all__ = ["RewriteImports"]


class RewriteImports(MigrationRule):
    """Rewrites each osmosis-ai import statement in place (and the full module paths a plain
    ``import osmosis_ai...`` is used through), and reports what osmosis does not offer."""

    DESCRIPTION = "Rewrite osmosis_ai imports for osmosis's packages."

    def plan_changes(self) -> None:
        chain_targets = self._rewrite_chains()
        first_plain = True
        for node in self.facts.imports:
            if isinstance(node, cst.ImportFrom):
                groups = self._from_groups(node)
            else:
                groups = self._import_groups(node, chain_targets if first_plain else set())
                first_plain = False
            if groups is not None:
                write_statement(self.facts, self.plan, node, groups)

    def _from_groups(self, node: cst.ImportFrom) -> list[Group] | None:
        module = dotted(node.module) or ""
        after, before, _other = import_comments(self.facts, node)
        leftover = Group("from", module, leftover=True)
        groups: dict[tuple[str, str], Group] = {}
        changed = False
        at = self.facts.position(node)
        if isinstance(node.names, cst.ImportStar):
            target = module_target(module)
            if isinstance(target, str):
                groups[("from", target)] = Group("from", target, ["*"])
                self.plan.distributions.add(DISTRIBUTIONS[target])
                self.note(at, f"from {module} import *", f"now from {target} import *: check the names you use")
                return list(groups.values())
            self.unmapped(at, f"from {module} import *", target.why)
            return None
        unmapped: list[tuple[cst.ImportAlias, str]] = []
        for index, alias in enumerate(node.names):
            name = dotted(alias.name) or ""
            local = alias_local(alias)
            as_name = asname(alias)
            comment, pre = after.get(index), before.get(index, [])
            full = f"{module}.{name}"
            if full in MODULE_PATHS:
                target = module_target(full)
                assert isinstance(target, str)
                item = target if local == target else f"{target} as {local}"
                groups.setdefault(("import", item), Group("import", "")).add(item, comment, pre)
                self.plan.distributions.add(DISTRIBUTIONS[target])
                changed = True
                continue
            result = self.facts.bindings[local].result
            if local in self.plan.removed or local in self.plan.relocated:
                changed = True
                continue
            if isinstance(result, NotOffered):
                leftover.add(name if not as_name else f"{name} as {as_name}", comment, pre)
                unmapped.append((alias, "not offered, because " + result.why))
                continue
            changed = True
            self.plan.distributions.add(result.distribution)
            if as_name:
                item = result.name if as_name == result.name else f"{result.name} as {as_name}"
            elif local in self.facts.renames or result.name == name:
                item = result.name
            else:
                item = f"{result.name} as {name}"
            groups.setdefault(("from", result.module), Group("from", result.module)).add(item, comment, pre)
        for alias, why in unmapped:  # a rewritten statement is reported on its (new) first line
            self.unmapped(at if changed else alias, dotted(alias.name) or "", why)
        if not changed:
            return None
        return ([leftover] if leftover.items else []) + list(groups.values())

    def _import_groups(self, node: cst.Import, chain_targets: set[str]) -> list[Group] | None:
        keep = Group("import", "")
        leftover = Group("import", "", leftover=True)
        out = Group("import", "")
        changed = False
        unmapped: list[tuple[cst.ImportAlias, str, str]] = []
        for alias in node.names:
            name = dotted(alias.name) or ""
            as_name = asname(alias)
            text = name + (f" as {as_name}" if as_name else "")
            if not is_reference_module(name):
                keep.add(text, None, [])
                continue
            target = module_target(name)
            if isinstance(target, NotOffered):
                if as_name is None and chain_targets:
                    changed = True  # `import osmosis_ai` whose uses were all rewritten
                    continue
                leftover.add(text, None, [])
                unmapped.append((alias, f"import {name}", "not offered, because " + target.why))
                continue
            changed = True
            self.plan.distributions.add(DISTRIBUTIONS[target])
            if as_name:
                out.add(target if as_name == target else f"{target} as {as_name}", None, [])
            else:
                out.add(target, None, [])
        for target in sorted(chain_targets):
            out.add(target, None, [])
        for alias, subject, why in unmapped:
            self.unmapped(self.facts.position(node) if changed else alias, subject, why)
        if not changed:
            return None
        return [g for g in (leftover, keep, out) if g.items]

    def _rewrite_chains(self) -> set[str]:
        """``osmosis_ai.rollout.X`` written out in full (after ``import osmosis_ai.rollout``)."""
        targets: set[str] = set()
        if not self.facts.plain_modules or "osmosis_ai" in self.facts.names[1]:
            return targets
        for node in self.facts.nodes:
            if not isinstance(node, cst.Attribute):
                continue
            path = dotted(node)
            parent = self.facts.parents.get(node)
            if path is None or path not in MODULE_PATHS:
                continue
            if isinstance(parent, cst.Attribute) and dotted(parent) in MODULE_PATHS:
                continue
            target = module_target(path)
            if isinstance(target, NotOffered):
                self.unmapped(node, path, target.why)
                continue
            self.plan.change(node, replace_expression(cst.parse_expression(target)))
            targets.add(target)
            self.plan.distributions.add(DISTRIBUTIONS[target])
            if isinstance(parent, cst.Attribute) and parent.value is node:
                self.rename_attribute(parent, path)
        return targets
