"""Push mode: a rollout's results POSTed to its ``callback_url`` as they complete.

Each delivery runs in its own task, so a slow or failing receiver never holds up another rollout
(or the rollout's own slot). A rollout's deliveries keep their order (the workflow's result, then
the final one). A delivery is retried with exponential backoff on a connection error, a timeout,
408/425/429 (honouring ``Retry-After``) and 5xx; another 4xx means the receiver refuses it, and it
is not sent again. The body is the result document of ``GET /rollout/{id}/result`` plus
``"final"`` (true on the rollout's last delivery) and ``"stage"``; the headers carry
``X-Osmosis-Rollout-Id`` and, when the request gave a ``callback_api_key``,
``Authorization: Bearer <callback_api_key>``. Nothing about the receiver's URL or key is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from osmosis_trainer.retry import RetryLater, delay_of, retrying
from osmosis_trainer.wire import retry_after_seconds

__all__ = ["RETRY_DELAYS_SEC", "Pusher"]

log = logging.getLogger("osmosis_server")

RETRY_DELAYS_SEC: Final = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""The waits between attempts (so nine attempts over about a minute)."""
ATTEMPT_TIMEOUT_SEC: Final = 30.0
_RETRY_STATUSES: Final = frozenset({408, 425, 429})


class Pusher:
    """Delivers result documents to callback URLs, in the background.

    :param delays: the waits between attempts.
    :param timeout: seconds per attempt.
    """

    def __init__(self, *, delays: tuple[float, ...] = RETRY_DELAYS_SEC, timeout: float = ATTEMPT_TIMEOUT_SEC) -> None:
        self.delays = delays
        self.timeout = timeout
        self.delivered = 0
        self.failed = 0
        self._tasks: set[asyncio.Task[bool]] = set()

    @property
    def pending(self) -> int:
        """Deliveries not finished yet."""
        return len(self._tasks)

    def send(
        self,
        rollout_id: str,
        url: str,
        api_key: str | None,
        body: bytes,
        *,
        after: asyncio.Task[bool] | None = None,
        done: Callable[[bool], None] | None = None,
    ) -> asyncio.Task[bool]:
        """Start delivering ``body``; after ``after`` (the rollout's previous delivery) has ended.

        :param done: called with whether the delivery succeeded.
        """
        task = asyncio.get_running_loop().create_task(self._deliver(rollout_id, url, api_key, body, after, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _deliver(
        self,
        rollout_id: str,
        url: str,
        api_key: str | None,
        body: bytes,
        after: asyncio.Task[bool] | None,
        done: Callable[[bool], None] | None,
    ) -> bool:
        ok = False
        try:
            if after is not None and not after.done():
                await asyncio.wait({after})
            ok = await self._attempts(rollout_id, url, api_key, body)
        finally:
            if ok:
                self.delivered += 1
            else:
                self.failed += 1
            if done is not None:
                done(ok)
        return ok

    async def _attempts(self, rollout_id: str, url: str, api_key: str | None, body: bytes) -> bool:
        import aiohttp

        from osmosis_core.http import http_request

        headers = {"Content-Type": "application/json", "X-Osmosis-Rollout-Id": rollout_id}
        if api_key:
            headers["Authorization"] = "Bearer " + api_key
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async for attempt in retrying(self.delays):
                with attempt:
                    wait = delay_of(self.delays, attempt.num)
                    try:
                        async with http_request("POST", url, data=body, headers=headers, timeout=timeout) as response:
                            status = response.status
                            retry_after = response.headers.get("Retry-After")
                            await response.read()
                    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                        _log_retry(rollout_id, attempt.num, type(exc).__name__, wait)
                        raise RetryLater(wait, type(exc).__name__) from exc
                    if 200 <= status < 300:
                        return True
                    if status < 500 and status not in _RETRY_STATUSES:
                        log.warning(
                            "rollout %s: its callback receiver refused the result (HTTP %s); not sent again",
                            rollout_id,
                            status,
                        )
                        return False
                    if retry_after is not None:
                        wait = max(wait, retry_after_seconds(retry_after, wait))
                    _log_retry(rollout_id, attempt.num, f"HTTP {status}", wait)
                    raise RetryLater(wait, f"HTTP {status}")
        except RetryLater as exc:
            last = exc.why
        else:  # pragma: no cover - stamina ends with the last attempt's exception
            last = "no attempt"
        log.warning(
            "rollout %s: callback delivery gave up after %d attempts (last: %s); the result stays readable "
            "by polling until its retention ends",
            rollout_id,
            len(self.delays) + 1,
            last,
        )
        return False

    async def aclose(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for deliveries in progress, then cancel the rest.

        :return: how many were cancelled.
        """
        tasks = set(self._tasks)
        if not tasks:
            return 0
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        return len(pending)


def _log_retry(rollout_id: str, attempt: int, why: str, wait: float) -> None:
    log.debug("rollout %s: callback attempt %d failed (%s); again in %.2fs", rollout_id, attempt, why, wait)
