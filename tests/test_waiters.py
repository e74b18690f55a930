from __future__ import annotations

import asyncio

from osmosis_core.plugin import Waiters


def test_wake_picks_the_longest_waiting_task_then_everyone():
    async def main() -> list[str]:
        waiters = Waiters()
        woken: list[str] = []

        async def wait(name: str) -> None:
            await waiters.wait()
            woken.append(name)

        tasks = [asyncio.create_task(wait(name)) for name in "abc"]
        await asyncio.sleep(0)
        assert len(waiters) == 3
        waiters.wake()
        await asyncio.sleep(0)
        assert woken == ["a"]
        waiters.wake(everyone=True)
        await asyncio.gather(*tasks)
        assert len(waiters) == 0
        return woken

    assert asyncio.run(main()) == ["a", "b", "c"]


def test_a_timed_out_or_cancelled_waiter_is_skipped_by_wake():
    async def main() -> None:
        waiters = Waiters()
        await waiters.wait(timeout=0.01)  # nobody woke it: it returns after the timeout
        cancelled = asyncio.create_task(waiters.wait())
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        live = asyncio.create_task(waiters.wait())
        await asyncio.sleep(0)
        waiters.wake()  # passes over the two dead entries to the live one
        await asyncio.wait_for(live, 1.0)

    asyncio.run(main())
