"""Fixtures: a workspace of the multiply example (plus a hostile row) and two real runs of it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for ``import report_helpers`` (importlib mode)

from report_helpers import EXAMPLE, HOSTILE, REPO, make_run, scripted


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example workspace with a dataset of its 20 rows plus a hostile one."""
    root = tmp_path_factory.mktemp("workspace")
    shutil.copytree(EXAMPLE, root / "rollouts" / "multiply-plain", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "configs" / "eval").mkdir(parents=True)
    shutil.copy(REPO / "configs" / "eval" / "multiply-plain.toml", root / "configs" / "eval")
    data = root / "rollouts" / "multiply-plain" / "data" / "multiply.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows.append({"system_prompt": rows[0]["system_prompt"], "user_prompt": HOSTILE, "ground_truth": "36"})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="session")
def run_a(workspace: Path) -> Path:
    """Row 1 always wrong, row 2's workflow always breaks, two requests fail with HTTP 400."""
    return make_run(workspace, "a", scripted(wrong=["val1 = 156"], broken=["val1 = 668"]), faults=2)


@pytest.fixture(scope="session")
def run_b(workspace: Path) -> Path:
    """Row 1 fixed and row 3 now wrong (flips both ways against run a), row 2 still broken."""
    return make_run(workspace, "b", scripted(wrong=["val1 = 76\n"], broken=["val1 = 668"]))
