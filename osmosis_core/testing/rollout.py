"""Run one rollout end to end, the way a backend runs it (for tests of rollouts and plugins).

>>> from osmosis_core.testing import ScriptedPolicyServer, run_rollout_sync   # doctest: +SKIP
>>> with ScriptedPolicyServer() as server:                                     # doctest: +SKIP
...     outcome = run_rollout_sync(MultiplyWorkflow, MultiplyGrader, policy=server.url,
...                                user_prompt="val1 = 6\\nval2 = 7", label="42")
...     assert outcome.reward == 1.0, outcome.error
"""

from __future__ import annotations

import secrets
from typing import Any

import anyio
import attrs

from osmosis_core.local import LocalBackend
from osmosis_core.records import (
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    Message,
    PolicyEndpoint,
    RolloutSample,
)
from osmosis_core.workflow import AgentWorkflow, AgentWorkflowConfig, Grader, GraderConfig

__all__ = ["RolloutOutcome", "run_rollout", "run_rollout_sync"]


@attrs.frozen
class RolloutOutcome:
    """Both stages' results of one rollout."""

    workflow: ExecutionResult
    grader: ExecutionResult | None

    @property
    def final(self) -> ExecutionResult:
        """The grader's result when there is one, else the workflow's."""
        return self.grader if self.grader is not None else self.workflow

    @property
    def sample(self) -> RolloutSample | None:
        """The final sample."""
        return self.final.sample

    @property
    def reward(self) -> float | None:
        """The final reward."""
        return self.final.reward

    @property
    def error(self) -> ErrorInfo | None:
        """The final error, if the rollout failed."""
        return self.final.error


def _policy(policy: PolicyEndpoint | str | Any) -> PolicyEndpoint:
    if isinstance(policy, PolicyEndpoint):
        return policy
    if isinstance(policy, str):
        return PolicyEndpoint(policy, "osmosis-stub")
    url = getattr(policy, "url", None)
    if isinstance(url, str):
        return PolicyEndpoint(url, "osmosis-stub")
    raise TypeError(f"policy must be a PolicyEndpoint, a base URL or a ScriptedPolicyServer, got {policy!r}")


async def run_rollout(
    workflow: type[AgentWorkflow[Any]],
    grader: type[Grader[Any]] | None = None,
    *,
    policy: PolicyEndpoint | str | Any,
    prompt: list[Message] | None = None,
    user_prompt: str | None = None,
    system_prompt: str | None = None,
    label: Any = None,
    metadata: dict[str, Any] | None = None,
    workflow_config: AgentWorkflowConfig | None = None,
    grader_config: GraderConfig | None = None,
    agent_timeout_sec: float | None = None,
    grader_timeout_sec: float | None = None,
    rollout_id: str | None = None,
) -> RolloutOutcome:
    """Run one rollout through :class:`LocalBackend` and return both stages' results.

    Give ``prompt`` (chat messages) or ``user_prompt`` (and ``system_prompt``).
    """
    if prompt is None:
        if user_prompt is None:
            raise ValueError("give prompt= (messages) or user_prompt=")
        prompt = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": user_prompt}
        ]
    request = ExecutionRequest(
        rollout_id=rollout_id or f"test-{secrets.token_hex(4)}",
        prompt=prompt,
        policy=_policy(policy),
        label=label,
        metadata=metadata or {},
        agent_timeout_sec=agent_timeout_sec,
        grader_timeout_sec=grader_timeout_sec,
    )
    results: dict[str, ExecutionResult] = {}

    async def on_workflow(result: ExecutionResult) -> None:
        results["workflow"] = result

    async def on_grader(result: ExecutionResult) -> None:
        results["grader"] = result

    backend = LocalBackend(workflow, workflow_config, grader, grader_config)
    await backend.execute(request, on_workflow, on_grader)
    return RolloutOutcome(results["workflow"], results.get("grader"))


def run_rollout_sync(*args: Any, **kwargs: Any) -> RolloutOutcome:
    """:func:`run_rollout` from synchronous code (starts its own event loop)."""

    async def main() -> RolloutOutcome:
        try:
            return await run_rollout(*args, **kwargs)
        finally:
            from osmosis_core.http.client import aclose_http

            await aclose_http()

    return anyio.run(main)
