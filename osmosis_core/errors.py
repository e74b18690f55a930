"""Exceptions of the SDK, and the one classifier that maps any exception to an error category."""

from __future__ import annotations

import array
import functools
import sys
from collections.abc import Iterable, Iterator
from typing import Any, Final

from osmosis_core.records import ErrorCategory, ErrorInfo

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "DatasetError",
    "InfraError",
    "OsmosisError",
    "PluginError",
    "PolicyError",
    "RolloutLoadError",
    "classify_exception",
    "clip",
    "error_info",
    "holds_secret",
    "redact",
    "redact_data",
]


class OsmosisError(Exception):
    """Base class of the errors the SDK raises on purpose; the CLI shows them as one line."""


class ConfigError(OsmosisError):
    """The run config is invalid. ``problems`` holds one ``message @ $.path`` line per problem."""

    def __init__(self, source: str, problems: Iterable[str]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{source}: invalid config\n{lines}" if self.problems else f"{source}: invalid config")


class DatasetError(OsmosisError):
    """The dataset has bad rows. ``problems`` holds one ``file:line: message`` per bad row."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid dataset\n" + "\n".join(f"  {p}" for p in self.problems))


class PluginError(OsmosisError):
    """A plugin is broken, duplicated, or a requested plugin name is unknown."""


class RolloutLoadError(OsmosisError):
    """The rollout's entrypoint could not be found, imported, or does not define what it must."""


class PolicyError(OsmosisError):
    """The policy model endpoint failed. Categorised as ``policy_error``.

    Raise it (or let the core's chat helper raise it) when the endpoint is unreachable, answers
    4xx/5xx, or breaks a stream. Its message names the endpoint and status, never the key.
    """

    def __init__(self, message: str, *, status: int | None = None, endpoint: str | None = None) -> None:
        self.status = status
        self.endpoint = endpoint
        super().__init__(message)


class InfraError(OsmosisError):
    """The backend's machinery failed (sandbox, process, actor). Categorised as ``infra_error``."""


class BackendUnavailable(InfraError):
    """Raised by ``ExecutionBackend.execute`` when the backend cannot run this rollout at all (its
    workers, actors or cluster are gone for good), *before* the rollout started.

    It is not a result: the rollout was never run, so ``osmosis run`` records nothing for it, stops
    the run (cancelling what is in flight), keeps everything finished, and says how to resume.
    """


_POLICY_MODULES = ("httpx", "httpcore", "httpx2", "httpcore2", "openai", "aiohttp")


def _chain(exc: BaseException, *, context: bool = False) -> Iterator[BaseException]:
    """``exc`` and what it was raised from (``__cause__``; with ``context``, else ``__context__``), each once."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or (cur.__context__ if context else None)


def _is_policy_failure(exc: BaseException) -> bool:
    """True for errors of HTTP clients and model SDKs (their module names tell, no import needed)."""
    return any(
        isinstance(cur, PolicyError) or any(k.__module__.split(".", 1)[0] in _POLICY_MODULES for k in type(cur).__mro__)
        for cur in _chain(exc)
    )


def classify_exception(exc: BaseException) -> ErrorCategory:
    """Map an exception raised by a workflow, a grader or a backend to its category.

    >>> classify_exception(TimeoutError()).value
    'timeout'
    >>> classify_exception(KeyError("x")).value
    'agent_error'
    """
    if isinstance(exc, InfraError):
        return ErrorCategory.INFRA_ERROR
    if _is_policy_failure(exc):
        return ErrorCategory.POLICY_ERROR
    if isinstance(exc, TimeoutError):
        return ErrorCategory.TIMEOUT
    if isinstance(exc, (ValueError, TypeError, AssertionError)):
        return ErrorCategory.VALIDATION_ERROR
    return ErrorCategory.AGENT_ERROR


FRAGMENT: Final = 8
"""The shortest run of a secret's characters that is redacted wherever it appears (a masked key
that shows its first 16 and last 4 characters shows such a run)."""
_BLOCK: Final = 4
_STRIDE: Final = FRAGMENT - _BLOCK + 1
"""Every run of ``FRAGMENT`` characters of a secret holds one of its ``_BLOCK``-character blocks at
offsets 0, 5, 10, ...: finding those (``str.find``, C speed) and extending each hit to the run
around it finds every run exactly."""
_MANY_BLOCKS: Final = 20
"""With more blocks than this (a long key: an OpenAI project key has 33), the pre-check looks the
text's own 4-byte blocks up in a set instead: one pass whatever the secrets' length, about as
costly as 20 ``str.find`` here (bench/results_redaction.py)."""


class _Plan:
    """The secrets of :func:`redact`, prepared once: the short ones (redacted whole), the blocks of
    the long ones, and the set of every 4 bytes of their UTF-8 (as native ``uint32``)."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.short = tuple(s for s in secrets if len(s) < FRAGMENT)
        blocks: dict[str, list[tuple[str, int]]] = {}
        grams: set[int] = set()
        for secret in dict.fromkeys(s for s in secrets if len(s) >= FRAGMENT):
            for offset in range(0, len(secret) - _BLOCK + 1, _STRIDE):
                blocks.setdefault(secret[offset : offset + _BLOCK], []).append((secret, offset))
            raw = secret.encode("utf-8", "surrogatepass")
            grams.update(int.from_bytes(raw[i : i + 4], sys.byteorder) for i in range(len(raw) - 3))
        self.probes = tuple((block, tuple(places)) for block, places in blocks.items())
        self.grams = frozenset(grams)

    def may_hold(self, text: str) -> bool:
        """False when no run of ``FRAGMENT`` characters of a long secret can be in ``text``.

        Few blocks: ``str.find`` of each. Many: such a run is 8 bytes or more of UTF-8, so it holds
        one of the text's 4-byte blocks at offsets 0, 4, 8, ...; those are looked up in ``grams``.
        """
        if not self.probes or len(text) < FRAGMENT:
            return False
        if len(self.probes) <= _MANY_BLOCKS:
            return any(block in text for block, _ in self.probes)
        data = text.encode("utf-8", "surrogatepass")
        words = array.array("I")
        words.frombytes(memoryview(data)[: len(data) & ~3])
        return not self.grams.isdisjoint(words)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """The ``(start, end)`` of every run of ``FRAGMENT`` or more consecutive characters of a secret."""
        spans: list[tuple[int, int]] = []
        size = len(text)
        for block, places in self.probes:
            at = text.find(block)
            while at >= 0:
                for secret, offset in places:
                    lo, left = at, offset
                    while lo and left and text[lo - 1] == secret[left - 1]:
                        lo -= 1
                        left -= 1
                    hi, right = at + _BLOCK, offset + _BLOCK
                    while hi < size and right < len(secret) and text[hi] == secret[right]:
                        hi += 1
                        right += 1
                    if hi - lo >= FRAGMENT:
                        spans.append((lo, hi))
                at = text.find(block, at + 1)
        return spans


