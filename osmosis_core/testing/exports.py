"""Check a lazily loaded package: what type checkers read is what the package hands out.

A package that imports its public names on first use (``lazy_loader.attach``) writes each name
twice: once in the ``submod_attrs`` table, once as an ``import NAME as NAME`` under
``if TYPE_CHECKING:`` (what type checkers and "go to definition" read). The core and every
first-party plugin are written this way::

    # my_plugin/__init__.py
    from typing import TYPE_CHECKING

    import lazy_loader

    __version__ = "0.1.0"

    if TYPE_CHECKING:
        from my_plugin.agent import MyAgent as MyAgent
        from my_plugin.config import MyConfig as MyConfig

    __getattr__, __dir__, __all__ = lazy_loader.attach(
        __name__, submod_attrs={"agent": ["MyAgent"], "config": ["MyConfig"]}
    )

    # tests/test_plugin.py
    from osmosis_core.testing import check_lazy_exports

    def test_public_names():
        check_lazy_exports("my_plugin")
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable
from pathlib import Path

__all__ = ["check_lazy_exports"]


def _lazy_tables(module_name: str) -> tuple[dict[str, str], dict[str, str]]:
    """(name -> module) from the ``if TYPE_CHECKING:`` re-exports (``import NAME as NAME``) of
    ``module_name``'s source, and from its ``lazy_loader.attach(..., submod_attrs=...)`` table."""
    module = importlib.import_module(module_name)
    assert module.__file__, f"{module_name} has no source file"
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"), filename=module.__file__)
    typed: dict[str, str] = {}
    lazy: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                where = f"{module.__file__}:{imp.lineno}: write `from package.module import NAME as NAME`"
                assert isinstance(imp, ast.ImportFrom), where
                assert imp.module, where
                assert not imp.level, where
                for alias in imp.names:
                    if alias.asname == alias.name:  # `import X as X`: a re-export (else for annotations only)
                        typed[alias.name] = imp.module
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func).endswith("attach")
        ):
            first = node.value.args[0]
            package = ast.literal_eval(first) if isinstance(first, ast.Constant) else module_name
            table = ast.literal_eval(next(k.value for k in node.value.keywords if k.arg == "submod_attrs"))
            lazy.update({name: f"{package}.{sub}" for sub, names in table.items() for name in names})
    return typed, lazy


def check_lazy_exports(module_name: str, *, own: Iterable[str] = ()) -> None:
    """Fail (AssertionError) unless ``module_name``'s ``TYPE_CHECKING`` re-exports and its
    ``lazy_loader.attach`` table name the same objects, and ``__all__`` is exactly those names
    plus ``own`` (names the module defines itself), each once, in any order (``osmosis_core.plugin``
    lists its names in the order its docstring teaches them).

    Every name is imported, so this is also "every public name resolves".

    >>> check_lazy_exports("osmosis_core")
    """
    typed, lazy = _lazy_tables(module_name)
    module = importlib.import_module(module_name)
    assert typed, f"{module_name}: no `import NAME as NAME` under `if TYPE_CHECKING:`"
    assert typed == lazy, (
        f"{module_name}: only under TYPE_CHECKING: {sorted(typed.keys() - lazy.keys())}, "
        f"only in lazy_loader.attach: {sorted(lazy.keys() - typed.keys())}, "
        f"in different modules: {sorted(n for n in typed.keys() & lazy.keys() if typed[n] != lazy[n])}"
    )
    assert sorted(module.__all__) == sorted({*typed, *own}), f"{module_name}.__all__ is not the lazy names"
    assert set(module.__all__) <= set(dir(module)), f"dir({module_name}) misses public names"
    for name, home in typed.items():
        value = getattr(module, name)
        assert value is getattr(importlib.import_module(home), name), f"{module_name}.{name} is not {home}.{name}"
