"""Helpers of the osmosis-harbor tests: real Harbor trials in the real bubblewrap sandbox.

Nothing of osmosis is faked: rollouts are loaded the way ``osmosis run`` loads them, the policy is
the core's scripted server speaking real HTTP on 127.0.0.1, and every trial runs Harbor's own
trial runner.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import attrs

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HERE = Path(__file__).resolve().parent
PROBE_DIR = HERE / "rollouts" / "probe"
TASKS_DIR = HERE / "tasks"
OSMOSIS = str(Path(sys.executable).parent / "osmosis")


def load(rollout_dir: Path, entrypoint: str) -> Any:
    """Load a rollout the way ``osmosis run`` does (its folder on sys.path, its entrypoint imported)."""
    from osmosis_core.frontend import config_from_dict, load_rollout

    config = config_from_dict({"rollout": {"path": str(rollout_dir), "entrypoint": entrypoint}}, root=rollout_dir)
    return load_rollout(config)


@attrs.define
class Outcome:
    """Both stages' results of one rollout run through a backend."""

    results: list[Any]

    @property
    def workflow(self) -> Any:
        return self.results[0]

    @property
    def final(self) -> Any:
        return self.results[-1]


def run_all(backend: Any, requests: list[Any]) -> list[Outcome]:
    """Execute every request on ``backend`` concurrently; close it; return each rollout's results."""
    outcomes = [Outcome([]) for _ in requests]

    async def one(i: int) -> None:
        async def keep(result: Any) -> None:
            outcomes[i].results.append(result)

        await backend.execute(requests[i], keep, keep)

    async def main() -> None:
        try:
            async with anyio.create_task_group() as tg:
                for i in range(len(requests)):
                    tg.start_soon(one, i)
        finally:
            await backend.aclose()
            from osmosis_core.http import aclose_http

            await aclose_http()

    anyio.run(main)
    return outcomes


def request(rollout_id: str, url: str, *, prompt: str = "probe", label: Any = "pass", **metadata: Any) -> Any:
    from osmosis_core import ExecutionRequest, PolicyEndpoint

    return ExecutionRequest(
        rollout_id=rollout_id,
        prompt=[{"role": "user", "content": prompt}],
        policy=PolicyEndpoint(url, "osmosis-stub"),
        label=label,
        metadata=metadata,
        agent_timeout_sec=60,
        grader_timeout_sec=60,
    )


def osmosis(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the ``osmosis`` CLI of this interpreter."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([OSMOSIS, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def sandbox_processes(marker: str) -> list[str]:
    """Command lines of live processes containing ``marker`` (to prove nothing was left behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and str(os.getpid()) != entry.name:
            found.append(f"{entry.name}: {cmdline}")
    return found
