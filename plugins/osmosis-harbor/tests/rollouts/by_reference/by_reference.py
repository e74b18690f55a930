"""A rollout whose workflow config holds module-level objects that cannot be pickled (like a
Strands ``@tool`` in a config): they reach the trial by reference, as the same objects."""

from __future__ import annotations

import threading
from typing import Any

import attrs

from osmosis_core import AgentWorkflow, AgentWorkflowConfig, AgentWorkflowContext, RolloutSample

LOCK = threading.Lock()  # pickle refuses it


@attrs.define(kw_only=True)
class LockConfig(AgentWorkflowConfig):
    lock: Any = LOCK
    tools: list[Any] = attrs.field(factory=lambda: [LOCK])


class LockWorkflow(AgentWorkflow[LockConfig]):
    config_type = LockConfig

    async def run(self, ctx: AgentWorkflowContext[LockConfig]) -> RolloutSample:
        same = ctx.config.lock is LOCK and ctx.config.tools[0] is LOCK
        return RolloutSample(messages=[*ctx.prompt, {"role": "assistant", "content": f"same objects: {same}"}])
