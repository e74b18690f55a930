"""Text edits at exact source positions, so everything a migration does not touch stays byte for byte.

``ast`` reports columns as UTF-8 byte offsets; :class:`Source` turns them into string offsets.

>>> src = Source("from a import b\\nx = b\\n")
>>> src.apply([Edit(src.offset(1, 5), src.offset(1, 6), "c"), Edit(src.offset(2, 4), src.offset(2, 5), "b2")])
'from c import b\\nx = b2\\n'
"""

from __future__ import annotations

import ast
import bisect
import itertools

import attrs

__all__ = ["Edit", "Source"]


@attrs.frozen
class Edit:
    """Replace ``text[start:end]`` with ``replacement`` (an insertion when ``start == end``)."""

    start: int
    end: int
    replacement: str


class Source:
    """A source text with line/column to offset conversions."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self._starts = [0]
        for line in self.lines:
            self._starts.append(self._starts[-1] + len(line))

    def offset(self, lineno: int, col_bytes: int) -> int:
        """The string offset of ``(lineno, col)`` as ``ast`` reports them (1-based line, byte column)."""
        if lineno - 1 >= len(self.lines):
            return len(self.text)
        line = self.lines[lineno - 1]
        chars = len(line.encode("utf-8")[:col_bytes].decode("utf-8", errors="ignore"))
        return self._starts[lineno - 1] + chars

    def start(self, node: ast.AST) -> int:
        """Where ``node`` begins."""
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        """Where ``node`` ends."""
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        """The exact text of ``node``."""
        return self.text[self.start(node) : self.end(node)]

    def line_start(self, offset: int) -> int:
        """The offset where the line holding ``offset`` begins."""
        return self._starts[self.line_of(offset) - 1]

    def line_end(self, offset: int) -> int:
        """The offset just after the newline of the line holding ``offset``."""
        return self._starts[min(self.line_of(offset), len(self.lines))]

    def line_of(self, offset: int) -> int:
        """The 1-based line of ``offset``."""
        return min(max(1, bisect.bisect_right(self._starts, offset)), max(1, len(self.lines)))

    def indent_of(self, offset: int) -> str:
        """The leading whitespace of the line holding ``offset``."""
        line = self.text[self.line_start(offset) : self.line_end(offset)]
        return line[: len(line) - len(line.lstrip(" \t"))]

    def alone_on_lines(self, node: ast.AST) -> bool:
        """True when nothing but whitespace (and a comment) shares the lines of ``node``."""
        before = self.text[self.line_start(self.start(node)) : self.start(node)]
        after = self.text[self.end(node) : self.line_end(self.end(node))]
        return not before.strip() and (not after.strip() or after.strip().startswith("#"))

    def apply(self, edits: list[Edit]) -> str:
        """The text with ``edits`` applied; at one position an insertion goes before a replacement.

        :raises ValueError: two edits overlap.
        """
        ordered = sorted(edits, key=lambda e: (e.start, e.end != e.start, e.end))
        for a, b in itertools.pairwise(ordered):
            if b.start < a.end:
                raise ValueError(f"overlapping edits at offsets {a.start}-{a.end} and {b.start}-{b.end}")
        out: list[str] = []
        pos = 0
        for e in ordered:
            out.append(self.text[pos : e.start])
            out.append(e.replacement)
            pos = e.end
        out.append(self.text[pos:])
        return "".join(out)

    def map_offset(self, edits: list[Edit], offset: int) -> int:
        """Where ``offset`` of the old text lands in the edited text (the start of an edit covering it)."""
        shift = 0
        for e in edits:
            if e.end <= offset:
                shift += len(e.replacement) - (e.end - e.start)
            elif e.start < offset < e.end:
                return e.start + shift
        return offset + shift
