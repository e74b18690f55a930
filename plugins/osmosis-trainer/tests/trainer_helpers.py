"""What the trainer-side tests share: a traced call made by hand, the prompts the live tests send."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from osmosis_trainer import RolloutResult, RolloutTrace, TraceCall


def call(i, prompt, generated, *, status="ok", version=None):
    """Call ``i``: its prompt ids and generated ids, with logprobs -0.1, -0.2, ... (None: not captured)."""
    return TraceCall(
        call_id=f"c{i}",
        index=i,
        status=status,
        prompt_token_ids=prompt,
        completion_token_ids=generated,
        logprobs=None if generated is None else [-0.1 * (k + 1) for k in range(len(generated))],
        policy_version=version,
    )


PROMPTS = [
    [
        {"role": "system", "content": "Use the multiply tool, then answer on the last line as: #### <number>"},
        {"role": "user", "content": f"val1 = {a}\nval2 = {b}"},
    ]
    for a, b in ((6, 7), (12, 11))
]
"""Two prompts of the multiply-plain rollout (configs/training/multiply-plain.toml): a tool call, then the answer."""
LABELS = ["42", "132"]


def result_of(calls, *, status="success", reward=1.0, incomplete=None, messages=None, finish=None):
    """A rollout result ``r`` with a trace of ``calls`` (None: no trace), marked incomplete with that
    reason, the last call's ``finish_reason``, the final ``messages``; a failure is ``agent_error: boom``."""
    data = {"rollout_id": "r", "status": status, "reward": reward}
    if status == "failure":
        data["error"] = {"category": "agent_error", "message": "boom"}
    if calls is not None:
        trace = RolloutTrace("r", calls=calls)
        if incomplete:
            trace.mark_incomplete(incomplete)
        data["trace"] = trace.to_json()
        if finish is not None:
            data["trace"]["calls"][-1]["finish_reason"] = finish
    if messages is not None:
        data["sample"] = {"messages": messages}
    return RolloutResult.from_json(data)


# what a rollout server answers every POST /rollout with, per case: (status, body)
REFUSALS = {
    "500": (500, {"detail": "internal error on this one row"}),
    "409": (409, {"detail": "rollout_id is already registered (with another body)"}),
    "not an admission": (202, {"nothing": "here"}),
    "413": (413, {"detail": "the body is over 8 MiB"}),
}
"""Per-rollout client errors: each one rollout's failure (masked), never the training step's."""
SETUP_REFUSALS = {
    "401": (401, {"detail": "invalid token"}),
    "422": (422, {"detail": "rollout_id: must be a string @ $.rollout_id"}),
}
"""The setup's refusals: raised to the trainer."""


@contextlib.asynccontextmanager
async def answering(status: int, body: object) -> AsyncIterator[str]:
    """A stand-in rollout server on 127.0.0.1 answering every request ``status`` with ``body``; its URL."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=status)

    server = web.Server(handle)
    runner = web.ServerRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
