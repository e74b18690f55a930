"""What can be read from a Python module without running it: dotted names, module-level bindings,
constants, and paths built from ``Path(__file__)``.

>>> tree = ast.parse("from pathlib import Path\\nHERE = Path(__file__).resolve().parent\\nN = 4\\n")
>>> facts = ModuleFacts(tree)
>>> facts.constants["N"], facts.static_path(ast.parse('HERE / "task"', mode="eval").body)
(4, PurePosixPath('task'))
"""

from __future__ import annotations

import ast
from pathlib import PurePosixPath
from typing import Any

__all__ = ["ModuleFacts", "dotted", "enclosing_function"]


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The innermost function holding ``node`` (None at module or class level)."""
    current = parents.get(node)
    while current is not None:
        if isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef):
            return current
        current = parents.get(current)
    return None


def _is_file_dir(node: ast.AST) -> bool:
    """``Path(__file__)[.resolve()|.absolute()].parent`` or ``os.path.dirname(os.path.abspath(__file__))``."""
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = node.value
        while (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr in ("resolve", "absolute")
            and not inner.args
        ):
            inner = inner.func.value
        return (
            isinstance(inner, ast.Call)
            and dotted(inner.func) in ("Path", "pathlib.Path")
            and len(inner.args) == 1
            and isinstance(inner.args[0], ast.Name)
            and inner.args[0].id == "__file__"
        )
    if isinstance(node, ast.Call) and dotted(node.func) == "os.path.dirname" and len(node.args) == 1:
        arg = node.args[0]
        if isinstance(arg, ast.Call) and dotted(arg.func) in ("os.path.abspath", "os.path.realpath"):
            arg = arg.args[0] if arg.args else arg
        return isinstance(arg, ast.Name) and arg.id == "__file__"
    return False


class ModuleFacts:
    """The module-level names of a parsed module, its constants and its ``__file__``-relative paths."""

    def __init__(self, tree: ast.Module) -> None:
        self.bound: set[str] = set()
        """Names bound at module level (assignments, imports, functions, classes)."""
        self.constants: dict[str, Any] = {}
        """``NAME = <literal>`` at module level."""
        self._paths: dict[str, ast.AST] = {}
        for stmt in tree.body:
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(stmt, ast.Assign):
                targets, value = stmt.targets, stmt.value
            elif isinstance(stmt, ast.AnnAssign):
                targets, value = [stmt.target], stmt.value
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.bound.add(stmt.name)
            elif isinstance(stmt, ast.Import | ast.ImportFrom):
                for alias in stmt.names:
                    self.bound.add(alias.asname or alias.name.split(".")[0])
            for target in targets:
                if isinstance(target, ast.Name):
                    self.bound.add(target.id)
                    if value is not None:
                        self._paths[target.id] = value
                        try:
                            self.constants[target.id] = ast.literal_eval(value)
                        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                            pass

    def constant(self, node: ast.AST) -> Any:
        """The literal value of ``node`` (directly or through a module-level constant), else raise ValueError."""
        if isinstance(node, ast.Name):
            if node.id in self.constants:
                return self.constants[node.id]
            raise ValueError(node.id)
        return ast.literal_eval(node)

    def static_path(self, node: ast.AST, depth: int = 0) -> PurePosixPath | None:
        """A path relative to the module's folder, when ``node`` builds one from ``__file__``; else None."""
        if depth > 8:
            return None
        if _is_file_dir(node):
            return PurePosixPath(".")
        if isinstance(node, ast.Name) and node.id in self._paths:
            return self.static_path(self._paths[node.id], depth + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            base = self.static_path(node.left, depth + 1)
            if base is not None and isinstance(node.right, ast.Constant) and isinstance(node.right.value, str):
                return PurePosixPath(base, node.right.value)
            return None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "joinpath":
            base = self.static_path(node.func.value, depth + 1)
            parts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if base is not None and len(parts) == len(node.args):
                return PurePosixPath(base, *parts)
        if isinstance(node, ast.Call) and dotted(node.func) == "os.path.join" and node.args:
            base = self.static_path(node.args[0], depth + 1)
            parts = [a.value for a in node.args[1:] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if base is not None and len(parts) == len(node.args) - 1:
                return PurePosixPath(base, *parts)
        return None
