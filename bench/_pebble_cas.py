"""The CAS pool on pebble's ``ProcessPool.schedule(timeout=...)``: the candidate bench/graders.py measures
side by side with osmosis_graders.cas_pool (issue 17). Not used by the grader; kept so the measurement can be re-run.

Same surface as :class:`osmosis_graders.cas_pool.CasPool` for the bench: ``check``, ``warm_up``, ``pids``,
``shutdown``. Workers are pebble's, started by ``context`` (``fork`` by default: ``spawn`` and
``forkserver`` re-import a plain user script's ``__main__`` in every worker), run
``osmosis_graders.cas_worker``'s job function with its SIGALRM soft limit, and pebble kills a worker
whose job outlives ``limit + GRACE_SEC`` (SIGTERM, then SIGKILL after ``pebble.CONSTS.term_timeout``).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from typing import Any

import attrs
import pebble
from pebble.common import CONSTS

from osmosis_graders.cas_pool import GRACE_SEC, CasResult, default_workers


def _init() -> None:
    from osmosis_graders import cas_worker

    cas_worker._die_with_parent()
    import logging

    import math_verify  # noqa: F401

    logging.disable(logging.CRITICAL)
    signal.signal(signal.SIGALRM, cas_worker._alarm)
    cas_worker._job({"gold": "\\frac{1}{2}", "answer": "0.5", "limit": 30})
    cas_worker._limit_memory()


def _compare(job: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    from osmosis_graders import cas_worker

    return time.monotonic(), cas_worker._job(job)


def _pid() -> int:
    time.sleep(0.05)  # so each of the warm-up jobs lands on a different worker
    return os.getpid()


class PebbleCasPool:
    def __init__(self, context: str = "fork", sleep_unit: float | None = None) -> None:
        self._context = context
        self._pool: pebble.ProcessPool | None = None
        self._size = 0
        if sleep_unit is not None:
            CONSTS.sleep_unit = sleep_unit

    def _get(self, size: int) -> pebble.ProcessPool:
        if self._pool is None or self._size != size:
            if self._pool is not None:
                self._pool.stop()
            self._pool = pebble.ProcessPool(
                max_workers=size, initializer=_init, context=multiprocessing.get_context(self._context)
            )
            self._size = size
        return self._pool

    async def warm_up(self, workers: int | None = None) -> None:
        size = workers or default_workers()
        pool = self._get(size)
        await asyncio.gather(*(asyncio.wrap_future(pool.schedule(_pid)) for _ in range(size)))

    async def check(
        self, gold: str, answer: str, *, limit: float, workers: int | None = None, **options: Any
    ) -> CasResult:
        pool = self._get(workers or default_workers())
        start = time.monotonic()
        future = pool.schedule(
            _compare, args=({"gold": gold, "answer": answer, "limit": limit, **options},), timeout=limit + GRACE_SEC
        )
        try:
            begun, doc = await asyncio.wrap_future(future)
        except TimeoutError:
            return CasResult("timeout", f"killed after {limit + GRACE_SEC:g} s", 0.0, time.monotonic() - start)
        except pebble.ProcessExpired as exc:
            return CasResult("crashed", f"the CAS worker exited (status {exc.exitcode})")
        end = time.monotonic()
        return attrs.evolve(
            CasResult(str(doc["outcome"]), doc.get("detail")), wait_sec=begun - start, compute_sec=end - begun
        )

    def pids(self) -> list[int]:
        if self._pool is None:
            return []
        return list(self._pool._pool_manager.worker_manager.workers)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.stop()
            self._pool.join()
            self._pool = None
