"""The osmosis-ray tests' probe rollout: each row's metadata says what happens on the actor.

``do`` (default ``ask``):

* ``ask``: ask the policy once (the scripted calculator server) and keep its answer;
* ``sleep:S``: sleep S seconds (the event loop keeps turning), then answer;
* ``exit``: end the actor's process at once (``os._exit``): a poison row;
* ``block:S``: block the actor's event loop for S seconds (``time.sleep``): a hung actor;
* ``raise:NAME``: raise ``ValueError`` or ``RuntimeError``.

Every sample records where and when it ran (``metrics``: pid, node, started, ended). A rollout
that is cancelled writes ``<marks>/<rollout id>.cancelled``, where ``marks`` is the row's
``marks`` or ``$OSMOSIS_RAY_TEST_MARKS`` (set through ``[backend.ray.runtime_env]``), and
``$OSMOSIS_RAY_TEST_STARTS`` likewise collects ``<rollout id>.<pid>`` for every start.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from osmosis_core import AgentWorkflow, AgentWorkflowContext, Grader, GraderContext, RolloutSample, chat_completion


def _where() -> dict[str, Any]:
    node = ""
    try:
        import ray

        node = ray.get_runtime_context().get_node_id()
    except Exception:
        pass
    return {"pid": os.getpid(), "node": node, "file": __file__, "cwd": os.getcwd()}


def _mark(folder: str | None, name: str) -> None:
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_text("")


class FaultsWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> RolloutSample:
        rollout_id = ctx.rollout.rollout_id
        _mark(os.environ.get("OSMOSIS_RAY_TEST_STARTS"), f"{rollout_id}.{os.getpid()}")
        kind, _, arg = str(ctx.metadata.get("do", "ask")).partition(":")
        started = time.time()
        try:
            if kind == "sleep":
                await asyncio.sleep(float(arg))
            elif kind == "exit":
                os._exit(17)
            elif kind == "block":
                time.sleep(float(arg))
            elif kind == "raise":
                raise {"ValueError": ValueError, "RuntimeError": RuntimeError}[arg](f"the probe raised {arg}")
        except asyncio.CancelledError:
            _mark(ctx.metadata.get("marks") or os.environ.get("OSMOSIS_RAY_TEST_MARKS"), f"{rollout_id}.cancelled")
            raise
        reply = await chat_completion(ctx.prompt)
        metrics = {**_where(), "started": started, "ended": time.time()}
        return RolloutSample(messages=[*ctx.prompt, reply], metrics=metrics)


class FaultsGrader(Grader):
    async def grade(self, ctx: GraderContext) -> float:
        return 1.0 if ctx.sample.last_text().rstrip().endswith(str(ctx.label)) else 0.0
