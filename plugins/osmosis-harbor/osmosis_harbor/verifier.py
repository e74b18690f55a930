"""The verifiers of template mode: the rollout's grader as the trial's verifier.

``OsmosisGraderVerifier`` (the default) is Harbor's own verifier with the grader as the task's
test, run inside the trial's sandbox. ``OsmosisHostGraderVerifier`` (``grade_on_host = true``)
grades in this process instead: no second interpreter per rollout (faster, notably for agent
frameworks that take a second to import), but the grader is not sandboxed. Either way the reward
is the trial's ``verifier_result``.

``OsmosisGraderVerifier``: When verification starts (after the agent phase has ended and everything it
started is gone), it uploads the grading request (the row's label, the grader and its config) and
a small script to ``/tests``, then runs Harbor's :class:`~harbor.verifier.verifier.Verifier`
unchanged: it removes stale reward files, uploads the task's ``tests/``, runs ``tests/test.sh``
(which ``exec``\\ s ``/tests/osmosis-grade.sh``) and reads ``/logs/verifier/reward.json``. The
reward is therefore Harbor's verifier result, and the label never exists in the trial before the
agent is done.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from osmosis_harbor._harbor import prepare_harbor_import

prepare_harbor_import()

from harbor.models.verifier.result import VerifierResult  # noqa: E402
from harbor.verifier.base import BaseVerifier  # noqa: E402
from harbor.verifier.verifier import Verifier  # noqa: E402

from osmosis_core.wire import policy_to_json  # noqa: E402
from osmosis_harbor.grading import grade_sample  # noqa: E402
from osmosis_harbor.in_trial import GRADE_REQUEST_FILE, GRADE_SCRIPT_FILE, RESULT_FILE, bootstrap  # noqa: E402
from osmosis_harbor.tickets import get_ticket  # noqa: E402
from osmosis_harbor.wire import secret_env  # noqa: E402

__all__ = [
    "HOST_VERIFIER_IMPORT_PATH",
    "VERIFIER_IMPORT_PATH",
    "GraderFailed",
    "OsmosisGraderVerifier",
    "OsmosisHostGraderVerifier",
    "grade_script",
]

VERIFIER_IMPORT_PATH = "osmosis_harbor.verifier:OsmosisGraderVerifier"
HOST_VERIFIER_IMPORT_PATH = "osmosis_harbor.verifier:OsmosisHostGraderVerifier"


class GraderFailed(Exception):
    """The grader failed (its result, with category and message, is on the ticket)."""


def grade_script(python: str, lib_paths: list[str]) -> str:
    """The script ``tests/test.sh`` runs: the grader runner, with a fresh HOME, from ``/``."""
    command = " ".join(
        shlex.quote(part)
        for part in (
            python,
            "-I",
            "-c",
            bootstrap(lib_paths),
            "grade",
            GRADE_REQUEST_FILE,
            RESULT_FILE,
            "/logs/verifier",
        )
    )
    return (
        "#!/bin/bash\n"
        "# Written by osmosis-harbor for this trial: grade the workflow's sample with the rollout's Grader.\n"
        'HOME="$(mktemp -d)" && export HOME && cd / || exit 1\n'
        f"exec {command}\n"
    )


class OsmosisGraderVerifier(Verifier):
    """Harbor's verifier, fed the osmosis grading request of the trial's ticket."""

    def __init__(self, *, ticket: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ticket = get_ticket(ticket)
        # for graders that call a model: in memory only, never in the trial's config or files
        self.override_env.update(secret_env(self._ticket.request.policy))

    async def verify(self) -> VerifierResult:
        ticket = self._ticket
        request = ticket.request
        assert ticket.grader is not None, "the grader verifier needs a grader"
        staged = ticket.staging / "grade"
        staged.mkdir(parents=True, exist_ok=True)
        payload = {
            "rollout_id": request.rollout_id,
            "prompt": list(request.prompt),
            "metadata": request.metadata,
            "label": request.label,
            "policy": policy_to_json(request.policy),
            "grader": ticket.grader.to_json(),
            "grader_config": ticket.grader_config,
            "code_dir": ticket.code_dir,
            "timeout": request.grader_timeout_sec,
            "nonce": ticket.nonce,
            "policy_socket": getattr(self.environment, "policy_socket", None),
        }
        (staged / GRADE_REQUEST_FILE.rsplit("/", 1)[1]).write_text(json.dumps(payload, default=repr), encoding="utf-8")
        script = staged / GRADE_SCRIPT_FILE.rsplit("/", 1)[1]
        script.write_text(grade_script(ticket.python, ticket.lib_paths), encoding="utf-8")
        script.chmod(0o755)
        await self.environment.upload_dir(staged, "/tests")
        return await super().verify()


class OsmosisHostGraderVerifier(BaseVerifier):
    """A Harbor verifier that runs the rollout's grader in this process (``grade_on_host = true``)."""

    def __init__(self, *, ticket: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ticket = get_ticket(ticket)

    async def verify(self) -> VerifierResult:
        ticket = self._ticket
        workflow = ticket.workflow_result
        if ticket.grader_class is None or workflow is None or not workflow.ok or workflow.sample is None:
            raise GraderFailed("no workflow sample to grade")
        graded = await grade_sample(ticket.grader_class, ticket.grader_config_object, workflow.sample, ticket.request)
        ticket.grader_result = graded
        if not graded.ok or graded.reward is None:
            raise GraderFailed(str(graded.error))
        return VerifierResult(rewards={"reward": graded.reward})
