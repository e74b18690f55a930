"""Deprecated since 0.2.0: 0.1's lazy-export helpers, kept working (with a warning) for one release.

A package now loads its public names with ``lazy_loader.attach`` and imports the same names under
``if TYPE_CHECKING:``, so type checkers and "go to definition" land in the real code (no ``.pyi``
stub); :mod:`osmosis_core.testing.exports` shows it, and its ``check_lazy_exports`` checks the two
lists agree.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from osmosis_core._reexport import getattr_from
from osmosis_core.deprecation import warn_deprecated

__all__: list[str] = []

_INSTEAD = "lazy_loader.attach(__name__, submod_attrs=...) with the names imported under TYPE_CHECKING"


def lazy_exports(
    package: str, exports: dict[str, str], public: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Deprecated since 0.2.0: use ``lazy_loader.attach``.

    The module-level ``__getattr__`` and ``__dir__`` of ``package`` for ``exports`` (public name
    -> the module that defines it), as 0.1 documented it.
    """
    warn_deprecated("osmosis_core.lazy.lazy_exports", _INSTEAD, "0.2.0")
    return getattr_from(package, exports), lambda: sorted(public)


def _stub_exports(stub: Path, package: str) -> dict[str, str]:
    tree = ast.parse(stub.read_text(encoding="utf-8"), filename=str(stub))
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


def stub_exports(stub: Path | str, package: str) -> dict[str, str]:
    """Deprecated since 0.2.0: public name -> the module that defines it, from the
    ``from M import N as N`` lines of a ``.pyi`` stub (relative imports resolve against ``package``).

    :raises ValueError: a line the loader cannot follow (``import *``, a renamed import).
    """
    warn_deprecated("osmosis_core.lazy.stub_exports", _INSTEAD, "0.2.0")
    return _stub_exports(Path(stub), package)


def attach_stub(package: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """Deprecated since 0.2.0: use ``lazy_loader.attach`` (see this module's docstring).

    The module-level ``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` from the
    ``from M import N as N`` lines of its ``.pyi`` stub, as 0.1 documented it.

    :param package: the package's ``__name__``.
    :param init_file: its ``__file__`` (the stub is the same path with ``.pyi``).
    """
    warn_deprecated("osmosis_core.plugin.attach_stub / osmosis_core.lazy.attach_stub", _INSTEAD, "0.2.0")
    exports = _stub_exports(Path(init_file).with_suffix(".pyi"), package)
    public = sorted(exports)

    def __dir__() -> list[str]:
        module = vars(sys.modules[package])
        return sorted({*public, *(name for name in module if name == "__version__" or not name.startswith("_"))})

    return getattr_from(package, exports), __dir__, public
