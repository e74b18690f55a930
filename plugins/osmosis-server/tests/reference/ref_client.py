"""osmosis-ai 0.3.8's own RolloutClient (run by its Python) against a server; prints what it got."""

import asyncio
import json
import sys

from osmosis_ai.rollout.client import RolloutClient


async def main(url: str, token: str) -> None:
    client = RolloutClient(url=url, api_key=token)
    result = await client.run_rollout(
        initial_messages=[{"role": "user", "content": "hi"}],
        chat_completions_url="http://127.0.0.1:9/v1",
        rollout_id="ref-client-1",
        label="42",
        metadata={"answer": 42},
    )
    handle = await client.run_rollout_async(
        initial_messages=[{"role": "user", "content": "hi"}],
        chat_completions_url="http://127.0.0.1:9/v1",
        rollout_id="ref-client-2",
        metadata={"sleep": 30},
    )
    await handle.wait_for_running()
    cancelled = await client.cancel_rollout("ref-client-2")
    second = await handle
    health = await client.health()
    idle = await client.wait_idle(timeout_sec=20, poll_interval_sec=0.1)
    print(
        json.dumps(
            {
                "status": str(result.status),
                "reward": result.sample.reward if result.sample else None,
                "last": result.sample.messages[-1]["content"] if result.sample else None,
                "err_category": result.err_category,
                "cancelled": cancelled.dispositions,
                "second": str(second.status),
                "lifecycle": health["lifecycle"],
                "idle": idle["lifecycle"]["active_rollouts"],
            }
        )
    )
    await client.aclose()


asyncio.run(main(sys.argv[1], sys.argv[2]))
