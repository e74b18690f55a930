"""Run the commands the coding-assistant guides of an applied template name, as a test would.

The guides (``AGENTS.md``, ``.agents/skills/*/SKILL.md``) put runnable commands in ```bash
blocks and commands with placeholders (a model name, a URL) in ```text blocks. A template's test
applies it and runs every ```bash command, so a guide never names a command that does not work::

    def test_guides(tmp_path):
        apply_template(get_registry().template("multiply-local-strands"), tmp_path)
        for result in run_guide_commands(tmp_path):
            assert result.returncode == 0
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

__all__ = ["guide_commands", "run_guide_commands"]

_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def guide_commands(folder: Path, *, unique: bool = False) -> list[tuple[Path, str]]:
    """(guide file, command) for every line of every ```bash block, in reading order.

    :param unique: each distinct command once (the first guide that names it), as
        :func:`run_guide_commands` runs them.
    """
    guides = [folder / "AGENTS.md", *sorted((folder / ".agents" / "skills").glob("*/SKILL.md"))]
    commands: list[tuple[Path, str]] = []
    for guide in guides:
        if not guide.is_file():
            continue
        for block in _BLOCK.findall(guide.read_text(encoding="utf-8")):
            for line in block.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    commands.append((guide, line.strip()))
    if unique:
        seen: set[str] = set()
        commands = [(g, c) for g, c in commands if not (c in seen or seen.add(c))]  # type: ignore[func-returns-value]
    return commands


def run_guide_commands(folder: Path, *, timeout: float = 180.0) -> list[subprocess.CompletedProcess[str]]:
    """Run every distinct guide command once, with bash in ``folder``; this interpreter's scripts come
    first on PATH (several guides name the same command: running it twice proves nothing more).

    :raises AssertionError: naming the guide, the command and its output, at the first failure.
    """
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.pop("OSMOSIS_DEBUG", None)
    results = []
    for guide, command in guide_commands(folder, unique=True):
        proc = subprocess.run(
            ["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            raise AssertionError(
                f"{guide.relative_to(folder)}: `{command}` exited {proc.returncode}\n{proc.stdout[-2000:]}\n"
                f"{proc.stderr[-2000:]}"
            )
        results.append(proc)
    return results
