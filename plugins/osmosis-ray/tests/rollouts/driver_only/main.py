"""A rollout that imports a module only the driver has (the tests put its folder on the driver's path)."""

from __future__ import annotations

import osmosis_ray_test_driver_only  # noqa: F401 - present on the driver, absent on every node

from osmosis_core import AgentWorkflow, AgentWorkflowContext


class DriverOnlyWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict]:
        return [*ctx.prompt, {"role": "assistant", "content": "unreachable on a node"}]
