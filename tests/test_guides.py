"""The coding-assistant guides an applied template carries name commands that really work."""

from __future__ import annotations

import pytest

from osmosis_core._engine.registry import PluginRegistry
from osmosis_core.templates import apply_template
from osmosis_core.testing import guide_commands, run_guide_commands


def test_multiply_plain_guides_are_filled_in_and_their_commands_run(tmp_path):
    spec = PluginRegistry(load_entrypoints=False).template("multiply-plain")
    written = {p.as_posix() for p in apply_template(spec, tmp_path)}
    assert {"AGENTS.md", ".agents/skills/debug-run/SKILL.md", "configs/training/multiply-plain.toml"} <= written
    for path in [tmp_path / "AGENTS.md", *(tmp_path / ".agents" / "skills").glob("*/SKILL.md")]:
        text = path.read_text()
        assert "{{" not in text, path
    commands = [c for _, c in guide_commands(tmp_path, unique=True)]
    assert "osmosis validate configs/eval/multiply-plain.toml" in commands
    assert any(c.startswith("osmosis run configs/training/multiply-plain.toml --dataset rollouts/") for c in commands)
    results = run_guide_commands(tmp_path)
    assert len(results) == len(commands) >= 6
    assert (tmp_path / "runs" / "debug-one" / "results.jsonl").is_file()


def test_a_failing_guide_command_is_reported_with_its_guide(tmp_path):
    (tmp_path / "AGENTS.md").write_text("```bash\nosmosis validate configs/eval/missing.toml\n```\n")
    with pytest.raises(AssertionError, match=r"AGENTS\.md: `osmosis validate configs/eval/missing\.toml` exited 1"):
        run_guide_commands(tmp_path)
