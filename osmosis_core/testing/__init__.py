"""Test tools for rollout and plugin authors: a scripted OpenAI-compatible policy server that speaks
real HTTP on 127.0.0.1, rule-based scripts for it, and helpers that run one rollout end to end.

The server is a stand-in for a model (these machines have none), never a fake of osmosis itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_core.lazy import lazy_exports

_EXPORTS = {
    "Fault": "osmosis_core.testing.policy_server",
    "LoggedRequest": "osmosis_core.testing.policy_server",
    "Reply": "osmosis_core.testing.policy_server",
    "ScriptedPolicyServer": "osmosis_core.testing.policy_server",
    "ToolCall": "osmosis_core.testing.policy_server",
    "calculator": "osmosis_core.testing.scripts",
    "echo": "osmosis_core.testing.scripts",
    "RolloutOutcome": "osmosis_core.testing.rollout",
    "run_rollout": "osmosis_core.testing.rollout",
    "run_rollout_sync": "osmosis_core.testing.rollout",
    "StubPolicyProcess": "osmosis_core.testing.stub_process",
    "guide_commands": "osmosis_core.testing.guides",
    "run_guide_commands": "osmosis_core.testing.guides",
}

__all__ = [
    "Fault",
    "LoggedRequest",
    "Reply",
    "RolloutOutcome",
    "ScriptedPolicyServer",
    "StubPolicyProcess",
    "ToolCall",
    "calculator",
    "echo",
    "guide_commands",
    "run_guide_commands",
    "run_rollout",
    "run_rollout_sync",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:
    from osmosis_core.testing.guides import guide_commands, run_guide_commands
    from osmosis_core.testing.policy_server import Fault, LoggedRequest, Reply, ScriptedPolicyServer, ToolCall
    from osmosis_core.testing.rollout import RolloutOutcome, run_rollout, run_rollout_sync
    from osmosis_core.testing.scripts import calculator, echo
    from osmosis_core.testing.stub_process import StubPolicyProcess
