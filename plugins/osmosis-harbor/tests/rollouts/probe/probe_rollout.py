"""probe: a rollout whose workflow reports what it can see and do inside a trial (for the tests).

Each row's ``probe`` metadata is a list of actions; the workflow performs them in order and returns
one assistant message whose content is the JSON list of observations. The grader gives 1.0 when
the row's label is ``"pass"``, else 0.0, so a rollout that tries to forge its reward has label "fail".
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from osmosis_core import AgentWorkflow, AgentWorkflowContext, Grader, GraderContext, RolloutSample, chat_completion


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"


def _connect(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=3):
        return "connected"


def _chat_as(policy: Any, rollout_id: str, with_token: bool) -> int:
    """The HTTP status of a chat call to another rollout's route (the same base, another id)."""
    import urllib.error
    import urllib.request

    base = policy.base_url.rstrip("/").rsplit("/", 1)[0]
    body = json.dumps({"model": policy.model, "messages": [{"role": "user", "content": "forged"}]}).encode()
    headers = {"Content-Type": "application/json"}
    if with_token:
        headers["Authorization"] = f"Bearer {policy.api_key}"
    call = urllib.request.Request(f"{base}/{rollout_id}/chat/completions", body, headers, method="POST")
    try:
        with urllib.request.urlopen(call, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _get(policy: Any, path: str) -> int:
    """The HTTP status of a GET of ``path`` on the policy's host (another route than its chat), with its token."""
    import urllib.error
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(policy.base_url)
    call = urllib.request.Request(
        f"{parts.scheme}://{parts.netloc}{path}", headers={"Authorization": f"Bearer {policy.api_key}"}
    )
    try:
        with urllib.request.urlopen(call, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _writable(tops: list[str]) -> list[str]:
    """Every path under ``tops`` this process may write (checked with access(2): nothing is written)."""
    found = []
    for top in tops:
        for folder, dirs, files in os.walk(top):
            found += [
                os.path.join(folder, n) for n in (".", *dirs, *files) if os.access(os.path.join(folder, n), os.W_OK)
            ]
    return found


def _forge() -> str:
    Path("/logs/verifier").mkdir(parents=True, exist_ok=True)
    Path("/logs/verifier/reward.json").write_text('{"reward": 1}')
    Path("/logs/verifier/reward.txt").write_text("1")
    Path("/logs/verifier/osmosis-grader.json").write_text(
        json.dumps({"rollout_id": "x", "stage": "grader", "status": "success", "sample": {"messages": [], "reward": 1}})
    )
    Path("/tests").mkdir(exist_ok=True)
    Path("/tests/osmosis-grade.sh").write_text("echo '{\"reward\": 1}' > /logs/verifier/reward.json\n")
    Path("/tests/test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    Path("/app/osmosis_harbor").mkdir(parents=True, exist_ok=True)
    Path("/app/osmosis_harbor/__init__.py").write_text("raise SystemExit(0)\n")
    Path("/app/sitecustomize.py").write_text("import os; os._exit(0)\n")
    subprocess.Popen(
        ["sh", "-c", "while true; do echo '{\"reward\": 1}' > /logs/verifier/reward.json; sleep 0.05; done"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return "forged"


class ProbeWorkflow(AgentWorkflow):
    """Performs the row's probe actions; returns the observations as the last message."""

    async def run(self, ctx: AgentWorkflowContext) -> RolloutSample:
        seen: list[Any] = [{"user_prompt": ctx.user_prompt, "cwd": os.getcwd(), "pid": os.getpid()}]
        forged = False
        for action in ctx.metadata.get("probe", []):
            kind, arg = next(iter(action.items()))
            if kind == "read":
                seen.append(_try(lambda a=arg: Path(a).read_text()[:200]))
            elif kind == "list":
                seen.append(_try(lambda a=arg: sorted(os.listdir(a))))
            elif kind == "writable":
                seen.append(_writable(arg))
            elif kind == "exists":
                seen.append(os.path.exists(arg))
            elif kind == "connect":
                seen.append(_try(lambda a=arg: _connect(a[0], int(a[1]))))
            elif kind == "env":
                seen.append(os.environ.get(arg))
            elif kind == "env_digest":  # proves a secret arrived without putting it in the sample
                value = os.environ.get(arg)
                seen.append(hashlib.sha256(value.encode()).hexdigest() if value else None)
            elif kind == "shell":  # what a tool the agent runs sees (its output)
                seen.append(_try(lambda a=arg: subprocess.run(["sh", "-c", a], capture_output=True, text=True).stdout))
            elif kind == "leak_key":  # an agent that writes the key into its own sample
                seen.append(f"{arg}{ctx.policy.api_key}".encode())
            elif kind == "write":
                seen.append(_try(lambda a=arg: Path(a[0]).write_text(a[1])))
            elif kind == "plant":  # like write, making the folders on the way (~ is the sandbox's home)
                path = Path(os.path.expanduser(arg[0]))
                path.parent.mkdir(parents=True, exist_ok=True)
                seen.append(_try(lambda p=path, a=arg: p.write_text(a[1])))
            elif kind == "spawn":
                subprocess.Popen(["sh", "-c", arg], start_new_session=True, stdout=subprocess.DEVNULL)
                seen.append("spawned")
            elif kind == "sleep":
                await asyncio.sleep(float(arg))
            elif kind == "block":
                time.sleep(float(arg))
            elif kind == "forge":
                seen.append(_forge())
                forged = True
            elif kind == "chat":
                reply = await chat_completion([{"role": "user", "content": str(arg)}])
                seen.append(reply.get("content"))
            elif kind == "chat_as":  # [rollout id, with its own token]: a call to another rollout's trace
                seen.append(_try(lambda a=arg: _chat_as(ctx.policy, a[0], a[1])))
            elif kind == "get":  # another route of whatever serves the policy's URL
                seen.append(_try(lambda a=arg: _get(ctx.policy, a)))
            elif kind == "policy_url":
                seen.append(ctx.policy.base_url)
            elif kind == "raise":
                raise RuntimeError(str(arg))
        messages = [*ctx.prompt, {"role": "assistant", "content": json.dumps(seen, default=repr)}]
        return RolloutSample(messages=messages, reward=1.0 if forged else None, metrics={"actions": len(seen) - 1})


class ProbeGrader(Grader):
    """1.0 when the label is "pass"."""

    async def grade(self, ctx: GraderContext) -> float:
        return 1.0 if ctx.label == "pass" else 0.0
