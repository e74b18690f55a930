"""Tasks waiting for room (a free slot, a worker or actor that changed state), woken one or all at once.

Used by the worker pool and by osmosis-ray's dispatcher. A wake-up is a hint, not a promise: a
woken task checks its condition again, and waits again if it still does not hold::

    waiters = Waiters()

    async def take_slot():
        while not free_slots:
            await waiters.wait()
        free_slots.pop()

    def give_slot(slot):
        free_slots.append(slot)
        waiters.wake()  # the longest waiting task
"""

from __future__ import annotations

import asyncio
import collections

__all__ = ["Waiters"]


class Waiters:
    """A first-come, first-woken queue of tasks (asyncio)."""

    def __init__(self) -> None:
        self._queue: collections.deque[asyncio.Future[None]] = collections.deque()

    def __len__(self) -> int:
        return len(self._queue)

    async def wait(self, timeout: float | None = None) -> None:
        """Wait until :meth:`wake` picks this task (or ``timeout`` seconds pass)."""
        waiter = asyncio.get_running_loop().create_future()
        self._queue.append(waiter)
        try:
            if timeout is None:
                await waiter
            else:
                await asyncio.wait([waiter], timeout=timeout)
        finally:
            if not waiter.done():
                waiter.cancel()

    def wake(self, *, everyone: bool = False) -> None:
        """Wake the longest waiting task, or every waiting task."""
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                if not everyone:
                    return

    def clear(self) -> None:
        """Forget every waiter (their event loop is gone)."""
        self._queue.clear()
