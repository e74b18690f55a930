"""Reading a JSONL dataset into rows; every bad line is reported with its file and line number.

A row is a JSON object with ``user_prompt`` (and optional ``system_prompt``), or a ``messages``
list instead; ``ground_truth`` (alias ``label``) is the label the grader gets; every other key is
kept as metadata for the workflow::

    {"system_prompt": "Answer with #### <n>.", "user_prompt": "val1 = 3\\nval2 = 4", "ground_truth": "12"}
    {"messages": [{"role": "user", "content": "3 * 4"}], "label": 12, "difficulty": "easy"}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from osmosis_core.errors import DatasetError
from osmosis_core.records import Message

__all__ = ["DatasetRow", "fingerprint", "read_dataset", "row_from_json"]


def fingerprint(path: Path) -> str:
    """The SHA-256 of a file, read in blocks (``run.json``'s ``dataset_sha256``)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


MAX_REPORTED = 20
MAX_DEPTH = 64
"""How deeply a row's values may nest (deeper rows are refused: they break JSON writers and copies)."""


def _deeper_than(value: Any, limit: int) -> bool:
    """True when ``value`` (an object or a list) nests more than ``limit`` levels deep (checked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((v, depth + 1) for v in children if isinstance(v, (dict, list)))
    return False


@attrs.frozen
class DatasetRow:
    """One dataset row, ready to become rollouts."""

    index: int
    """0-based position among the dataset's rows (blank lines do not count)."""
    line: int
    """1-based line number in the file."""
    prompt: list[Message]
    label: Any
    metadata: dict[str, Any]


def row_from_json(obj: Any, index: int, line: int) -> DatasetRow:
    """Turn one parsed JSON value into a row. :raises ValueError: with a message naming the problem."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if _deeper_than(obj, MAX_DEPTH):
        raise ValueError(f"the row is nested more than {MAX_DEPTH} levels deep")
    data = dict(obj)
    label = data.pop("ground_truth", None)
    alias = data.pop("label", None)
    if label is None:
        label = alias
    messages = data.pop("messages", None)
    system = data.pop("system_prompt", None)
    user = data.pop("user_prompt", None)
    if messages is not None:
        if user is not None:
            raise ValueError('has both "messages" and "user_prompt"; keep one')
        if not isinstance(messages, list) or not messages:
            raise ValueError('"messages" must be a non-empty list of {"role", "content"} objects')
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ValueError(f'"messages"[{i}] must be an object with a "role"')
    elif user is None:
        raise ValueError('missing "user_prompt" (or a "messages" list)')
    prompt: list[Message] = [] if system is None else [{"role": "system", "content": _text(system, "system_prompt")}]
    if messages is not None:
        prompt += [dict(m) for m in messages]
    else:
        prompt.append({"role": "user", "content": _text(user, "user_prompt")})
    return DatasetRow(index=index, line=line, prompt=prompt, label=label, metadata=data)


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f'"{key}" must be a string, got {type(value).__name__}')
    return value


def read_dataset(path: Path | str, *, limit: int | None = None) -> list[DatasetRow]:
    """Read every row of a ``.jsonl`` file (the first ``limit`` when given).

    Blank lines are skipped. :raises DatasetError: listing each bad line as ``file:line: problem``.
    """
    path = Path(path)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        raise DatasetError([f"{path}: no such file"]) from None
    except OSError as exc:
        raise DatasetError([f"{path}: cannot read: {exc}"]) from None
    rows: list[DatasetRow] = []
    problems: list[str] = []
    with handle:
        for lineno, data in enumerate(handle, start=1):
            if limit is not None and len(rows) >= limit:
                break
            if not data.strip():
                continue
            if len(problems) >= MAX_REPORTED:  # enough to fix first; this line and the rest are unread
                problems.append(f"(stopped after {MAX_REPORTED} problems, at line {lineno})")
                break
            try:
                obj = json.loads(data.decode("utf-8"))
            except UnicodeDecodeError as exc:
                problems.append(
                    f"{path}:{lineno}: not UTF-8 text (byte {data[exc.start]:#04x} at column {exc.start + 1})"
                )
                continue
            except json.JSONDecodeError as exc:
                problems.append(f"{path}:{lineno}: invalid JSON: {exc.msg} (column {exc.colno})")
                continue
            except RecursionError:
                problems.append(f"{path}:{lineno}: the row is nested too deeply to read")
                continue
            try:
                rows.append(row_from_json(obj, len(rows), lineno))
            except ValueError as exc:
                problems.append(f"{path}:{lineno}: {exc}")
    if problems:
        raise DatasetError(problems)
    if not rows and limit != 0:
        raise DatasetError([f"{path}: the dataset has no rows"])
    return rows
