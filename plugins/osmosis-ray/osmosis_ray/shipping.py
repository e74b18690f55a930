"""How a rollout's code reaches the actors: Ray's runtime environment, then an explicit import.

The driver knows the workflow and grader as classes (``osmosis run`` imported the rollout's
``main.py`` as module ``main``, with the rollout folder on ``sys.path``). An actor gets:

* the rollout folder as Ray's ``working_dir`` (Ray zips it, uploads it once, and unpacks it on each
  node; the actor starts inside it), and the rollout's declared dependencies that a node lacks as
  Ray's ``pip`` (see :func:`declared_requirements`);
* a :class:`RolloutCode`: which modules to import from that folder, by their driver-side name
  and their path in the folder, and the classes and configs themselves, pickled by Ray's
  cloudpickle *by reference* (module name and qualified name). Classes from a module that no
  import can find (a script's ``__main__``, a file loaded by path outside the rollout folder)
  are pickled by value instead.

On the actor, :meth:`RolloutCode.load` imports the listed modules from the working dir, then
unpickles the classes. Any failure there (a package missing on that node, a syntax error) is
a :class:`CodeLoadError` whose message names the module being imported, so the backend can
report it per rollout as ``infra_error`` naming the node and the import.

>>> import pathlib, osmosis_core.testing.contract as contract
>>> code = pack_rollout_code({"workflow": contract.ContractWorkflow}, rollout_dir=None)
>>> code.load()["workflow"].__name__, code.modules
('ContractWorkflow', ())
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

__all__ = [
    "CodeLoadError",
    "RolloutCode",
    "declared_requirements",
    "missing_requirements",
    "pack_rollout_code",
    "upload_local_paths",
]


class CodeLoadError(Exception):
    """The rollout's code could not be imported on an actor; the message names the import."""


@attrs.frozen
class RolloutCode:
    """Everything an actor needs to rebuild the rollout's classes and configs (pickled, small)."""

    payload: bytes
    """cloudpickle of a dict of the objects (classes by reference where importable)."""
    modules: tuple[tuple[str, str], ...] = ()
    """(module name, path relative to the rollout folder) to import from the working dir first."""
    shipped: bool = False
    """The rollout folder arrives as the actor's working dir."""
    origin: str | None = None
    """The rollout folder on the driver (for messages)."""

    def load(self) -> dict[str, Any]:
        """Import the rollout's modules from the working dir, then unpickle the objects.

        :raises CodeLoadError: naming the module or the object that failed to import.
        """
        cloudpickle: Any = importlib.import_module("ray.cloudpickle")

        root = Path.cwd()
        if self.shipped and str(root) not in sys.path:
            sys.path.insert(0, str(root))  # the rollout's own modules import as they do on the driver
        for name, relative in self.modules:
            where = f"{relative} from the rollout folder" if self.shipped else relative
            try:
                _import_module(name, root / relative, relative)
            except BaseException as exc:
                raise CodeLoadError(f"{_describe(exc)} (importing {where})") from exc
        try:
            objects: dict[str, Any] = cloudpickle.loads(self.payload)
        except BaseException as exc:
            raise CodeLoadError(f"{_describe(exc)} (unpickling the workflow, the grader or their configs)") from exc
        return objects


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return f"ModuleNotFoundError: No module named {exc.name!r}"
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f"SyntaxError: {exc.msg} ({Path(exc.filename or '?').name}:{exc.lineno})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _import_module(name: str, file: Path, relative: str) -> ModuleType:
    """Import ``name`` from ``file``: by name when the name matches the path, else from the file."""
    stem = relative[: -len("/__init__.py")] if relative.endswith("/__init__.py") else relative.removesuffix(".py")
    if stem.replace("/", ".") == name:
        existing = sys.modules.get(name)
        if existing is not None and getattr(existing, "__file__", None) != str(file):
            del sys.modules[name]  # another module of that name (e.g. found through the driver's path)
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"{file} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _file_of(module: ModuleType) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file else None


def _importable_by_name(module: ModuleType) -> bool:
    """True when a plain ``import`` of the module's name finds this very module (its file)."""
    if module.__name__ == "__main__":
        return False
    try:
        spec = importlib.util.find_spec(module.__name__)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    file = _file_of(module)
    return file is None or (spec.origin is not None and Path(spec.origin).resolve() == file)


