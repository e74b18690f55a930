"""Rule: find the uses osmosis-ai code makes that have no counterpart in osmosis, and rename keywords.

Reported with file:line and why: enum members osmosis's enums lack, attributes osmosis's objects do
not have, keywords ``RolloutSample`` / ``ExecutionRequest`` / ``create_rollout_server`` do not take,
``RolloutContext(...)`` built by hand, strings naming ``osmosis_ai`` or osmosis-ai's environment
variables, placeholder model names. ``trajectory_messages=`` -> ``chat_messages=``, ``id=`` ->
``rollout_id=`` and ``create_rollout_server(api_key=)`` -> ``token=`` are renamed.

>>> from osmosis_migrate.codemod import migrate_module
>>> text = "from osmosis_ai.rollout import AgentWorkflowOutput\\nAgentWorkflowOutput(label=1)\\n"
>>> [f.subject for f in migrate_module("x.py", text).unmapped]
['label=']
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import libcst as cst

from osmosis_migrate.codemods.base import MigrationRule
from osmosis_migrate.codemods.syntax import keyword, keywords, positional, string_value
from osmosis_migrate.names import ATTRIBUTE_WHY, ENUM_MEMBER_WHY, ENUM_MEMBERS, ENV_VAR_WHY, PLACEHOLDER_MODELS

__all__ = ["CheckUsage"]

_SERVER_SETTINGS = {
    "result_wait_timeout_sec": "result_wait_sec",
    "polling_lease_timeout_sec": "lease_timeout_sec",
    "result_retention_sec": "retention_sec",
}


class CheckUsage(MigrationRule):
    """Reports every attribute, call keyword and string osmosis has no counterpart for (attributes
    another rule already rewrote excepted), and renames the keywords osmosis renamed."""

    DESCRIPTION = "Report what osmosis-ai code uses that osmosis lacks; rename renamed keywords."

    def plan_changes(self) -> None:
        for node in self.facts.nodes:
            if isinstance(node, cst.Attribute):
                ref = self.facts.ref_name(node.value)
                attr = node.attr.value
                if ref in ENUM_MEMBERS and attr not in ENUM_MEMBERS[ref]:
                    why = ENUM_MEMBER_WHY.get(attr, f"osmosis's enum has no {attr}")
                    self.unmapped(node, f"{ref}.{attr}", why)
                elif attr in ATTRIBUTE_WHY and node not in self.plan.renamed_attributes:
                    self.unmapped(node, f".{attr}", ATTRIBUTE_WHY[attr])
            elif isinstance(node, cst.Call):
                self._check_call(node)
            elif isinstance(node, cst.SimpleString | cst.ConcatenatedString | cst.FormattedStringText):
                self._check_string(node)

    def _check_string(self, node: cst.SimpleString | cst.ConcatenatedString | cst.FormattedStringText) -> None:
        if isinstance(node, cst.FormattedStringText):  # the literal text between an f-string's {fields}
            value: str | None = node.value.replace("{{", "{").replace("}}", "}")
        else:
            value = string_value(node)
        if value is None or isinstance(self.facts.parents.get(node), cst.ConcatenatedString):
            return
        if "osmosis_ai" in value and not self._is_docstring(node):
            self.unmapped(node, repr(value)[:60], "a string naming osmosis_ai: update it by hand")
        elif value in ENV_VAR_WHY:
            self.unmapped(node, repr(value), ENV_VAR_WHY[value])
        elif value in PLACEHOLDER_MODELS:
            self.unmapped(
                node,
                f"model {value!r}",
                "osmosis-ai's gateway ignored this name; osmosis sends it to your endpoint as it is: "
                "use get_rollout_context().policy.model",
            )

    def _is_docstring(self, node: cst.CSTNode) -> bool:
        parents = self.facts.parents
        expression = parents.get(node)
        line = parents.get(expression) if isinstance(expression, cst.Expr) else None
        block = parents.get(line) if isinstance(line, cst.SimpleStatementLine) else None
        body = getattr(block, "body", None)
        return isinstance(body, Sequence) and bool(body) and body[0] is line

    def _rename_keyword(self, argument: cst.Arg, new: str, why: str) -> None:
        old = keyword(argument)
        self.plan.change(argument, lambda _o, updated: updated.with_changes(keyword=cst.Name(new)))
        self.note(argument, f"{old}= -> {new}=", why)

    def _check_call(self, call: cst.Call) -> None:
        ref = self.facts.ref_name(call.func)
        given = keywords(call)
        if ref in ("AgentWorkflowOutput", "RolloutSample"):
            fields = _record_fields("RolloutSample")
            for argument in given:
                name = keyword(argument)
                if name is None or name in fields:
                    continue
                if name == "trajectory_messages" and "chat_messages" in fields:
                    self._rename_keyword(argument, "chat_messages", "osmosis's chat-shaped copy of the history")
                elif name == "info":
                    self.unmapped(argument, "info=", "RolloutSample has no info: put numbers in metrics")
                elif name == "label":
                    self.unmapped(argument, "label=", "samples carry no label in osmosis: the grader gets ctx.label")
                else:
                    why = ATTRIBUTE_WHY.get(name, f"RolloutSample has no {name}")
                    self.unmapped(argument, f"{name}=", why)
        elif ref == "RolloutContext":
            self.unmapped(
                call,
                "RolloutContext(...)",
                "osmosis's is RolloutContext(rollout_id, policy: PolicyEndpoint); backends install it for you",
            )
        elif ref == "ExecutionRequest":
            self._check_execution_request(call, given)
        elif ref == "create_rollout_server":
            self._check_server_call(given)

    def _check_execution_request(self, call: cst.Call, given: list[cst.Arg]) -> None:
        fields = _record_fields("ExecutionRequest")
        names = {keyword(a) for a in given}
        for argument in given:
            name = keyword(argument)
            if name == "id" and "rollout_id" in fields:
                self._rename_keyword(argument, "rollout_id", "osmosis's name for the rollout id")
            elif name is not None and name not in fields:
                self.unmapped(argument, f"ExecutionRequest({name}=...)", "osmosis's ExecutionRequest has no such field")
        if "policy" in fields and "policy" not in names and not positional(call):
            self.unmapped(
                call,
                "ExecutionRequest(...)",
                "osmosis's needs policy=PolicyEndpoint(base_url, model): the endpoint the rollout calls",
            )

    def _check_server_call(self, given: list[cst.Arg]) -> None:
        for argument in given:
            name = keyword(argument)
            if name == "api_key":
                self._rename_keyword(
                    argument,
                    "token",
                    "the server's bearer token (create_app's api_key is the policy's key, not the server's)",
                )
            elif name in _SERVER_SETTINGS:
                self.unmapped(
                    argument,
                    f"create_rollout_server({name}=...)",
                    f"give osmosis_server.create_app settings=ServerSettings({_SERVER_SETTINGS[name]}=...)",
                )
            elif name not in (None, "backend", "configure_logging"):
                self.unmapped(
                    argument,
                    f"create_rollout_server({name}=...)",
                    "osmosis_server.create_app has no such parameter",
                )


def _record_fields(name: str) -> frozenset[str]:
    """The constructor keywords of one of osmosis_core's records (read from the code, not a copy)."""
    import osmosis_core

    return frozenset(a.alias or a.name for a in attrs.fields(getattr(osmosis_core, name)))
