"""Lazy public names for a package: each name is written once, in the package's ``.pyi`` stub.

The stub next to the package's ``__init__.py`` lists the public names as ``from MODULE import NAME
as NAME`` lines: type checkers and IDEs read it, and :func:`attach_stub` reads the same lines to
import each name's module on first use, and derives ``__all__`` from them. So ``import osmosis_core``
(and the ``osmosis`` CLI, and a plugin's entry module) stays light, and a name cannot be exported
in one place and forgotten in another. It is SPEC 1 of the Scientific Python project
(``lazy_loader.attach_stub``), which accepts only relative imports; this one takes absolute ones
too, so a package can re-export names that live outside it (``osmosis_core.plugin``)::

    # my_plugin/__init__.py
    from osmosis_core.lazy import attach_stub

    __version__ = "0.1.0"
    __getattr__, __dir__, __all__ = attach_stub(__name__, __file__)

    # my_plugin/__init__.pyi
    from my_plugin.agent import MyAgent as MyAgent
    from my_plugin.config import MyConfig as MyConfig

    __version__: str
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["attach_stub", "stub_exports"]


def lazy_exports(
    package: str, exports: dict[str, str], public: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Deprecated since 0.2.0: write the names once in a ``.pyi`` stub and use :func:`attach_stub`.

    The module-level ``__getattr__`` and ``__dir__`` of ``package`` for ``exports`` (public name
    -> the module that defines it), as 0.1 documented it.
    """
    from osmosis_core.deprecation import warn_deprecated

    warn_deprecated("osmosis_core.lazy.lazy_exports", "osmosis_core.lazy.attach_stub", "0.2.0")

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(public)

    return __getattr__, __dir__


def stub_exports(stub: Path | str, package: str) -> dict[str, str]:
    """Public name -> the module that defines it, from the ``from M import N as N`` lines of ``stub``.

    Relative imports resolve against ``package``.
    :raises ValueError: a line the loader cannot follow (``import *``, a renamed import).
    """
    tree = ast.parse(Path(stub).read_text(encoding="utf-8"), filename=str(stub))
    exports: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = f"{base}.{module}" if module else base
        for alias in node.names:
            if alias.name == "*" or (alias.asname is not None and alias.asname != alias.name):
                raise ValueError(f"{stub}:{node.lineno}: write public names as `from {module} import NAME as NAME`")
            exports[alias.name] = module
    return exports


def attach_stub(package: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The module-level ``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` from its ``.pyi`` stub.

    :param package: the package's ``__name__``.
    :param init_file: its ``__file__`` (the stub is the same path with ``.pyi``).
    """
    exports = stub_exports(Path(init_file).with_suffix(".pyi"), package)
    public = sorted(exports)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # cached: the next access is a plain attribute
        return value

    def __dir__() -> list[str]:
        module = vars(sys.modules[package])
        return sorted({*public, *(name for name in module if name == "__version__" or not name.startswith("_"))})

    return __getattr__, __dir__, public
