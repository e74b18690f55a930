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
    """``osmosis run`` of the example against a scripted server; ``faults`` requests answer HTTP 400.

    With faults the rollouts run one at a time, so the faults hit the first rollouts in order (row 0's
    samples): two at once let a loaded machine's scheduling choose (a fault ends a rollout at once,
    and the next row's first request could reach the server before the other sample's)."""
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
                "1" if faults else "2",
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


def line(
    row, sample, *, status="success", reward=1.0, category=None, prompt=None, rollout_id=None, t=None, version=None
):
    """A ``results.jsonl`` line as ``osmosis run`` writes it (a failure: ``agent_error`` in the workflow);
    with ``version``, as ``osmosis serve`` writes a trainer's rollout (its ``policy_version``)."""
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
    } | ({"policy_version": version} if version is not None else {})


def write_run(folder: Path, lines, *, rows=3, n_samples=1, raw_tail: bytes = b"", labels=None, meta=None) -> Path:
    """A run folder of ``lines`` (dicts, or raw text for a damaged line); ``labels``: a dataset of
    ``rows`` prompts (as :func:`line` writes them) with these labels, named in ``run.json``; ``meta``:
    more of ``run.json`` (``{"kind": "serve"}``: a server's folder)."""
    from osmosis_core.frontend import fingerprint

    folder.mkdir(parents=True, exist_ok=True)
    meta = {"rows": rows, "n_samples": n_samples, "dataset": None, **(meta or {})}
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


STEPPED = '''
"""A tool-calling rollout (the multiply example's loop) whose calls after the first are tagged with the
policy version the request's metadata names as ``later``: the weights changed while it ran."""

import json

from osmosis_core import AgentWorkflow, Grader, chat_completion

TOOL = {"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {
    "a": {"type": "number"}, "b": {"type": "number"}}}}}


class Stepped(AgentWorkflow):
    async def run(self, ctx):
        messages, later = list(ctx.prompt), ctx.metadata.get("later")
        for turn in range(4):
            extra = {"osmosis_policy_version": later} if later and turn else {}
            reply = await chat_completion(messages, tools=[TOOL], **extra)
            messages.append(reply)
            if not reply.get("tool_calls"):
                break
            for call in reply["tool_calls"]:
                if not call.get("id"):
                    raise ValueError("the model sent a tool call without an id")
                args = json.loads(call["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] * args["b"])})
        return messages


class Exact(Grader):
    async def grade(self, ctx):
        return 1.0 if ctx.sample.last_text().rstrip().endswith("#### " + str(ctx.label)) else 0.0
'''


def serve_training_run(folder: Path, plan: list[tuple[str, int, int, str, str | None]]) -> Path:
    """A training-style run folder made by ``osmosis serve --traces``: each ``(policy version, row, sample,
    how, later)`` of ``plan`` is a rollout submitted as a trainer does (``row`` and ``sample_index`` are
    its batch's, named again every step), ``how`` ``"right"``, ``"wrong"`` (the stand-in guesses) or
    ``"broken"`` (a tool call without an id: the rollout fails), ``later`` the version its later calls
    name (or None). Needs osmosis-server, osmosis-gateway and osmosis-trainer."""
    import asyncio
    import re
    import secrets
    import threading

    from osmosis_trainer import RolloutClient, RolloutRequest

    rollout = folder / "stepped"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text(STEPPED)
    config = folder / "stepped.toml"
    config.write_text(f'[rollout]\npath = "{rollout}"\nentrypoint = "main.py"\n\n[run]\nconcurrency = 8\n')
    out = folder / "run"
    token = secrets.token_urlsafe(16)
    suffix = {"right": "", "wrong": " (guess)", "broken": " (broken)"}
    with ScriptedPolicyServer(scripted(wrong=["(guess)"], broken=["(broken)"]), flavor="vllm") as policy:
        args = ["serve", str(config), "--port", "0", "--traces", "--grace", "1", "--watch-stdin"]  # it stops with us
        serve = subprocess.Popen(
            [osmosis_exe(), *args, "--output", str(out)],
            env={**clean_env(), "OSMOSIS_SERVER_TOKEN": token},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert serve.stdout is not None
            seen = []
            for text in serve.stdout:
                seen.append(text)
                if found := re.search(r"listening on (http://\S+)", text):
                    url = found.group(1)
                    break
            else:
                raise AssertionError("osmosis serve did not start:\n" + "".join(seen))
            threading.Thread(target=serve.stdout.read, daemon=True).start()  # (a full pipe would block it)
            requests = [
                RolloutRequest(
                    rollout_id=f"{version}-g{row}-s{sample}",
                    initial_messages=[{"role": "user", "content": f"val1 = {row + 2}\nval2 = 3{suffix[how]}"}],
                    chat_completions_url=policy.url,
                    label=str((row + 2) * 3),
                    row=row,
                    sample_index=sample,
                    metadata={"later": later} if later else None,
                    policy_version=version,
                )
                for version, row, sample, how, later in plan
            ]

            async def drive() -> list:
                async with RolloutClient(url, token=token) as client:
                    return [result async for result in client.run_many(requests, concurrency=8)]

            assert len(asyncio.run(drive())) == len(plan)
        finally:
            serve.terminate()
            serve.wait(30)
    return out