def pack_rollout_code(objects: Mapping[str, Any], *, rollout_dir: Path | None, ship: bool = True) -> RolloutCode:
    """Pickle ``objects`` (classes and config instances) for actors that receive ``rollout_dir``.

    A module of one of the objects' classes that lives in ``rollout_dir`` is listed for import
    from the working dir (when ``ship``); one no import can find is pickled by value.
    """
    cloudpickle: Any = importlib.import_module("ray.cloudpickle")

    root = rollout_dir.resolve() if rollout_dir is not None and ship else None
    modules: dict[str, str] = {}
    by_value: list[ModuleType] = []
    for obj in objects.values():
        if obj is None:
            continue
        cls = obj if isinstance(obj, type) else type(obj)
        module = sys.modules.get(cls.__module__)
        if module is None or module.__name__ in modules or module in by_value:
            continue
        file = _file_of(module)
        if root is not None and file is not None and file.is_relative_to(root):
            modules[module.__name__] = file.relative_to(root).as_posix()
        elif module.__name__ != "__main__" and not _importable_by_name(module):
            by_value.append(module)
    for module in by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        payload = cloudpickle.dumps(dict(objects))
    finally:
        for module in by_value:
            cloudpickle.unregister_pickle_by_value(module)
    origin = str(rollout_dir) if rollout_dir is not None else None
    return RolloutCode(payload, tuple(modules.items()), shipped=root is not None, origin=origin)


def upload_local_paths(runtime_env: dict[str, Any], logger: Any = None) -> dict[str, Any]:
    """``runtime_env`` with its local ``working_dir`` and ``py_modules`` uploaded to the cluster.

    Ray takes local folders only in the job's runtime environment (``ray.init(runtime_env=...)``),
    which a backend attached to a running driver cannot set; for an actor's it wants URIs. This does
    for the actor's what ``ray.init`` does for the job's, with Ray's own functions: the folder is
    zipped (Ray's default excludes, ``.gitignore``, and ``excludes``), stored in the cluster under
    a content hash (uploaded once), and replaced by its ``gcs://`` URI.
    """
    if "working_dir" not in runtime_env and "py_modules" not in runtime_env:
        return runtime_env
    import os

    from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed
    from ray._private.worker import global_worker

    node = getattr(global_worker, "node", None)
    if node is None:
        raise RuntimeError(
            "this process reaches Ray through Ray Client, which cannot upload an actor's working_dir; "
            "pass it in ray.init(runtime_env={'working_dir': ...}) and set [backend.ray] ship_code = false"
        )
    scratch = node.get_runtime_env_dir_path()
    include_gitignore = os.environ.get(RAY_RUNTIME_ENV_IGNORE_GITIGNORE, "0") != "1"
    env = dict(runtime_env)
    env = upload_py_modules_if_needed(env, include_gitignore=include_gitignore, scratch_dir=scratch, logger=logger)
    env = upload_working_dir_if_needed(env, include_gitignore=include_gitignore, scratch_dir=scratch, logger=logger)
    env.pop("excludes", None)
    return env


# -- the rollout's declared dependencies ----------------------------------------------------------------


def declared_requirements(rollout_dir: Path | None) -> list[str]:
    """The ``[project] dependencies`` of the rollout's ``pyproject.toml`` (none when it has none).

    >>> declared_requirements(None)
    []
    """
    if rollout_dir is None:
        return []
    try:
        data = tomllib.loads((rollout_dir / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return []
    deps = data.get("project", {}).get("dependencies", [])
    return [str(d) for d in deps if isinstance(d, str) and d.strip()] if isinstance(deps, list) else []


def missing_requirements(requirements: list[str]) -> list[str]:
    """Those of ``requirements`` this Python environment does not satisfy (name and version).

    Run on each node (a Ray task) to decide whether Ray must install the rollout's dependencies.

    >>> missing_requirements(["attrs>=1", "surely-not-installed-here>=1"])
    ['surely-not-installed-here>=1']
    """
    from packaging.requirements import InvalidRequirement, Requirement

    missing = []
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            missing.append(text)
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.append(text)
    return missing
