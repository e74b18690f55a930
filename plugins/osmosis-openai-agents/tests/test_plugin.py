"""The plugin as users meet it: a light import, the entry point, and the template applied and run by the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from osmosis_core.testing import check_lazy_exports

OSMOSIS = Path(sys.executable).parent / "osmosis"
TEMPLATE = "multiply-local-openai"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_") and k != "PYTHONPATH"}
    env["OSMOSIS_LOAD_PLUGINS"] = "openai-agents"  # only this plugin: others installed here can't interfere
    env["COLUMNS"] = "200"
    return env


def _osmosis(*args: str, cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(OSMOSIS), *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def test_importing_the_package_and_its_plugin_does_not_import_the_framework():
    code = (
        "import sys, osmosis_openai_agents, osmosis_openai_agents.plugin\n"
        "spec, = osmosis_openai_agents.plugin.osmosis_register_templates()\n"
        "heavy = sorted(m for m in ('agents', 'openai', 'httpx2', 'pydantic') if m in sys.modules)\n"
        "print(spec.name, heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [TEMPLATE, "[]"]


def test_public_names_load_the_framework_on_first_use():
    import osmosis_openai_agents

    assert set(osmosis_openai_agents.__all__) >= {"OsmosisAgent", "OsmosisRolloutModel"}
    from agents import Agent, Model

    assert issubclass(osmosis_openai_agents.OsmosisAgent, Agent)
    assert issubclass(osmosis_openai_agents.OsmosisRolloutModel, Model)


def test_the_template_is_listed_by_its_entry_point(tmp_path: Path):
    proc = _osmosis("template", "list", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert TEMPLATE in proc.stdout


def test_the_template_applies_and_runs_with_the_stub_policy(tmp_path: Path):
    proc = _osmosis("template", "apply", TEMPLATE, str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    files = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert {
        f"rollouts/{TEMPLATE}/main.py",
        f"rollouts/{TEMPLATE}/pyproject.toml",
        f"configs/eval/{TEMPLATE}.toml",
        f"configs/training/{TEMPLATE}.toml",
        "data/multiply.jsonl",
        "AGENTS.md",
    } <= files
    assert f"osmosis run configs/eval/{TEMPLATE}.toml --stub-policy" in proc.stdout

    proc = _osmosis("run", f"configs/eval/{TEMPLATE}.toml", "--stub-policy", "--output", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(results) == 20
    assert all(r["status"] == "success" and r["reward"] == 1.0 for r in results), results[0]
    first = results[0]
    assert [m.get("type", m.get("role")) for m in first["sample"]["messages"]] == [
        "user",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert [m["role"] for m in first["sample"]["chat_messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert first["sample"]["system_prompt"].startswith("You are a careful calculator")
    assert first["metrics"]["turns"] == 2

    proc = _osmosis("validate", f"configs/training/{TEMPLATE}.toml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_the_applied_templates_guides_name_commands_that_work(tmp_path):
    from osmosis_core.templates import apply_template
    from osmosis_core.testing import guide_commands, run_guide_commands
    from osmosis_openai_agents.plugin import osmosis_register_templates

    [spec] = osmosis_register_templates()
    apply_template(spec, tmp_path)
    assert "{{" not in (tmp_path / ".agents" / "skills" / "prepare-training" / "SKILL.md").read_text()
    commands = [c for _, c in guide_commands(tmp_path, unique=True)]
    assert (
        f"osmosis run configs/training/{TEMPLATE}.toml --dataset data/multiply.jsonl --stub-policy --limit 4"
        in commands
    )
    assert len(run_guide_commands(tmp_path)) == len(commands)


def test_the_public_names_type_checkers_read_are_the_ones_the_package_hands_out():
    check_lazy_exports("osmosis_openai_agents")