@functools.lru_cache(maxsize=512)
def _plan(secrets: tuple[str, ...]) -> _Plan:
    return _Plan(secrets)


def _usable(secrets: Iterable[str | None]) -> tuple[str, ...]:
    return tuple(s for s in secrets if s and len(s) >= 4)  # shorter ones would redact ordinary words


def holds_secret(text: str, secrets: Iterable[str | None]) -> bool:
    """Whether :func:`redact` would change ``text`` (a whole short secret, or a run of
    ``FRAGMENT`` characters of a longer one)."""
    plan = _plan(_usable(secrets))
    if any(s in text for s in plan.short):
        return True
    return plan.may_hold(text) and bool(plan.spans(text))


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret replaced by ``***``.

    A secret of ``FRAGMENT`` (8) characters or more is redacted wherever any run of 8 or more of
    its consecutive characters appears, so the head a provider echoes of a key
    (``sk-proj-abcd1234********wxyz``) goes too; a shorter one (4 to 7 characters) where it
    appears whole. Shorter values are not secrets (they would redact ordinary words).

    >>> redact("Incorrect API key provided: sk-proj-abcd1234********wxyz", ["sk-proj-abcd1234efgh5678wxyz"])
    'Incorrect API key provided: ***********wxyz'
    """
    return _redact(text, _plan(_usable(secrets)))


def _redact(text: str, plan: _Plan) -> str:
    spans = plan.spans(text) if plan.may_hold(text) else None
    if spans:
        parts: list[str] = []
        done = 0
        for lo, hi in sorted(spans):
            if not parts or lo > done:  # (overlapping or touching runs: one ***)
                parts += (text[done:lo], "***")
            done = max(done, hi)
        parts.append(text[done:])
        text = "".join(parts)
    for secret in plan.short:
        if secret in text:
            text = text.replace(secret, "***")
    return text


def redact_data(value: Any, secrets: Iterable[str | None]) -> Any:
    """A copy of JSON-like ``value`` with :func:`redact` applied to every string (dict keys too);
    tuples become lists. Strings that hold no secret are kept as they are."""
    usable = _usable(secrets)
    return _redact_data(value, _plan(usable)) if usable else value


def _redact_data(value: Any, plan: _Plan) -> Any:
    if isinstance(value, str):
        return _redact(value, plan)
    if isinstance(value, dict):
        return {_redact_data(k, plan): _redact_data(v, plan) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_data(v, plan) for v in value]
    return value


def clip(text: str, secrets: Iterable[str | None] = (), limit: int = 300) -> str:
    """``text`` as one line of at most ``limit`` characters, secrets redacted *before* it is cut.

    (Cutting first could leave the head of a key that the cut split, which no redaction finds.)

    >>> clip("auth=Bearer sk-SECRET-KEY rest", ["sk-SECRET-KEY"], limit=18)
    'auth=Bearer *** r…'
    """
    line = " ".join(redact(text, secrets).split())
    return line if len(line) <= limit else line[: max(0, limit - 1)] + "…"


def error_info(
    exc: BaseException, *, secrets: Iterable[str | None] = (), category: ErrorCategory | None = None
) -> ErrorInfo:
    """The category and a one-line, secret-free message for an exception.

    When a framework wrapped a :class:`PolicyError`, the message is the policy error's own (it
    names the endpoint and the status).
    """
    inner = next((e for e in _chain(exc, context=True) if isinstance(e, PolicyError)), None)
    if inner is not None and category is None:
        exc, category = inner, ErrorCategory.POLICY_ERROR
    message = str(exc).strip() or type(exc).__name__
    if not message.startswith(type(exc).__name__) and not isinstance(exc, OsmosisError):
        message = f"{type(exc).__name__}: {message}"
    message = " | ".join(line.strip() for line in message.splitlines() if line.strip())
    where = _raised_at(exc)
    if where:
        message = f"{message} (at {where})"
    return ErrorInfo(category or classify_exception(exc), redact(message, secrets))


def _raised_at(exc: BaseException) -> str | None:
    """``file.py:LINE in func`` of the innermost frame in the author's code (not the SDK, its plugins or libraries)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    for frame in reversed(frames):
        name = frame.filename.replace("\\", "/")
        parts = name.split("/")
        if any(part.startswith("osmosis_") for part in parts[:-1]) or "/lib/python3" in name or name.startswith("<"):
            continue  # the SDK, its plugins (osmosis_*) and installed libraries: not the author's code
        return f"{name.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}"
    return None
