"""Lazy re-exports for a module that hands out names of its *package's* other modules
(``osmosis_core.plugin``, ``osmosis_core.frontend``).

``lazy_loader.attach(package, ...)`` caches each name it resolves on ``package`` itself (0.6), so
``lazy_loader.attach("osmosis_core", ...)`` called from ``osmosis_core.plugin`` would put
``load_rollout`` on ``osmosis_core`` after its first use there: an engine name on the rollout
author's surface, present or not depending on what ran before. :func:`attach` takes the same
table and caches on the re-exporting module instead.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def attach(
    package: str, *, submod_attrs: Mapping[str, Sequence[str]], into: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``lazy_loader.attach``'s ``(__getattr__, __dir__, __all__)`` for module ``into``, whose names
    live in ``package``'s modules (``submod_attrs``: module relative to ``package`` -> names)."""
    home = {name: f"{package}.{sub}" for sub, names in submod_attrs.items() for name in names}
    names = sorted(home)
    return getattr_from(into, home), lambda: list(names), list(names)


def getattr_from(into: str, home: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of module ``into`` for ``home`` (name -> the module that defines it):
    each name imported on first use and cached on ``into``."""

    def __getattr__(name: str) -> Any:
        try:
            module = home[name]
        except KeyError:
            raise AttributeError(f"module {into!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        sys.modules[into].__dict__[name] = value  # later uses skip __getattr__
        return value

    return __getattr__
