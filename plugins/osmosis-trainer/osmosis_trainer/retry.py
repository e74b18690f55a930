"""The one retry loop of the rollout protocol's clients (this package's requests, osmosis-server's
push-mode callback deliveries): stamina's.

An attempt that should be tried again raises :class:`RetryLater` with its wait (the caller's delay
for that attempt, or what a ``Retry-After`` header asked for); any other exception, and
cancellation, pass through at once.

>>> import asyncio
>>> async def twice() -> int:
...     async for attempt in retrying((0.01,)):
...         with attempt:
...             if attempt.num == 1:
...                 raise RetryLater(0.01, "not yet")
...             return attempt.num
...     raise AssertionError
>>> asyncio.run(twice())
2
"""

from __future__ import annotations

from typing import Any

__all__ = ["RetryLater", "delay_of", "retrying"]


class RetryLater(Exception):
    """Try the attempt again after ``wait`` seconds; ``why`` says what went wrong (for the final error)."""

    def __init__(self, wait: float, why: str) -> None:
        super().__init__(why)
        self.wait = wait
        self.why = why


def _wait(exc: BaseException) -> bool | float:
    return exc.wait if isinstance(exc, RetryLater) else False


def delay_of(delays: tuple[float, ...], attempt: int) -> float:
    """The wait after attempt number ``attempt`` (1-based): its entry in ``delays``."""
    return delays[min(attempt, len(delays)) - 1] if delays else 0.0


def retrying(delays: tuple[float, ...]) -> Any:
    """``len(delays) + 1`` attempts, no overall time cap: ``async for attempt in retrying(d): with attempt: ...``.

    After the last attempt its :class:`RetryLater` propagates.
    """
    import stamina  # (with its tenacity: on the first request, not on import)

    return stamina.retry_context(on=_wait, attempts=len(delays) + 1, timeout=None)
