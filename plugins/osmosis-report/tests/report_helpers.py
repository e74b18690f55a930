"""Helpers for real runs of the multiply example to report on: `osmosis run` against the scripted server, with
rows it answers wrongly, a row whose tool call breaks the workflow, and injected HTTP faults."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from osmosis_core.testing import Fault, Reply, ScriptedPolicyServer, ToolCall, calculator

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "rollouts" / "multiply-plain"
HOSTILE = "val1 = 12\nval2 = 3 <script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
"""A prompt that would run script if the report put it on the page as markup."""


def osmosis_exe() -> str:
    exe = Path(sys.executable).parent / "osmosis"
    assert exe.exists(), f"osmosis is not installed next to {sys.executable}"
    return str(exe)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env["COLUMNS"] = "200"
    return env


def scripted(wrong: Iterable[str] = (), broken: Iterable[str] = ()) -> Callable[[dict[str, Any]], Reply]:
    """The calculator, except: a prompt holding one of ``wrong`` gets a wrong answer, one holding
    one of ``broken`` gets a tool call without an id (the workflow raises: a validation error)."""
    wrong, broken = tuple(wrong), tuple(broken)

    def script(request: dict[str, Any]) -> Reply:
        users = [m for m in request.get("messages", []) if m.get("role") == "user"]
        text = str(users[-1].get("content")) if users else ""
        if any(w in text for w in wrong):
            return Reply(content="I think it is this.\n#### 1")
        if any(b in text for b in broken):
            return Reply(tool_calls=[ToolCall("multiply", {"a": 1, "b": 2}, id=None)])
        return calculator(request)

    return script


def make_run(
    workspace: Path,
    name: str,
    script: Callable[[dict[str, Any]], Reply],
    *,
    faults: int = 0,
    n_samples: int = 2,
    extra: tuple[str, ...] = (),
) -> Path:
    """``osmosis run`` of the example against a scripted server; ``faults`` requests answer HTTP 400."""
    with ScriptedPolicyServer(script) as server:
        if faults:
            server.inject(Fault("status", status=400, message="context length exceeded (injected)"), times=faults)
        r = subprocess.run(
            [
                osmosis_exe(),
                "run",
                "configs/eval/multiply-plain.toml",
                "--policy-url",
                server.url,
                "--model",
                "scripted-calculator",
                "--n-samples",
                str(n_samples),
                "--concurrency",
                "2",
                "--output",
                f"runs/{name}",
                *extra,
            ],
            cwd=workspace,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert r.returncode in (0, 1), r.stderr
    return workspace / "runs" / name
