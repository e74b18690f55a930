"""Did-you-mean hints for a mistyped name (a config key, a backend, a template, a grader).

A name one or two letters off a known one (``concurency``, ``loacl``) is nearly always that one:
the message that refuses it names it, as git and click do for a mistyped command or option.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The known name ``word`` is most likely a typo of, or None when none is close.

    >>> closest("concurency", ["concurrency", "workers", "n_samples"])
    'concurrency'
    >>> closest("banana", ["concurrency", "workers"]) is None
    True
    """
    names = {str(c).lower(): str(c) for c in choices}
    found = difflib.get_close_matches(word.lower(), list(names), n=1, cutoff=0.75)
    return names[found[0]] if found else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the name ``word`` is most likely a typo of, else ``""``.

    >>> did_you_mean("loacl", ["local", "harbor", "ray"])
    " (did you mean 'local'?)"
    """
    match = closest(word, choices)
    return f" (did you mean {match!r}?)" if match is not None and match != word else ""
