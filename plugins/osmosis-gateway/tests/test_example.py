"""The trainer-side example on traces (examples/grpo_traces.py) runs as its docstring shows it."""

from __future__ import annotations

import re
import subprocess
import sys

from gateway_helpers import REPO


def test_grpo_traces_spreads_group_advantages_over_generated_tokens(clean_env):
    r = subprocess.run(
        [sys.executable, str(REPO / "examples" / "grpo_traces.py"), "--steps", "2", "--rows", "3", "--n", "4"],
        capture_output=True, text=True, timeout=120, env=clean_env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    steps = re.findall(
        r"step (\d): 12 rollouts, mean reward ([\d.]+), 12 sequences, (\d+) trained tokens, 0 prefix breaks, "
        r"0 incomplete dropped, pg loss ([-+][\d.]+)",
        r.stdout,
    )
    assert [s[0] for s in steps] == ["1", "2"], r.stdout
    assert all(int(tokens) > 0 for _, _, tokens, _ in steps)
