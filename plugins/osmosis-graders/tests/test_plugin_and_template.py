"""The plugin as a user meets it: lazy imports, `osmosis plugins`, `osmosis validate`, the template applied and run.

Everything here is a real subprocess of this interpreter or of its ``osmosis`` script.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from osmosis_core import Grader, GraderConfig
from osmosis_core.plugin import get_registry
from osmosis_core.templates import MULTIPLY_DATASET
from osmosis_core.testing import check_lazy_exports, run_guide_commands
from osmosis_graders.plugin import GRADERS

TEMPLATE = "multiply-graders"
TEMPLATE_FILES = {
    f"rollouts/{TEMPLATE}/main.py",
    f"rollouts/{TEMPLATE}/pyproject.toml",
    f"configs/eval/{TEMPLATE}.toml",
    f"configs/training/{TEMPLATE}.toml",
    "data/multiply.jsonl",
    "AGENTS.md",
}
NAMES = {"exact-match", "numeric", "regex", "math", "json-match", "contains", "llm-judge", "weighted"}


def test_importing_the_package_and_its_plugin_module_imports_no_heavy_library(osmosis):
    code = """
        import json, sys
        import osmosis_graders, osmosis_graders.plugin
        from osmosis_graders import ExactMatchGrader, MathGrader, LLMJudgeGrader, JsonMatchGrader, WeightedGrader
        heavy = sorted(m for m in ("math_verify", "sympy", "jsonschema", "aiohttp") if m in sys.modules)
        print(json.dumps({"heavy": heavy, "all": osmosis_graders.__all__}))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["heavy"] == []
    assert {"MathGrader", "MathConfig", "WeightedPart", "normalize_answer", "extract_answer"} <= set(report["all"])


def test_every_grader_is_registered_by_name_and_resolves_to_its_class():
    registry = get_registry()
    assert {spec.name for spec in registry.graders()} >= NAMES
    assert {name for name, _path, _line in GRADERS} == NAMES
    for name in NAMES:
        cls = registry.grader(name).resolve()
        assert issubclass(cls, Grader)
        assert issubclass(cls.config_type, GraderConfig)
        assert cls.name == name  # the default metrics prefix is the registered name
        cls.config_type()  # the loader builds the default config when the run config has no table
    assert registry.grader("exact_match").resolve().name == "exact-match"  # names are normalised


def test_osmosis_plugins_lists_the_plugin_and_template_list_the_template(osmosis, tmp_path):
    proc = osmosis("plugins", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (mine,) = [p for p in json.loads(proc.stdout) if p["name"] == "graders"]
    assert mine["status"] == "active"
    assert mine["distribution"] == "osmosis-graders"
    assert mine["error"] is None
    assert mine["hooks"] == ["osmosis_register_graders", "osmosis_register_templates"]
    assert mine["provides"] == {"graders": sorted(NAMES), "templates": [TEMPLATE]}
    table = osmosis("plugins", cwd=tmp_path)  # the table names them too
    assert table.returncode == 0
    assert "exact-match" in table.stdout
    assert "weighted" in table.stdout
    templates = osmosis("template", "list", "--json", cwd=tmp_path)
    assert templates.returncode == 0, templates.stderr
    (spec,) = [t for t in json.loads(templates.stdout) if t["name"] == TEMPLATE]
    assert spec["next_steps"] == f"osmosis run configs/eval/{TEMPLATE}.toml --stub-policy"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, osmosis) -> Path:
    """An empty folder with the template applied through the CLI, as a user does it."""
    folder = tmp_path_factory.mktemp("workspace")
    proc = osmosis("template", "apply", TEMPLATE, str(folder), cwd=folder.parent)
    assert proc.returncode == 0, proc.stderr
    assert f"osmosis run configs/eval/{TEMPLATE}.toml --stub-policy" in proc.stdout
    return folder


