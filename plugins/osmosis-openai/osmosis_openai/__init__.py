"""The OpenAI client the osmosis agent integrations give their frameworks (osmosis-strands,
osmosis-openai-agents): one ``AsyncOpenAI`` per event loop on aiohttp, a view of it per rollout
endpoint, every answer checked to be a chat completion (see :mod:`osmosis_openai.client`)::

    from osmosis_core import AgentWorkflow, AgentWorkflowContext, Message
    from osmosis_openai import policy_error, rollout_openai_client

    class AskOnce(AgentWorkflow):
        async def run(self, ctx: AgentWorkflowContext) -> list[Message]:
            client = rollout_openai_client()  # the active rollout's view (outside one: RuntimeError)
            try:
                reply = await client.chat.completions.create(model=ctx.policy.model, messages=ctx.prompt)
            except Exception as exc:  # an openai/HTTP failure is a PolicyError (policy_error)
                raise (policy_error(exc) or exc) from exc
            return [*ctx.prompt, reply.choices[0].message.model_dump(exclude_none=True)]

Importing this package does not import ``openai``; the first client does.
"""

from osmosis_openai.client import fast_client_class, policy_error, rollout_openai_client

__version__ = "0.2.0"
__all__ = ["fast_client_class", "policy_error", "rollout_openai_client"]
