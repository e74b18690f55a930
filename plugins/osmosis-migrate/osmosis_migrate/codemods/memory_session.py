"""Rule: drop ``session=OsmosisMemorySession()`` (osmosis's model registers the sample itself).

The argument goes (``Runner.run(agent, x, session=OsmosisMemorySession())``), and so does a variable
holding the session when that argument is its one use; the import goes when every use went. Any
other use is reported: remove it by hand.

>>> from osmosis_migrate.codemod import migrate_module
>>> module = "osmosis_ai.rollout.integrations.agents.openai_agents"
>>> text = f"from {module} import OsmosisMemorySession\\nrun(a, session=OsmosisMemorySession())\\n"
>>> print(migrate_module("x.py", text).new_text, end="")
run(a)
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from osmosis_migrate.codemods.base import MigrationRule

__all__ = ["RemoveMemorySession"]

_SESSION_ARGUMENT = m.Arg(keyword=m.Name("session"))
_ONE_NAME_ASSIGNED = m.Assign(targets=[m.AssignTarget(target=m.Name())])
_WHY = "dropped: OsmosisRolloutModel, the model of OsmosisAgent, registers the sample itself"


class RemoveMemorySession(MigrationRule):
    """Removes ``session=OsmosisMemorySession()`` arguments, the variables that only feed them, and
    the import; reports every other use of ``OsmosisMemorySession``."""

    DESCRIPTION = "Drop session=OsmosisMemorySession() (osmosis's model registers the sample)."

    def plan_changes(self) -> None:
        sessions = [
            b for b in self.facts.bindings.values() if b.name == "OsmosisMemorySession" and "openai_agents" in b.module
        ]
        for binding in sessions:
            local = binding.local
            uses = self.facts.uses(local, at=binding.statement)
            removed_all = True
            for use in uses:
                call = self.facts.parents.get(use)
                if not (isinstance(call, cst.Call) and call.func is use):
                    removed_all = False
                    self.unmapped(use, "OsmosisMemorySession", "used other than as a session=... argument: remove it")
                    continue
                if not self._drop_session(call):
                    removed_all = False
            if removed_all and uses:
                self.plan.removed.add(local)

    def _drop_session(self, call: cst.Call) -> bool:
        parents = self.facts.parents
        parent = parents.get(call)
        if parent is not None and m.matches(parent, _SESSION_ARGUMENT):
            assert isinstance(parent, cst.Arg)
            outer = parents.get(parent)
            if isinstance(outer, cst.Call):
                self._remove_argument(outer, parent)
                self.note(parent, "session=OsmosisMemorySession()", _WHY)
                return True
        assign = parent
        if isinstance(assign, cst.Assign) and m.matches(assign, _ONE_NAME_ASSIGNED) and self.facts.alone(assign):
            target = assign.targets[0].target
            assert isinstance(target, cst.Name)
            var = target.value
            uses = self.facts.uses(var, at=assign)
            arguments = [parents.get(u) for u in uses]
            argument = arguments[0] if len(uses) == 1 else None
            if isinstance(argument, cst.Arg) and m.matches(argument, _SESSION_ARGUMENT):
                outer = parents.get(argument)
                if isinstance(outer, cst.Call):
                    line = parents.get(assign)
                    assert line is not None
                    self.plan.dropped.add(line)
                    self._remove_argument(outer, argument)
                    self.note(assign, f"{var} = OsmosisMemorySession() and session={var}", _WHY)
                    return True
            if len(uses) > 1:
                self.unmapped(
                    call,
                    "OsmosisMemorySession",
                    f"{var} is used {len(uses)} times (memory across Runner.run calls?): pass the conversation "
                    "yourself, or use an agents session such as agents.SQLiteSession",
                )
                return False
        self.unmapped(call, "OsmosisMemorySession()", "not passed as session=...: remove it by hand")
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

        self.plan.change(call, remove)