def test_the_template_applies_reusing_the_core_example(workspace):
    files = {p.relative_to(workspace).as_posix() for p in workspace.rglob("*") if p.is_file()}
    assert files >= TEMPLATE_FILES
    # one source of truth: the agent and the dataset are the core's multiply-plain files, byte for byte
    assert (workspace / f"rollouts/{TEMPLATE}/main.py").read_bytes() == (
        MULTIPLY_DATASET.parent.parent / "main.py"
    ).read_bytes()
    assert (workspace / "data/multiply.jsonl").read_bytes() == MULTIPLY_DATASET.read_bytes()
    config = tomllib.loads((workspace / f"configs/eval/{TEMPLATE}.toml").read_text())
    assert config["rollout"]["grader"] == "weighted"
    assert [(p["grader"], p["weight"]) for p in config["rollout"]["grader_config"]["parts"]] == [
        ("regex", 0.1),
        ("exact-match", 0.9),
    ]
    assert "osmosis-graders" in (workspace / f"rollouts/{TEMPLATE}/pyproject.toml").read_text()
    agents_md = (workspace / "AGENTS.md").read_text()
    assert TEMPLATE in agents_md
    assert "{{" not in agents_md


def test_the_template_runs_with_the_stub_policy_graded_by_weighted(workspace, osmosis):
    before = set((workspace / "runs").glob("*")) if (workspace / "runs").exists() else set()
    proc = osmosis("run", f"configs/eval/{TEMPLATE}.toml", "--stub-policy", cwd=workspace)  # the next step it prints
    assert proc.returncode == 0, proc.stderr
    [out] = set((workspace / "runs").glob("*")) - before
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(results) == 20
    assert all(r["status"] == "success" and r["reward"] == pytest.approx(1.0) for r in results), [
        r["error"] for r in results
    ]
    metrics = results[0]["metrics"]
    assert metrics["weighted.format"] == 1.0
    assert metrics["weighted.exact-match"] == 1.0
    assert metrics["exact-match.extractor"] == "hash"
    assert metrics["format.matched"].startswith("#### ")
    label = json.loads((workspace / "data/multiply.jsonl").read_text().splitlines()[results[0]["row"]])["ground_truth"]
    assert metrics["exact-match.extracted"] == label
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mean_reward"] == pytest.approx(1.0)
    assert summary["errors_by_category"] == {}


def test_the_template_guides_commands_all_work(workspace):
    for proc in run_guide_commands(workspace):
        assert proc.returncode == 0


def test_validate_reports_a_bad_part_config_with_its_key_path(workspace, osmosis):
    good = (workspace / f"configs/eval/{TEMPLATE}.toml").read_text()
    bad = good.replace('grader = "exact-match"', 'grader = "numeric"').replace(
        'config = { extract = "hash" }', 'config = { extract = "hash", abs_tol = -1.0 }'
    )
    assert bad != good
    (workspace / "configs/eval/bad.toml").write_text(bad)
    proc = osmosis("validate", "configs/eval/bad.toml", cwd=workspace)
    assert proc.returncode == 1
    assert "configs/eval/bad.toml: invalid config" in proc.stderr
    assert "must be a finite number >= 0, got -1.0 @ $.rollout.grader_config.parts[1].config.abs_tol" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_run_whose_grader_fails_reports_the_category_and_keeps_going(workspace, osmosis):
    """`math` with a label it cannot read: a validation_error per rollout, in the results and the summary."""
    config = (workspace / f"configs/eval/{TEMPLATE}.toml").read_text()
    start = config.index("# reward =")
    end = config.index("[dataset]")
    math = config[:start] + '[rollout.grader_config]\nextract = "hash"\nlabel_extract = "boxed"\n\n' + config[end:]
    (workspace / "configs/eval/math.toml").write_text(math.replace('grader = "weighted"', 'grader = "math"'))
    proc = osmosis(
        "run", "configs/eval/math.toml", "--stub-policy", "--limit", "2", "--output", "out-math", cwd=workspace
    )
    results = [json.loads(line) for line in (workspace / "out-math/results.jsonl").read_text().splitlines()]
    assert [r["error"]["category"] for r in results] == ["validation_error", "validation_error"], proc.stderr
    assert "math: no answer in the label" in results[0]["error"]["message"]


def test_the_public_names_type_checkers_read_are_the_ones_the_package_hands_out():
    check_lazy_exports("osmosis_graders")
