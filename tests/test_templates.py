"""Tests of starter templates: ``osmosis template list|apply`` (as subprocesses) and ``apply_template``.

The last test applies the built-in ``multiply-plain`` template into an empty folder and runs it
there with ``osmosis run ... --stub-policy``, so the template is known to be a working workspace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from osmosis_core._engine.registry import PluginRegistry
from osmosis_core.templates import TemplateError, TemplateSpec, apply_template

OSMOSIS = Path(sys.executable).parent / "osmosis"
TEMPLATE = "multiply-plain"
FILES = {
    "configs/eval/multiply-plain.toml",
    "configs/training/multiply-plain.toml",
    "rollouts/multiply-plain/main.py",
    "rollouts/multiply-plain/pyproject.toml",
    "rollouts/multiply-plain/data/multiply.jsonl",
    # the coding-assistant guides, a layer shared by every starter template
    "AGENTS.md",
    ".agents/skills/create-rollout/SKILL.md",
    ".agents/skills/debug-run/SKILL.md",
    ".agents/skills/evaluate-rollout/SKILL.md",
    ".agents/skills/prepare-training/SKILL.md",
}


def _osmosis(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_") and k != "PYTHONPATH"}
    env["OSMOSIS_LOAD_PLUGINS"] = ""  # only the core's built-ins: other installed plugins can't interfere
    return subprocess.run(
        [str(OSMOSIS), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def _tree(root: Path) -> set[str]:
    """Every file and folder under root (symlinks not followed), relative, as posix strings."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            found.add((Path(dirpath) / name).relative_to(root).as_posix())
    return found


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def spec() -> TemplateSpec:
    return PluginRegistry(load_entrypoints=False).template(TEMPLATE)


# -- list ------------------------------------------------------------------------------------------


def test_template_list(spec: TemplateSpec) -> None:
    proc = _osmosis("template", "list")
    assert proc.returncode == 0, proc.stderr
    assert spec.description
    lines = [line for line in proc.stdout.splitlines() if line.split()[:1] == [TEMPLATE]]
    assert len(lines) == 1
    assert lines[0].endswith(spec.description)


def test_template_list_json(spec: TemplateSpec) -> None:
    proc = _osmosis("template", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    records = {r["name"]: r for r in json.loads(proc.stdout)}
    assert records[TEMPLATE] == {
        "name": TEMPLATE,
        "description": spec.description,
        "next_steps": spec.next_steps,
    }
    assert "osmosis run configs/eval/multiply-plain.toml --stub-policy" in records[TEMPLATE]["next_steps"]


# -- apply (CLI) -----------------------------------------------------------------------------------


def test_template_apply_refuses_to_overwrite_then_force(tmp_path: Path, spec: TemplateSpec) -> None:
    dest = tmp_path / "ws"
    dest.mkdir()
    proc = _osmosis("template", "apply", TEMPLATE, dest)
    assert proc.returncode == 0, proc.stderr
    assert _files(dest) == FILES
    assert not [p for p in _tree(dest) if "__pycache__" in p or p.endswith(".pyc")]
    for rel in FILES:
        if (spec.root / rel).is_file():
            assert (dest / rel).read_bytes() == (spec.root / rel).read_bytes(), rel
        else:  # a guide from the shared layer, with its placeholders filled in
            source = spec.layers[0] / rel
            assert (dest / rel).read_text() == spec.render(source.read_text()), rel
            assert "{{" not in (dest / rel).read_text()
    for rel in FILES:
        assert f"  {rel}\n" in proc.stdout
    assert f"{len(FILES)} file(s)" in proc.stdout
    assert "next:" in proc.stdout
    assert f"cd {dest} && osmosis run configs/eval/multiply-plain.toml --stub-policy" in proc.stdout

    # a second apply writes nothing: neither over an edited file nor a file that went missing
    main = dest / "rollouts/multiply-plain/main.py"
    edited = main.read_text() + "\n# edited by the user\n"
    main.write_text(edited)
    (dest / "configs/eval/multiply-plain.toml").unlink()
    before = _tree(dest)
    again = _osmosis("template", "apply", TEMPLATE, dest)
    assert again.returncode == 1
    assert again.stdout == ""
    error_lines = again.stderr.strip().splitlines()
    assert len(error_lines) == 1, again.stderr
    assert "--force" in error_lines[0]
    assert f"{len(FILES) - 1} file(s) already exist" in error_lines[0]
    assert "nothing was written" in error_lines[0]
    assert main.read_text() == edited
    assert _tree(dest) == before

    forced = _osmosis("template", "apply", TEMPLATE, dest, "--force")
    assert forced.returncode == 0, forced.stderr
    assert main.read_bytes() == (spec.root / "rollouts/multiply-plain/main.py").read_bytes()
    assert _files(dest) == FILES


def test_template_apply_into_the_current_folder(tmp_path: Path) -> None:
    proc = _osmosis("template", "apply", TEMPLATE, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _files(tmp_path) == FILES
    assert "\n  osmosis run configs/eval/multiply-plain.toml --stub-policy" in proc.stdout
    assert "cd " not in proc.stdout


def test_template_apply_unknown_name(tmp_path: Path) -> None:
    proc = _osmosis("template", "apply", "no-such-template", tmp_path / "ws")
    assert proc.returncode == 1
    assert "unknown template 'no-such-template'" in proc.stderr
    assert "known templates:" in proc.stderr
    assert TEMPLATE in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ws").exists()


def test_template_apply_through_symlink_fails_cleanly(tmp_path: Path) -> None:
    dest, outside = tmp_path / "ws", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "rollouts").symlink_to(outside, target_is_directory=True)
    proc = _osmosis("template", "apply", TEMPLATE, dest, "--force")
    assert proc.returncode == 1
    assert "outside" in proc.stderr
    assert "nothing was written" in proc.stderr
    assert list(outside.iterdir()) == []
    assert _tree(dest) == {"rollouts"}


# -- apply_template (in-process) -------------------------------------------------------------------


@pytest.mark.parametrize("force", [False, True])
def test_apply_template_refuses_a_symlinked_folder_leading_outside(
    tmp_path: Path, spec: TemplateSpec, force: bool
) -> None:
    dest, outside = tmp_path / "ws", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "rollouts").symlink_to(outside, target_is_directory=True)
    with pytest.raises(TemplateError, match=r"rollouts/multiply-plain/.* outside .*nothing was written"):
        apply_template(spec, dest, force=force)
    assert list(outside.iterdir()) == []
    # configs/ sorts before rollouts/, so this shows the check ran before any write
    assert _tree(dest) == {"rollouts"}


