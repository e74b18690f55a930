"""What Python 3.10 lacks and the trainer side needs: :class:`StrEnum` (3.11) and a deadline around
an await (``asyncio.timeout`` is 3.11). On 3.11 and later each is the standard library's own.

>>> class Colour(StrEnum):
...     RED = "red"
>>> str(Colour.RED), f"{Colour.RED}", Colour("red") is Colour.RED, Colour.RED == "red"
('red', 'red', True, True)
"""

from __future__ import annotations

import asyncio
import enum
import sys
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["StrEnum", "TimeoutErrors", "wait_for"]

T = TypeVar("T")

if sys.version_info >= (3, 11):
    from enum import StrEnum

    TimeoutErrors: tuple[type[BaseException], ...] = (TimeoutError,)
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        """``enum.StrEnum`` of Python 3.11: members are strings, and ``str()`` / ``format()`` give the value."""

        def __str__(self) -> str:
            return str.__str__(self)

        def __format__(self, format_spec: str) -> str:
            return str.__format__(self, format_spec)

    # asyncio.TimeoutError is TimeoutError itself from 3.11 on; on 3.10 it is a class of its own
    # (what aiohttp raises when a request's time runs out)
    TimeoutErrors = (TimeoutError, asyncio.TimeoutError)


async def wait_for(awaitable: Awaitable[T], timeout: float) -> T:
    """``await awaitable`` for at most ``timeout`` seconds. :raises TimeoutError: (the builtin, on every Python)."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no answer within {timeout}s") from None
