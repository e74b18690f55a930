"""Helpers of the osmosis-ray tests: rollouts loaded as ``osmosis run`` loads them, real requests, real CLI runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import attrs

HERE = Path(__file__).resolve().parent
ROLLOUTS = HERE / "rollouts"
FAULTS = ROLLOUTS / "faults"
DRIVER_ONLY = ROLLOUTS / "driver_only"
DRIVER_ONLY_PATH = HERE / "driver_only_path"
REPO = HERE.parents[2]
OSMOSIS = str(Path(sys.executable).parent / "osmosis")


def load(rollout_dir: Path, entrypoint: str = "main.py") -> Any:
    """Load a rollout the way ``osmosis run`` does (its folder on sys.path, its entrypoint imported as ``main``)."""
    from osmosis_core.frontend import config_from_dict, load_rollout

    config = config_from_dict({"rollout": {"path": str(rollout_dir), "entrypoint": entrypoint}}, root=rollout_dir)
    return load_rollout(config)


def backend(rollout: Any, **config: Any) -> Any:
    """A RayBackend for a loaded rollout on the session cluster (two actors unless told otherwise)."""
    from osmosis_ray import RayBackend, RayBackendConfig

    config.setdefault("actors", 2)
    max_concurrent = config.pop("max_concurrent", 8)
    return RayBackend(
        rollout.workflow_class,
        rollout.workflow_config,
        rollout.grader_class,
        rollout.grader_config,
        config=RayBackendConfig(**config),
        max_concurrent=max_concurrent,
        rollout_dir=rollout.rollout_dir,
    )


def request(rollout_id: str, url: str, a: int = 6, b: int = 7, *, timeout: float = 60, **metadata: Any) -> Any:
    from osmosis_core import ExecutionRequest, PolicyEndpoint

    return ExecutionRequest(
        rollout_id,
        [{"role": "user", "content": f"val1 = {a}\nval2 = {b}"}],
        PolicyEndpoint(url, "stub"),
        label=str(a * b),
        metadata=metadata,
        agent_timeout_sec=timeout,
        grader_timeout_sec=timeout,
    )


@attrs.define
class Outcome:
    """One rollout's results, in callback order, and when its last callback fired."""

    results: list[Any] = attrs.field(factory=list)
    order: int = -1

    @property
    def final(self) -> Any:
        return self.results[-1]


def run_all(backend: Any, requests: list[Any], *, close: bool = True, during: Any = None) -> dict[str, Outcome]:
    """Execute every request concurrently on ``backend``; each rollout's outcome by rollout id.

    ``during`` (an async callable taking the backend) runs alongside, e.g. to kill an actor mid-run.
    """
    outcomes = {r.rollout_id: Outcome() for r in requests}
    finished: list[str] = []

    async def one(req: Any) -> None:
        async def keep(result: Any) -> None:
            outcomes[req.rollout_id].results.append(result)

        await backend.execute(req, keep, keep)
        outcomes[req.rollout_id].order = len(finished)
        finished.append(req.rollout_id)

    async def main() -> None:
        try:
            async with anyio.create_task_group() as tg:
                for req in requests:
                    tg.start_soon(one, req)
                if during is not None:
                    tg.start_soon(during, backend)
        finally:
            if close:
                with anyio.CancelScope(shield=True):
                    await backend.aclose()
                    from osmosis_core.http import aclose_http

                    await aclose_http()

    anyio.run(main)
    return outcomes


def osmosis(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the real ``osmosis`` CLI."""
    full = {**os.environ, "OSMOSIS_DEBUG": "0", **(env or {})}
    return subprocess.run([OSMOSIS, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


def results(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of a run's results.jsonl."""
    path = run_dir / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def write_dataset(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
