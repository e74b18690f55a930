"""The CAS worker: a child process that runs math-verify, one job at a time (``python -m osmosis_graders.cas_worker``).

Protocol, one JSON object per line: the worker writes ``{"ready": true}`` once math-verify is
imported and warmed (or ``{"fatal": "..."}`` and exits); then for every job line it reads
(``{"gold": ..., "answer": ..., "limit": seconds, "float_rounding": 6, "numeric_precision": 15,
"strict": true, "allow_set_relation_comp": false}``) it writes one result line
(``{"outcome": "equal" | "different" | "unparsed" | "timeout" | "error", "detail": ...}``).
It exits at end-of-file on its standard input, and (Linux) when its parent dies.

Its own time limit is a soft one: ``SIGALRM`` (this is the process's main thread, where
math-verify's signal-based timeouts also work) interrupts pure-Python work at ``limit`` seconds
and the worker answers ``timeout`` and lives on. Work the signal cannot interrupt (a C-level
``9^{9^{9^{9}}}``) is ended by the parent, which kills the process at ``limit`` plus a grace.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import Any, BinaryIO, Final

__all__ = ["main"]

_MEMORY_HEADROOM: Final = 2 << 30
"""Address space a job may add to the warmed worker's (2 GiB): a hostile expression's
bignum fails with MemoryError instead of swapping the machine."""


class _SoftTimeout(BaseException):
    """Raised by the alarm; a BaseException so math-verify's ``except Exception`` does not swallow it."""


def _alarm(signum: int, frame: object) -> None:
    raise _SoftTimeout


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the parent process dies (best effort elsewhere: stdin EOF)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(0)


def _limit_memory() -> None:
    try:
        import resource

        with open(f"/proc/{os.getpid()}/statm") as statm:
            pages = int(statm.read().split()[0])
        size = pages * os.sysconf("SC_PAGE_SIZE") + _MEMORY_HEADROOM
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or hard > size:
            resource.setrlimit(resource.RLIMIT_AS, (size, hard))
    except (OSError, ValueError, ImportError):
        pass  # not Linux, or not allowed: the parent's time limit still holds


def _write(out: BinaryIO, doc: dict[str, Any]) -> None:
    out.write(json.dumps(doc).encode() + b"\n")
    out.flush()


def _job(job: dict[str, Any]) -> dict[str, Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    targets = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def read(text: str) -> list[Any]:
        # the graders hand over an extracted answer: read it as a boxed one, else as it stands
        found: list[Any] = parse("\\boxed{" + text + "}", targets, parsing_timeout=None)
        return found or list(parse(text, targets, parsing_timeout=None))

    signal.setitimer(signal.ITIMER_REAL, float(job["limit"]))
    try:
        gold = read(str(job["gold"]))
        answer = read(str(job["answer"]))
        if not gold or not answer:
            side = "label" if not gold else "answer"
            return {"outcome": "unparsed", "detail": f"math-verify could not read the {side}"}
        equal = verify(
            gold,
            answer,
            float_rounding=int(job.get("float_rounding", 6)),
            numeric_precision=int(job.get("numeric_precision", 15)),
            strict=bool(job.get("strict", True)),
            allow_set_relation_comp=bool(job.get("allow_set_relation_comp", False)),
            timeout_seconds=None,
        )
        return {"outcome": "equal" if equal else "different", "detail": None}
    except _SoftTimeout:
        return {"outcome": "timeout", "detail": f"over {job['limit']} s"}
    except MemoryError:
        return {"outcome": "error", "detail": "MemoryError"}
    except Exception as exc:
        return {"outcome": "error", "detail": f"{type(exc).__name__}: {str(exc)[:200]}"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def main() -> int:
    """Serve jobs from stdin until end-of-file."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but protocol lines on the real stdout
    try:
        import math_verify  # noqa: F401 - the slow import, done before "ready"
    except Exception as exc:
        _write(out, {"fatal": f"math-verify cannot be imported: {type(exc).__name__}: {exc}"})
        return 1
    logging.disable(logging.CRITICAL)  # math-verify warns on every timeout and parse failure
    signal.signal(signal.SIGALRM, _alarm)
    _job({"gold": "\\frac{1}{2}", "answer": "0.5", "limit": 30})  # warm the parser's lazy imports
    _limit_memory()
    _write(out, {"ready": True, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        try:
            job = json.loads(line)
        except ValueError as exc:
            _write(out, {"outcome": "error", "detail": f"bad job line: {exc}"})
            continue
        _write(out, _job(job))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
