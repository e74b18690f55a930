"""Finding and importing a rollout: its entrypoint module, its workflow and grader, their configs.

The entrypoint module is imported once, with the rollout folder on ``sys.path`` so the rollout's
own modules import as they would in its own project. Which classes run:

* ``rollout.workflow`` / ``rollout.grader`` when set: a class name in the entrypoint, an import
  path ``pkg.mod:Class``, or (graders) a name a plugin registered; ``grader = "none"`` for none;
* otherwise the one :class:`AgentWorkflow` subclass (and at most one :class:`Grader` subclass)
  the entrypoint defines.

The configs are module-level ``workflow_config`` / ``grader_config`` objects when the entrypoint
defines them, else ``config_type()``; the run config's ``[rollout.workflow_config]`` and
``[rollout.grader_config]`` tables then set fields by name.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import re
import sys
import tomllib
import traceback
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import attrs

from osmosis_core._engine.config import RunConfig, structure_table
from osmosis_core.backend import resolve_object
from osmosis_core.errors import ConfigError, PluginError, RolloutLoadError
from osmosis_core.workflow import AgentWorkflow, AgentWorkflowConfig, Grader, GraderConfig

if TYPE_CHECKING:
    from osmosis_core._engine.registry import PluginRegistry

__all__ = [
    "LoadedRollout",
    "MissingDependency",
    "apply_config_table",
    "load_rollout",
]


@attrs.frozen
class LoadedRollout:
    """The classes and configs a run executes."""

    workflow_class: type[AgentWorkflow[Any]]
    workflow_config: AgentWorkflowConfig
    grader_class: type[Grader[Any]] | None
    grader_config: GraderConfig | None
    rollout_dir: Path | None
    entrypoint: Path | None


class MissingDependency(RolloutLoadError):
    """The entrypoint imports a package this environment lacks (declared by the rollout or not)."""

    def __init__(self, message: str, *, module: str, declared: bool) -> None:
        self.module = module
        self.declared = declared
        super().__init__(message)


def _declared_dependencies(rollout_dir: Path) -> set[str]:
    pyproject = rollout_dir / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return set()
    deps = data.get("project", {}).get("dependencies", [])
    if not isinstance(deps, list):
        return set()
    matches = (re.match(r"\s*([A-Za-z0-9_.\-]+)", str(dep)) for dep in deps)
    return {m.group(1).lower().replace("-", "_").replace(".", "_") for m in matches if m}


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _import_entrypoint(file: Path, rollout_dir: Path) -> ModuleType:
    folder = str(rollout_dir)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = file.stem
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise RolloutLoadError(f"{file}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(name)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
        if not isinstance(exc, ModuleNotFoundError):
            raise RolloutLoadError(f"{_where(exc, file)}: import failed: {type(exc).__name__}: {exc}") from exc
        missing = (exc.name or "").split(".")[0]
        declared_names = _declared_dependencies(rollout_dir)
        # declared directly, or (most likely) through a declared distribution that is not installed,
        # e.g. `strands` through osmosis-strands
        declared = missing.lower() in declared_names or any(not _installed(n) for n in declared_names)
        pyproject = rollout_dir / "pyproject.toml"
        if missing.lower() in declared_names:
            hint = f"the rollout declares it in {pyproject}; install it with pip install -e {rollout_dir}"
        elif declared:
            hint = f"the rollout's dependencies in {pyproject} are not all installed: pip install -e {rollout_dir}"
        else:
            hint = f"install it, and declare it in {pyproject}"
        raise MissingDependency(
            f"{file}: needs the package {missing!r}, which is not installed here ({hint})",
            module=missing,
            declared=declared,
        ) from None
    return module


def _where(exc: BaseException, file: Path) -> str:
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f"{exc.filename or file}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if Path(f.filename).resolve().is_relative_to(file.parent.resolve())]
    chosen = inside or list(frames)
    return f"{chosen[-1].filename}:{chosen[-1].lineno}" if chosen else str(file)


def _concrete_subclasses(module: ModuleType, base: type[Any]) -> list[type[Any]]:
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, base) and obj is not base and not inspect.isabstract(obj)
    ]
    own = [c for c in found if c.__module__ == module.__name__]
    return own or found


def _resolve_class(spec: str, module: ModuleType | None, base: type[Any], key: str, source: str) -> type[Any]:
    try:
        return resolve_object(spec, base, module=module, what=key)  # type: ignore[no-any-return]
    except RolloutLoadError as exc:
        raise RolloutLoadError(f"{exc} @ $.rollout.{key} ({source})") from None


def apply_config_table(base: Any, table: dict[str, Any], path: str, source: str) -> Any:
    """``base`` (an attrs config) with the fields ``table`` names set, each read into its field's type.

    What ``[rollout.workflow_config]`` does; backends use it for their own config tables.
    :raises ConfigError: an unknown field or a mistyped value, with its key path.
    """
    if not table:
        return base
    cls = type(base)
    if not attrs.has(cls):
        raise ConfigError(source, [f"{cls.__name__} is not an attrs class, so it takes no settings @ {path}"])
    attrs.resolve_types(cls)
    fields = attrs.fields_dict(cls)
    problems = [f"unknown key {k!r} ({cls.__name__} has no such field) @ {path}" for k in table if k not in fields]
    if problems:
        raise ConfigError(source, problems)
    changes = {}
    for key, value in table.items():
        field = fields[key]
        changes[field.alias or key] = structure_table(value, field.type or Any, f"{path}.{key}", source)
    try:
        return attrs.evolve(base, **changes)
    except (ValueError, TypeError) as exc:
        message = str(exc)  # a nested config's own message may name its path already
        raise ConfigError(source, [message if " @ $" in message else f"{message} @ {path}"]) from None


def load_rollout(config: RunConfig, registry: PluginRegistry | None = None) -> LoadedRollout:
    """Import the rollout a config names and pick its workflow, grader and configs.

    :raises RolloutLoadError: with the file and line, or the config key path, of the problem.
    """
    source = str(config.source or "<config>")
    section = config.rollout
    rollout_dir = config.resolve(section.path)
    module: ModuleType | None = None
    entry: Path | None = None
    if rollout_dir is not None:
        if not rollout_dir.is_dir():
            raise RolloutLoadError(f"the rollout folder {rollout_dir} does not exist @ $.rollout.path ({source})")
        entry = rollout_dir / (section.entrypoint or "main.py")
        if not entry.is_file():
            raise RolloutLoadError(f"the entrypoint {entry} does not exist @ $.rollout.entrypoint ({source})")
        module = _import_entrypoint(entry, rollout_dir)

    if section.workflow:
        workflow = _resolve_class(section.workflow, module, AgentWorkflow, "workflow", source)
    else:
        assert module is not None  # check_config demands path or workflow
        candidates = _concrete_subclasses(module, AgentWorkflow)
        if len(candidates) != 1:
            names = ", ".join(c.__name__ for c in candidates) or "none"
            raise RolloutLoadError(
                f"{entry} must define exactly one AgentWorkflow subclass (found: {names}); "
                f"name one with rollout.workflow @ $.rollout.workflow ({source})"
            )
        workflow = candidates[0]

    grader: type[Any] | None = None
    if section.grader and section.grader.lower() != "none":
        try:
            grader = _resolve_class(section.grader, module, Grader, "grader", source)
        except RolloutLoadError:
            if registry is None or ":" in section.grader:
                raise
            try:
                grader = registry.grader(section.grader).resolve()
            except PluginError as exc:
                raise RolloutLoadError(f"{exc} @ $.rollout.grader ({source})") from None
    elif not section.grader and module is not None:
        graders = _concrete_subclasses(module, Grader)
        if len(graders) > 1:
            names = ", ".join(c.__name__ for c in graders)
            raise RolloutLoadError(
                f"{entry} defines more than one Grader ({names}); name one with rollout.grader "
                f"@ $.rollout.grader ({source})"
            )
        grader = graders[0] if graders else None

    wf_base = getattr(module, "workflow_config", None)
    if not isinstance(wf_base, AgentWorkflowConfig):
        wf_base = workflow.config_type()
    workflow_config = apply_config_table(wf_base, section.workflow_config, "$.rollout.workflow_config", source)
    grader_config = None
    if grader is not None:
        gr_base = getattr(module, "grader_config", None)
        if not isinstance(gr_base, GraderConfig):
            gr_base = grader.config_type()
        grader_config = apply_config_table(gr_base, section.grader_config, "$.rollout.grader_config", source)
    elif section.grader_config:
        raise ConfigError(source, ["there is no grader to take these settings @ $.rollout.grader_config"])
    return LoadedRollout(workflow, workflow_config, grader, grader_config, rollout_dir, entry)
