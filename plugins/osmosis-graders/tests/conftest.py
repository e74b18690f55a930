"""Fixtures: grade a reply with a real grader instance on a real event loop, and run the CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from osmosis_core import Grader, GraderContext, RolloutSample
from osmosis_core.http import http_scope

OSMOSIS = Path(sys.executable).parent / "osmosis"

Grade = Callable[..., tuple[float | None, RolloutSample]]


def sample_of(reply: str | None, *, prompt: str = "What is it?") -> RolloutSample:
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    if reply is not None:
        messages.append({"role": "assistant", "content": reply})
    return RolloutSample(messages=messages)


async def grade_async(
    grader: Grader[Any], reply: str | None, label: Any, *, prompt: str = "What is it?"
) -> tuple[float | None, RolloutSample]:
    """Grade one reply in the running loop; return the reward and the sample (with its metrics)."""
    sample = sample_of(reply, prompt=prompt)
    ctx = GraderContext(sample, label, [{"role": "user", "content": prompt}], {}, grader.config)
    return await grader.grade(ctx), sample


@pytest.fixture
def grade() -> Grade:
    """``grade(grader, reply, label)``: one grading on a fresh loop (its HTTP session closed after)."""

    def run(grader: Grader[Any], reply: str | None, label: Any, **kwargs: Any) -> tuple[float | None, RolloutSample]:
        async def main() -> tuple[float | None, RolloutSample]:
            async with http_scope():
                return await grade_async(grader, reply, label, **kwargs)

        return asyncio.run(main())

    return run


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of an ``osmosis`` subprocess: the core's built-ins and this plugin only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_") and k != "PYTHONPATH"}
    env["OSMOSIS_LOAD_PLUGINS"] = "graders"
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def osmosis() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``osmosis(*args, cwd=...)``: the real CLI of this environment, in a subprocess."""

    def run(
        *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(OSMOSIS), *args],
            cwd=cwd,
            env=env or cli_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run