def test_apply_template_refuses_a_dangling_file_symlink_leading_outside(tmp_path: Path, spec: TemplateSpec) -> None:
    dest, outside = tmp_path / "ws", tmp_path / "outside"
    (dest / "configs/eval").mkdir(parents=True)
    outside.mkdir()
    (dest / "configs/eval/multiply-plain.toml").symlink_to(outside / "stolen.toml")
    with pytest.raises(TemplateError, match="outside"):
        apply_template(spec, dest, force=True)
    assert list(outside.iterdir()) == []
    assert _tree(dest) == {"configs", "configs/eval", "configs/eval/multiply-plain.toml"}


def test_apply_template_allows_a_symlink_that_stays_inside(tmp_path: Path, spec: TemplateSpec) -> None:
    dest = tmp_path / "ws"
    (dest / "elsewhere").mkdir(parents=True)
    (dest / "rollouts").symlink_to(dest / "elsewhere", target_is_directory=True)
    written = apply_template(spec, dest)
    assert {p.as_posix() for p in written} == FILES
    assert (dest / "elsewhere/multiply-plain/main.py").is_file()


@pytest.fixture
def template_root(tmp_path: Path) -> Path:
    root = tmp_path / "tpl"
    files = {
        "README.md": "readme\n",
        "configs/eval/demo.toml": "[rollout]\n",
        "rollouts/demo/main.py": "print('demo')\n",
        "rollouts/demo/data/rows.jsonl": "{}\n",
        "rollouts/demo/__pycache__/main.cpython-312.pyc": "junk",
        "rollouts/demo/stale.pyc": "junk",
        "rollouts/demo/runs/old/results.jsonl": "{}\n",
        "rollouts/other/main.py": "print('other')\n",
        ".DS_Store": "junk",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_template_spec_files_skip_caches_and_runs(template_root: Path) -> None:
    spec = TemplateSpec("demo", template_root)
    assert [p.as_posix() for p in spec.files()] == [
        "README.md",
        "configs/eval/demo.toml",
        "rollouts/demo/data/rows.jsonl",
        "rollouts/demo/main.py",
        "rollouts/other/main.py",
    ]


def test_template_spec_include_selects_a_subset(template_root: Path, tmp_path: Path) -> None:
    spec = TemplateSpec("demo", template_root, include=("rollouts/demo/**", "configs/eval/demo.toml"))
    expected = ["configs/eval/demo.toml", "rollouts/demo/data/rows.jsonl", "rollouts/demo/main.py"]
    assert [p.as_posix() for p in spec.files()] == expected
    dest = tmp_path / "out"
    written = apply_template(spec, dest)
    assert [p.as_posix() for p in written] == expected
    assert _files(dest) == set(expected)
    assert (dest / "rollouts/demo/main.py").read_text() == "print('demo')\n"


def test_template_spec_include_is_anchored_at_the_root(tmp_path: Path) -> None:
    root = tmp_path / "tpl"
    for rel in ("configs/x.toml", "nested/configs/x.toml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x = 1\n")
    spec = TemplateSpec("demo", root, include=("configs/x.toml",))
    assert [p.as_posix() for p in spec.files()] == ["configs/x.toml"]


def test_template_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="does not exist"):
        TemplateSpec("gone", tmp_path / "missing").files()
    (tmp_path / "empty").mkdir()
    with pytest.raises(TemplateError, match="has no files"):
        apply_template(TemplateSpec("empty", tmp_path / "empty"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- the applied workspace runs --------------------------------------------------------------------


def test_applied_workspace_runs_with_the_stub_policy(tmp_path: Path) -> None:
    dest = tmp_path / "demo"
    dest.mkdir()
    applied = _osmosis("template", "apply", TEMPLATE, dest)
    assert applied.returncode == 0, applied.stderr

    proc = _osmosis("run", "configs/eval/multiply-plain.toml", "--stub-policy", "--limit", "3", cwd=dest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (dest / "runs").iterdir()
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3
    rows = [json.loads(line) for line in lines]
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0]
    assert sorted(r["row"] for r in rows) == [0, 1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert isinstance(summary, dict)
    assert summary.get("finished", 3) == 3
