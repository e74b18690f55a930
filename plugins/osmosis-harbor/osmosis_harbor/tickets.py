"""What the backend hands to the agent and verifier classes Harbor builds for one trial.

Harbor creates the agent and the verifier from import paths and saves their keyword arguments
in the trial's ``config.json``. Only a ticket id travels that way; the request itself (with
the API key and the label) stays in this process, in :data:`TICKETS`, for the trial's lifetime.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import attrs

from osmosis_core import ExecutionRequest, ExecutionResult, Message

__all__ = ["TICKETS", "ClassRef", "Ticket", "get_ticket"]


@attrs.frozen
class ClassRef:
    """Where the runner inside the trial imports a class from."""

    module: str
    qualname: str
    file: str | None

    @classmethod
    def of(cls, klass: type[Any], *, map_path: Any = None) -> ClassRef:
        """The reference of ``klass``; ``map_path`` turns a host file path into the trial's."""
        import sys

        module = sys.modules.get(klass.__module__)
        file = getattr(module, "__file__", None)
        if file is not None and map_path is not None:
            file = map_path(file)
        return cls(klass.__module__, klass.__qualname__, file)

    def to_json(self) -> dict[str, Any]:
        """The JSON form the runner reads."""
        return {"module": self.module, "qualname": self.qualname, "file": self.file}


@attrs.define(eq=False)
class Ticket:
    """One rollout's trial: its request, how to run it, and (once known) its workflow result."""

    request: ExecutionRequest
    mode: str
    task_name: str
    trial_dir: Path
    workflow: ClassRef
    workflow_config: str | None
    grader: ClassRef | None
    grader_config: str | None
    python: str
    lib_paths: list[str]
    code_dir: str | None
    upload: dict[str, str] = attrs.field(factory=dict)
    """Host folders to upload into the trial first (trial path -> host path); empty for bwrap."""
    id: str = attrs.field(factory=lambda: secrets.token_hex(8))
    nonce: str = attrs.field(factory=lambda: secrets.token_hex(16))
    """A secret the grader result must echo, so a file the agent planted is never taken for it."""
    grader_class: type[Any] | None = None
    """The grader itself, for grading in this process (``grade_on_host``)."""
    grader_config_object: Any = None
    no_network: bool = False
    """The task runs with ``network_mode = "no-network"`` (the network and the host are out of reach)."""
    policy_relay: tuple[str, int] | None = None
    """The loopback address of the rollout's policy gateway, relayed into the no-network trial (None: it
    has no path to its policy); ``request.policy`` is then the rollout's endpoint on that gateway."""
    workflow_result: ExecutionResult | None = None
    grader_result: ExecutionResult | None = None
    workflow_done: asyncio.Event = attrs.field(factory=asyncio.Event)
    agent_started: float | None = None
    trial_started: float | None = None

    def workflow_prompt(self, instruction: str) -> list[Message]:
        """The prompt the workflow gets: the row's (template mode) or the task's instruction (dataset mode)."""
        if self.mode == "template":
            return list(self.request.prompt)
        system = [m for m in self.request.prompt if m.get("role") == "system"]
        return [*system, {"role": "user", "content": instruction.strip()}]

    @property
    def staging(self) -> Path:
        """A host folder in the trial for the files the host uploads."""
        path = self.trial_dir / "osmosis"
        path.mkdir(parents=True, exist_ok=True)
        return path


TICKETS: dict[str, Ticket] = {}
"""Live tickets by id (registered by the backend for the duration of a trial)."""


def get_ticket(ticket_id: str) -> Ticket:
    """The live ticket. :raises LookupError: when no backend in this process registered it."""
    try:
        return TICKETS[ticket_id]
    except KeyError:
        raise LookupError(
            f"no osmosis rollout {ticket_id!r} in this process: the osmosis-harbor agent and verifier run only "
            "in trials started by the harbor backend (osmosis run --backend harbor)"
        ) from None
