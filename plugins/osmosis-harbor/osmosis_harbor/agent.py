"""``OsmosisWorkflowAgent``: the Harbor agent that runs an osmosis workflow inside the trial.

Harbor builds it from ``AgentConfig(import_path="osmosis_harbor.agent:OsmosisWorkflowAgent",
kwargs={"ticket": ...})``; the ticket names a rollout the ``harbor`` backend registered in this
process. ``run`` uploads the request to ``/logs/agent/osmosis-request.json``, starts the runner
(:mod:`osmosis_harbor.in_trial`) in the environment against the rollout's policy endpoint, and
reads the workflow's result back from ``/logs/agent/osmosis-result.json``. A failed workflow
raises :class:`WorkflowFailed`, which ends the trial before verification.
"""

from __future__ import annotations

import json
import shlex
import time
from typing import Any

from osmosis_harbor._harbor import prepare_harbor_import

prepare_harbor_import()

from harbor.agents.base import BaseAgent  # noqa: E402
from harbor.environments.base import BaseEnvironment  # noqa: E402
from harbor.models.agent.context import AgentContext  # noqa: E402

from osmosis_core import InfraError  # noqa: E402
from osmosis_core.plugin import clip  # noqa: E402
from osmosis_core.wire import policy_to_json, result_from_json  # noqa: E402
from osmosis_harbor.in_trial import REQUEST_FILE, RESULT_FILE, bootstrap  # noqa: E402
from osmosis_harbor.tickets import get_ticket  # noqa: E402
from osmosis_harbor.wire import secret_env  # noqa: E402

__all__ = ["AGENT_IMPORT_PATH", "OsmosisWorkflowAgent", "WorkflowFailed", "WorkflowRunnerError"]

AGENT_IMPORT_PATH = "osmosis_harbor.agent:OsmosisWorkflowAgent"

_TIMEOUT_MARGIN = 0.5
"""Seconds before Harbor's agent timeout at which the workflow's own timeout fires (so a timed-out
workflow still reports its partial sample); Harbor's timeout stays the backstop that kills."""


class WorkflowFailed(Exception):
    """The workflow failed inside the trial (its result, with category and message, is on the ticket)."""


class WorkflowRunnerError(InfraError):
    """The runner inside the trial wrote no result (it could not start, or was killed)."""


class OsmosisWorkflowAgent(BaseAgent):
    """Runs the rollout's :class:`~osmosis_core.AgentWorkflow` in the trial's environment."""

    def __init__(self, logs_dir: Any, model_name: str | None = None, logger: Any = None, **kwargs: Any) -> None:
        ticket_id = kwargs.pop("ticket", None)
        super().__init__(logs_dir, model_name=model_name, logger=logger, **kwargs)
        if not isinstance(ticket_id, str):
            raise ValueError("OsmosisWorkflowAgent needs kwargs={'ticket': ...} from the harbor backend")
        self._ticket_id = ticket_id

    @staticmethod
    def name() -> str:
        return "osmosis-workflow"

    def version(self) -> str:
        from osmosis_core import __version__

        return __version__

    async def setup(self, environment: BaseEnvironment) -> None:
        ticket = get_ticket(self._ticket_id)
        for target, source in ticket.upload.items():
            await environment.upload_dir(source, target)

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        ticket = get_ticket(self._ticket_id)
        ticket.agent_started = time.perf_counter()
        request = ticket.request
        timeout = request.agent_timeout_sec
        deadline = None
        if timeout and timeout > 0:
            deadline = time.time() + timeout - min(_TIMEOUT_MARGIN, timeout * 0.1)
        payload = {
            "rollout_id": request.rollout_id,
            "prompt": ticket.workflow_prompt(instruction),
            "metadata": request.metadata,
            "policy": policy_to_json(request.policy),
            "workflow": ticket.workflow.to_json(),
            "workflow_config": ticket.workflow_config,
            "code_dir": ticket.code_dir,
            "deadline": deadline,
            "task": ticket.task_name,
            "policy_socket": getattr(environment, "policy_socket", None),  # a no-network trial's path to it
        }
        staged = ticket.staging / "request.json"
        staged.write_text(json.dumps(payload, default=repr), encoding="utf-8")
        await environment.upload_file(staged, REQUEST_FILE)
        command = " ".join(
            shlex.quote(part)
            for part in (ticket.python, "-I", "-c", bootstrap(ticket.lib_paths), "run", REQUEST_FILE, RESULT_FILE)
        )
        executed = await environment.exec(command, env=secret_env(request.policy) or None)
        fetched = ticket.staging / "result.json"
        try:
            await environment.download_file(RESULT_FILE, fetched)
            result = result_from_json(json.loads(fetched.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            output = (executed.stderr or executed.stdout or "").strip() or "no output"
            raise WorkflowRunnerError(
                clip(
                    f"the workflow runner in the trial wrote no result (exit status {executed.return_code}; {exc}): "
                    f"...{output[-4000:]}",
                    request.policy.secrets(),
                    1500,
                )
            ) from None
        ticket.workflow_result = result
        ticket.workflow_done.set()
        context.metadata = {
            "osmosis": {
                "rollout_id": request.rollout_id,
                "status": result.status.value,
                "error": None if result.error is None else str(result.error),
                "messages": len(result.sample.messages) if result.sample is not None else None,
                "result_file": RESULT_FILE,
            }
        }
        if not result.ok:
            raise WorkflowFailed(str(result.error))
