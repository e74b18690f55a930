"""The plugin as a user meets it: lazy imports, the ``osmosis`` CLI, the template applied and run.

Everything here is a real subprocess of this interpreter or of its ``osmosis`` script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from osmosis_core._engine.registry import PluginRegistry
from osmosis_core.templates import apply_template
from osmosis_core.testing import check_lazy_exports, run_guide_commands

OSMOSIS = Path(sys.executable).parent / "osmosis"
TEMPLATE = "multiply-local-strands"
TEMPLATE_FILES = {
    f"rollouts/{TEMPLATE}/main.py",
    f"rollouts/{TEMPLATE}/pyproject.toml",
    f"configs/eval/{TEMPLATE}.toml",
    f"configs/training/{TEMPLATE}.toml",
    "data/multiply.jsonl",
    "AGENTS.md",
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_") and k != "PYTHONPATH"}
    env["OSMOSIS_LOAD_PLUGINS"] = "strands"  # the core's built-ins and this plugin only
    return env


def _python(code: str, *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=120,
        check=False,
    )


def _osmosis(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(OSMOSIS), *args], capture_output=True, text=True, env=_env(), cwd=cwd, timeout=120, check=False
    )


def test_importing_the_package_and_its_plugin_module_does_not_import_strands():
    proc = _python(
        """
        import json, sys
        import osmosis_strands, osmosis_strands.plugin, osmosis_strands.errors
        heavy = sorted(m for m in ("strands", "openai", "httpx2", "pydantic") if m in sys.modules)
        print(json.dumps({"heavy": heavy, "all": osmosis_strands.__all__}))
        """
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["heavy"] == []
    assert {"OsmosisRolloutModel", "OsmosisStrandsAgent", "TurnLimitExceeded", "MalformedToolCall"} <= set(
        report["all"]
    )


def test_first_use_of_a_public_name_imports_strands():
    proc = _python(
        """
        import sys
        from osmosis_strands import OsmosisStrandsAgent
        import strands
        assert issubclass(OsmosisStrandsAgent, strands.Agent)
        from osmosis_strands import OsmosisRolloutModel
        from strands.models.model import Model
        assert issubclass(OsmosisRolloutModel, Model)
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok", proc.stderr


def test_a_rollout_writes_nothing_to_stdout_or_stderr():
    """No stream printing (callback handler) and no Strands warnings leaking through logging's last resort."""
    proc = _python(
        """
        from osmosis_core import AgentWorkflow
        from osmosis_core.testing import Reply, ScriptedPolicyServer, ToolCall, run_rollout_sync
        from osmosis_strands import OsmosisStrandsAgent

        def script(request):  # an unknown tool (Strands logs a warning), then an answer
            if request["messages"][-1]["role"] == "tool":
                return Reply(content="done")
            return Reply(tool_calls=[ToolCall("divide", {"a": 1, "b": 2})])

        class Workflow(AgentWorkflow):
            async def run(self, ctx):
                await OsmosisStrandsAgent().invoke_async(ctx.user_prompt)

        with ScriptedPolicyServer(script=script) as server:
            outcome = run_rollout_sync(Workflow, policy=server, user_prompt="hi")
        assert outcome.error is None and outcome.sample.last_text() == "done", outcome.error
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == ""


def test_the_cli_lists_the_plugin_and_its_template(tmp_path):
    plugins = _osmosis("plugins", "--json", cwd=tmp_path)
    assert plugins.returncode == 0, plugins.stderr
    (mine,) = [p for p in json.loads(plugins.stdout) if p["name"] == "strands"]
    assert mine["status"] == "active"
    assert mine["distribution"] == "osmosis-strands"
    assert mine["error"] is None
    templates = _osmosis("template", "list", "--json", cwd=tmp_path)
    assert templates.returncode == 0, templates.stderr
    (spec,) = [t for t in json.loads(templates.stdout) if t["name"] == TEMPLATE]
    assert spec["next_steps"] == f"osmosis run configs/eval/{TEMPLATE}.toml --stub-policy"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty folder with the template applied through the CLI, as a user does it."""
    folder = tmp_path_factory.mktemp("workspace")
    proc = _osmosis("template", "apply", TEMPLATE, str(folder), cwd=folder.parent)
    assert proc.returncode == 0, proc.stderr
    assert f"osmosis run configs/eval/{TEMPLATE}.toml --stub-policy" in proc.stdout
    return folder


def test_the_template_applies_into_an_empty_folder(workspace):
    files = {p.relative_to(workspace).as_posix() for p in workspace.rglob("*") if p.is_file()}
    assert files >= TEMPLATE_FILES
    rows = [json.loads(line) for line in (workspace / "data/multiply.jsonl").read_text().splitlines()]
    assert len(rows) == 20
    for row in rows:
        a, b = (int(line.split("=")[1]) for line in row["user_prompt"].splitlines())
        assert row["ground_truth"] == str(a * b)
        assert "####" in row["system_prompt"]
    agents_md = (workspace / "AGENTS.md").read_text()
    assert TEMPLATE in agents_md
    assert "{{" not in agents_md
    training = tomllib.loads((workspace / f"configs/training/{TEMPLATE}.toml").read_text())
    assert set(training) == {"rollout", "run"}  # the trainer supplies the dataset and the policy
    assert training["run"]["n_samples"] == 8
    assert training["run"]["concurrency"] == 32
    assert "osmosis-strands" in (workspace / f"rollouts/{TEMPLATE}/pyproject.toml").read_text()


def test_the_template_runs_with_the_stub_policy_with_no_edits(workspace):
    proc = _osmosis("run", f"configs/eval/{TEMPLATE}.toml", "--stub-policy", "--output", "out", cwd=workspace)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in (workspace / "out/results.jsonl").read_text().splitlines()]
    assert len(results) == 20
    assert all(r["status"] == "success" and r["reward"] == 1.0 for r in results), [r["error"] for r in results]
    first = results[0]
    assert first["metrics"]["turns"] == 2
    assert [m["role"] for m in first["sample"]["chat_messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert [m["role"] for m in first["sample"]["messages"]] == ["user", "assistant", "user", "assistant"]
    summary = json.loads((workspace / "out/summary.json").read_text())
    assert summary["mean_reward"] == 1.0
    assert summary["errors_by_category"] == {}


def test_the_template_guides_commands_all_work(workspace):
    for proc in run_guide_commands(workspace):
        assert proc.returncode == 0


def test_the_template_registered_in_process_is_the_shipped_folder(tmp_path):
    registry = PluginRegistry(load_entrypoints=True)
    spec = registry.template(TEMPLATE)
    written = {p.as_posix() for p in apply_template(spec, tmp_path)}
    assert written >= TEMPLATE_FILES


def test_the_public_names_type_checkers_read_are_the_ones_the_package_hands_out():
    check_lazy_exports("osmosis_strands")
