"""Harbor task folders: the default template-mode task, and how dataset-mode rows name their tasks.

**Template mode** uses one task folder for every rollout (``task_dir``, default
:data:`DEFAULT_TASK_DIR`): the row's prompt is appended to its ``instruction.md`` and its
``tests/test.sh`` hands over to the rollout's grader.

**Dataset mode** runs existing Harbor tasks, written the way Harbor's own are::

    tasks/                         # dataset_dir: a local dataset, one folder per task
      create-file/
        task.toml                  # [agent] timeout_sec, [verifier] ..., [environment] workdir = "/app"
        instruction.md             # what the agent must do; the workflow gets it as the user message
        environment/               # files copied into the workdir (a Dockerfile is not built here)
        tests/test.sh              # writes /logs/verifier/reward.txt (or reward.json)

A row names its task under ``task_key`` (default ``"task"``): a folder name in ``dataset_dir``,
or a path. The core's dataset format needs a ``user_prompt``; :func:`dataset_rows` writes rows that
carry the task's instruction there (so the same file also runs locally)::

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "hello").mkdir(); _ = (root / "hello" / "task.toml").write_text('schema_version = "1.4"')
    >>> _ = (root / "hello" / "instruction.md").write_text("Create /app/hello.txt")
    >>> dataset_rows(root)
    [{'task': 'hello', 'user_prompt': 'Create /app/hello.txt'}]
"""

from __future__ import annotations

import functools
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_TASK_DIR",
    "TaskProblem",
    "dataset_rows",
    "find_dataset_task",
    "is_task_dir",
    "task_has_no_network",
    "task_name",
    "write_dataset",
]

DEFAULT_TASK_DIR = Path(__file__).resolve().parent / "default_task"
"""The plugin's generic template-mode task (workdir ``/app``, public network, grader as verifier)."""


class TaskProblem(ValueError):
    """A row names no task, or a task folder that is not a Harbor task (a ``validation_error``)."""


def is_task_dir(path: Path) -> bool:
    """True when ``path`` holds a ``task.toml`` (Harbor checks the rest when the trial starts)."""
    return (path / "task.toml").is_file()


@functools.cache
def _task_value(task_dir: Path, table: str, key: str) -> str | None:
    """A string ``[table] key`` of the task's ``task.toml`` (None when absent or unreadable)."""
    try:
        data = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    value = data.get(table, {}).get(key) if isinstance(data.get(table), dict) else None
    return value if isinstance(value, str) and value else None


def task_name(task_dir: Path) -> str:
    """The task's name (``[task] name`` of its ``task.toml``), else its folder's name."""
    return _task_value(task_dir, "task", "name") or task_dir.name


def task_has_no_network(task_dir: Path) -> bool:
    """Whether the task's trials run with ``[environment] network_mode = "no-network"``."""
    return _task_value(task_dir, "environment", "network_mode") == "no-network"


def find_dataset_task(metadata: Mapping[str, Any], task_key: str, dataset_dir: Path | None) -> Path:
    """The task folder a dataset-mode row names.

    :raises TaskProblem: the row has no ``task_key``, or it names no task folder.
    """
    name = metadata.get(task_key)
    if not isinstance(name, str) or not name.strip():
        raise TaskProblem(
            f"dataset mode: the row has no {task_key!r} naming its Harbor task "
            f'(add "{task_key}": "<task folder>" to the row, or set [backend.harbor] task_key)'
        )
    candidates = []
    path = Path(name).expanduser()
    if path.is_absolute():
        candidates.append(path)
    else:
        if dataset_dir is not None:
            candidates.append(dataset_dir / path)
        candidates.append(Path.cwd() / path)
    for candidate in candidates:
        if is_task_dir(candidate):
            return candidate.resolve()
    where = ", ".join(str(c) for c in candidates)
    raise TaskProblem(f"dataset mode: the row's task {name!r} is not a Harbor task folder (no task.toml in {where})")


def dataset_rows(dataset_dir: Path | str, *, task_key: str = "task") -> list[dict[str, Any]]:
    """One dataset row per task folder in ``dataset_dir``: ``{task_key: name, "user_prompt": instruction}``."""
    root = Path(dataset_dir)
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and is_task_dir(p)):
        instruction = folder / "instruction.md"
        text = instruction.read_text(encoding="utf-8").strip() if instruction.is_file() else folder.name
        rows.append({task_key: folder.name, "user_prompt": text})
    return rows


def write_dataset(dataset_dir: Path | str, output: Path | str, *, task_key: str = "task") -> Path:
    """Write :func:`dataset_rows` as a JSONL dataset for ``osmosis run``; returns ``output``."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    rows = dataset_rows(dataset_dir, task_key=task_key)
    output.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return output
