"""Lazy public names for a package ``__init__``: import each name's module on first use.

It keeps ``import osmosis_core`` (and a plugin's package) light, so the CLI starts fast and a
plugin's framework is imported only when one of its names is used::

    # my_plugin/__init__.py
    from osmosis_core.lazy import lazy_exports

    _EXPORTS = {"MyAgent": "my_plugin.agent"}          # name -> module that defines it
    __all__ = ["MyAgent"]
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)

    if TYPE_CHECKING:                                  # what type checkers and IDEs see
        from my_plugin.agent import MyAgent
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` for ``exports``.

    :param package: the package's ``__name__``.
    :param exports: public name -> the module that defines it.
    :param public: the package's ``__all__`` (what ``dir()`` lists).
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # cached: the next access is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted(public)

    return __getattr__, __dir__
