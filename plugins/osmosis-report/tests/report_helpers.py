"""Helpers for real runs of the multiply example to report on: `osmosis run` against the scripted server, with
rows it answers wrongly, a row whose tool call breaks the workflow, and injected HTTP faults; and run folders
written line by line (:func:`line`, :func:`write_run`) for what a real run rarely holds."""

from __future__ import annotations

import json
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


def line(row, sample, *, status="success", reward=1.0, category=None, prompt=None, rollout_id=None, t=None):
    """A ``results.jsonl`` line as ``osmosis run`` writes it (a failure: ``agent_error`` in the workflow)."""
    messages = [
        {"role": "user", "content": prompt or f"val1 = {row}\nval2 = 2"},
        {"role": "assistant", "content": "#### 2"},
    ]
    return {
        "row": row,
        "sample_index": sample,
        "rollout_id": rollout_id or f"x-{row}-{sample}",
        "status": status,
        "stage": "grader" if status == "success" else "workflow",
        "error": None
        if status == "success"
        else {"category": category or "agent_error", "message": "boom (at main.py:3 in run)"},
        "reward": reward if status == "success" else None,
        "metrics": {},
        "timings": {"workflow": 0.5, "grader": 0.1},
        "finished_at": t,
        "sample": {"messages": messages, "system_prompt": None, "chat_messages": None},
    }


def write_run(folder: Path, lines, *, rows=3, n_samples=1, raw_tail: bytes = b"", labels=None) -> Path:
    """A run folder of ``lines`` (dicts, or raw text for a damaged line); ``labels``: a dataset of
    ``rows`` prompts (as :func:`line` writes them) with these labels, named in ``run.json``."""
    from osmosis_core.frontend import fingerprint

    folder.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"rows": rows, "n_samples": n_samples, "dataset": None}
    if labels is not None:
        data = folder.parent / f"{folder.name}-dataset.jsonl"
        data.write_text(
            "".join(
                json.dumps({"user_prompt": f"val1 = {row}\nval2 = 2", "ground_truth": label}) + "\n"
                for row, label in enumerate(labels)
            )
        )
        meta.update(dataset=str(data), dataset_sha256=fingerprint(data))
    (folder / "run.json").write_text(json.dumps(meta))
    with (folder / "results.jsonl").open("wb") as handle:
        for item in lines:
            handle.write((item if isinstance(item, str) else json.dumps(item)).encode() + b"\n")
        handle.write(raw_tail)
    return folder
