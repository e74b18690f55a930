"""The trainer-side example (examples/grpo_loop.py) runs as the README shows it."""

from __future__ import annotations

import re
import subprocess
import sys

from server_helpers import REPO


def test_the_grpo_loop_example_prints_group_advantages_per_step():
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "grpo_loop.py"), "--steps", "2", "--rows", "3", "--n", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    steps = re.findall(r"^step (\d): 3 rows x 4 samples in [\d.]+s, mean reward ([\d.]+)", out.stdout, re.M)
    assert [s for s, _ in steps] == ["1", "2"], out.stdout
    rows = re.findall(r"^  row +\d+  rewards ((?:[01] ){4}) advantages ((?:[+-]\d\.\d\d ?){4})$", out.stdout, re.M)
    assert len(rows) == 6, out.stdout
    for rewards, advantages in rows:
        values = [float(a) for a in advantages.split()]
        assert abs(sum(values)) < 0.03  # group-relative: they sum to zero per row (printed to 2 places)
        if len(set(rewards.split())) == 1:
            assert values == [0.0] * 4
