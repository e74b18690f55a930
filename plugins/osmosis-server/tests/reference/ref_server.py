"""osmosis-ai 0.3.8's own rollout server (run by its Python): a trivial workflow and grader."""

import sys

import uvicorn
from osmosis_ai.rollout import AgentWorkflow, Grader, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server


class Answer(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": "#### 42"}]


class Exact(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"].endswith(str(ctx.label)) else 0.0)


port, token = int(sys.argv[1]), sys.argv[2]
app = create_rollout_server(backend=LocalBackend(workflow=Answer, grader=Exact), api_key=token)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
