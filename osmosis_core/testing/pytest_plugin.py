"""The pytest plugin of osmosis (entry point ``pytest11``): fixtures for rollout and plugin tests.

Fixtures:

* ``policy_server``: a :class:`ScriptedPolicyServer` (calculator script) on 127.0.0.1, running
  in a background thread for the test; inject faults with ``policy_server.inject(Fault(...))``.
* ``osmosis_registry``: a fresh :class:`PluginRegistry` with only the core's built-ins, installed
  as the process-wide registry for the test; register your plugin on it with ``.register()``.

Example::

    def test_my_rollout(policy_server):
        outcome = run_rollout_sync(MyWorkflow, MyGrader, policy=policy_server,
                                   user_prompt="val1 = 6\\nval2 = 7", label="42")
        assert outcome.reward == 1.0
        assert len(policy_server.requests_for(outcome.workflow.rollout_id)) == 2
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from osmosis_core._engine.registry import PluginRegistry
    from osmosis_core.testing.policy_server import ScriptedPolicyServer

__all__ = ["osmosis_registry", "policy_server"]


@pytest.fixture
def policy_server() -> Iterator[ScriptedPolicyServer]:
    """A scripted OpenAI-compatible server on 127.0.0.1 (calculator script), for one test."""
    from osmosis_core.testing.policy_server import ScriptedPolicyServer

    with ScriptedPolicyServer() as server:
        yield server


@pytest.fixture
def osmosis_registry() -> Iterator[PluginRegistry]:
    """A registry with only the built-ins, installed process-wide for the test."""
    from osmosis_core._engine.registry import PluginRegistry, reset_registry

    registry = PluginRegistry(load_entrypoints=False)
    reset_registry(registry)
    try:
        yield registry
    finally:
        reset_registry(None)
