"""Rule: read an entrypoint's ``LocalBackend(...)`` / ``HarborBackend(...)`` call into the run config's facts.

The workflow and grader classes, the Harbor settings (task folder, mode, trial queue, ...) become a
:class:`~osmosis_migrate.records.BackendCall` that ``run_config`` writes into ``[rollout]`` and
``[backend.harbor]``; configs passed as ``workflow_config=`` / ``grader_config=`` are exposed as the
module-level names ``osmosis run`` reads (before the ``if __name__ == ...`` block, else at the end).
What cannot be carried over is reported, in a file being migrated (one that imports osmosis-ai).

>>> from osmosis_migrate.codemod import migrate_module
>>> text = "from osmosis_ai.rollout import LocalBackend\\nLocalBackend(workflow=W, grader=None)\\nclass W: ...\\n"
>>> migrate_module("main.py", text, entrypoint=True).analysis.backend
BackendCall(kind='local', line=2, workflow='W', grader='none', harbor={})
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import libcst as cst
import libcst.matchers as m

from osmosis_migrate.codemods.base import MigrationRule
from osmosis_migrate.codemods.facts import Position
from osmosis_migrate.codemods.plan import Insert
from osmosis_migrate.codemods.syntax import dotted, is_none, keyword, keywords, positional, string_value, with_leading
from osmosis_migrate.records import BackendCall

__all__ = ["ReadEntrypointBackend"]

_MAIN_GUARD = m.If(test=m.Comparison(left=m.Name("__name__")))
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


class ReadEntrypointBackend(MigrationRule):
    """Reads the first backend call of an entrypoint (any entrypoint, osmosis-ai imports or not) into
    the plan's :class:`~osmosis_migrate.records.BackendCall`, and exposes its configs at module level."""

    DESCRIPTION = "Read the entrypoint's LocalBackend / HarborBackend call into the run config."

    def applies(self) -> bool:
        return self.facts.entrypoint

    def plan_changes(self) -> None:
        unmapped = list(self.plan.unmapped)
        self._read()
        if not self.facts.imports:  # report only in a file being migrated
            self.plan.unmapped = unmapped

    def _read(self) -> None:
        calls = [
            n
            for n in self.facts.nodes
            if isinstance(n, cst.Call) and self._backend_name(n.func) in ("LocalBackend", "HarborBackend")
        ]
        if not calls:
            return
        call = calls[0]
        if len(calls) > 1:
            self.unmapped(calls[1], "a second backend", "a run config names one rollout: only the first was read")
        kind = "harbor" if self._backend_name(call.func) == "HarborBackend" else "local"
        values: dict[str, Any] = {"workflow": None, "grader": "none" if kind == "local" else None}
        harbor: dict[str, Any] = {}
        configs: dict[str, str] = {}
        for argument in keywords(call):
            name = keyword(argument)
            value = argument.value
            if name in ("workflow", "agent"):
                values["workflow"] = self._class_spec(value, argument, harbor_agent=kind == "harbor")
            elif name == "grader":
                spec = self._class_spec(value, argument, harbor_agent=False)
                values["grader"] = "none" if spec is None and is_none(value) else spec
            elif name in ("workflow_config", "grader_config"):
                self._read_config_object(name, value, argument, configs)
            elif kind == "harbor" and name is not None:
                self._read_harbor_keyword(name, value, argument, harbor)
            else:
                self.unmapped(
                    argument, f"{self._backend_name(call.func)}({name}=...)", "not carried into the run config"
                )
        given = positional(call)
        if given:
            self.unmapped(given[0], "positional backend arguments", "give them by keyword (workflow=..., grader=...)")
        if self.facts.imports:
            self._expose_configs(configs)
        self.plan.backend = BackendCall(
            kind=kind,
            line=self.facts.position(call)[0],
            workflow=values["workflow"],
            grader=values["grader"],
            harbor=harbor,
        )

    def _backend_name(self, node: cst.CSTNode) -> str | None:
        ref = self.facts.ref_name(node)
        if ref is not None:
            return ref
        name = dotted(node)
        return (
            name.rsplit(".", 1)[-1] if name in ("LocalBackend", "HarborBackend", "osmosis_core.LocalBackend") else None
        )

    def _class_spec(self, value: cst.BaseExpression, argument: cst.Arg, *, harbor_agent: bool) -> str | None:
        if isinstance(value, cst.Name) and value.value in self.facts.bound:
            return value.value
        text = string_value(value)
        if text is not None:
            if ":" in text:
                return text
            if harbor_agent:
                self.unmapped(
                    argument,
                    f"agent={text!r}",
                    "a Harbor native agent: osmosis runs AgentWorkflow classes in trials, not Harbor's own agents",
                )
                return None
            return text
        if not is_none(value):
            self.unmapped(
                argument, f"{keyword(argument)}=...", "not a module-level class or import path: name it in [rollout]"
            )
        return None

    def _read_config_object(
        self, name: str, value: cst.BaseExpression, argument: cst.Arg, configs: dict[str, str]
    ) -> None:
        if isinstance(value, cst.Name) and value.value in self.facts.bound:
            if value.value != name:
                configs[name] = value.value
        elif not is_none(value):
            self.unmapped(
                argument,
                f"{name}=...",
                f"built where `osmosis run` cannot find it: define it at module level as `{name} = ...`",
            )

    def _expose_configs(self, configs: dict[str, str]) -> None:
        todo = {k: v for k, v in configs.items() if k not in self.facts.bound}
        if not todo:
            return
        main_guard = next((s for s in self.facts.module.body if m.matches(s, _MAIN_GUARD)), None)
        statements: list[cst.BaseStatement] = list(
            cst.parse_module("".join(f"{k} = {v}\n" for k, v in todo.items())).body
        )
        comment = cst.EmptyLine(
            comment=cst.Comment("# the configs `osmosis run` and `osmosis serve` use (osmosis migrate)")
        )
        statements[0] = with_leading(statements[0], [comment])
        if main_guard is not None:
            self.plan.inserts[main_guard] = Insert(
                statements, [cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)]
            )
            where: Position = self.anchor(main_guard)
        else:
            statements[0] = with_leading(
                statements[0], [cst.EmptyLine(indent=False), cst.EmptyLine(indent=False), comment]
            )
            self.plan.appended = statements
            where = (len(self.facts.lines) + 1, 0)
        self.note(
            where,
            ", ".join(f"{k} = {v}" for k, v in todo.items()),
            "osmosis run reads a rollout's configs from these module-level names",
        )

    def _read_harbor_keyword(
        self, name: str, value: cst.BaseExpression, argument: cst.Arg, harbor: dict[str, Any]
    ) -> None:
        subject = f"HarborBackend({name}=...)"
        if name in ("tasks_dir", "task_dir"):
            path = self.facts.static_path(value)
            if path is None:
                self.unmapped(argument, subject, "not a path next to main.py: set [backend.harbor] task_dir")
            else:
                harbor["task_dir"] = path
        elif name == "task_mode":
            try:
                mode = self.facts.literal(value)
            except ValueError:
                mode = value.attr.value if isinstance(value, cst.Attribute) else ""
            if str(mode).lower() in ("template", "dataset"):
                harbor["mode"] = str(mode).lower()
            else:
                self.unmapped(argument, subject, "not a literal mode: set [backend.harbor] mode")
        elif name in ("code_dir", "user_code_dir"):
            if self.facts.static_path(value) != PurePosixPath("."):
                self.unmapped(argument, subject, "osmosis mounts the rollout folder; set [backend.harbor] code_dir")
        elif name == "cleanup_successful_trials":
            try:
                harbor["keep_successful_trials"] = not bool(self.facts.constant(value))
            except ValueError:
                self.unmapped(argument, subject, "not a literal: set [backend.harbor] keep_successful_trials")
        elif name == "orchestrator":
            self._read_trial_queue(value, argument, harbor)
        else:
            self.unmapped(argument, subject, _HARBOR_NOT_CARRIED.get(name, "not carried into [backend.harbor]"))

    def _read_trial_queue(self, value: cst.BaseExpression, argument: cst.Arg, harbor: dict[str, Any]) -> None:
        if not (isinstance(value, cst.Call) and (dotted(value.func) or "").endswith("TrialQueue")):
            self.unmapped(argument, "HarborBackend(orchestrator=...)", "osmosis builds Harbor's TrialQueue itself")
            return
        for item in keywords(value):
            name = keyword(item)
            if name == "n_concurrent":
                try:
                    harbor["n_concurrent"] = int(self.facts.constant(item.value))
                except (ValueError, TypeError):
                    self.unmapped(
                        item, "TrialQueue(n_concurrent=...)", "not a literal: set [backend.harbor] n_concurrent"
                    )
            elif name in ("retry_config", "max_retries"):
                self.unmapped(item, f"TrialQueue({name}=...)", "set [backend.harbor] max_retries")
            else:
                self.unmapped(item, f"TrialQueue({name}=...)", "osmosis builds Harbor's TrialQueue itself")
