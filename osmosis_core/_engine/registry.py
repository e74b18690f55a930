"""The plugin registry: loads plugins one at a time, reports broken ones, collects what they register.

Loading rules (the design's):

* the core's built-ins register through the same hooks, first;
* each entry point of group ``osmosis`` is imported on its own; one that fails is reported (name,
  distribution, version, error) as a warning and skipped, and the rest keeps working;
* ``OSMOSIS_DISABLE_PLUGINS=a,b`` skips those names; ``OSMOSIS_LOAD_PLUGINS=a,b`` loads only those
  (set and empty: no external plugin at all);
* a name (backend, template, grader) that two plugins claim is reported with the distribution
  of each provider when it is asked for;
* a plugin whose register hook raises, or returns something that is not a list of the hook's
  records (a ``BackendSpec`` with a name and a factory, ...), is reported as failed with the
  reason, like one that fails to import, and contributes nothing;
* ``osmosis plugins`` shows what each plugin provides: its backend, template, grader and command names.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs
import pluggy

from osmosis_core import hookspecs
from osmosis_core._engine.spelling import did_you_mean
from osmosis_core.errors import PluginError
from osmosis_core.hookspecs import PROJECT_NAME

if TYPE_CHECKING:
    import click

    from osmosis_core._engine.results import RunProgress
    from osmosis_core.backend import BackendSpec
    from osmosis_core.templates import GraderSpec, TemplateSpec

__all__ = ["BUILTIN_PLUGINS", "PluginInfo", "PluginRegistry", "first_party_hint", "get_registry", "reset_registry"]

log = logging.getLogger("osmosis.plugins")

BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (("core", "osmosis_core._engine.builtin"),)
"""(name, module) of the plugins that ship with the core."""

Status = Literal["active", "disabled", "failed"]


@attrs.frozen
class PluginInfo:
    """One plugin as ``osmosis plugins`` shows it."""

    name: str
    distribution: str
    version: str
    module: str
    status: Status
    hooks: tuple[str, ...] = ()
    error: str | None = None
    builtin: bool = False
    provides: dict[str, tuple[str, ...]] = attrs.field(factory=dict, hash=False)
    """What it registered, by kind: ``{"backends": ("local",), "templates": (...), ...}``."""

    @property
    def provider(self) -> str:
        """``distribution version``, as messages name it."""
        return f"{self.distribution} {self.version}".strip()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with stable keys (named here: a field added to the record is not one)."""
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "status": self.status,
            "hooks": list(self.hooks),
            "error": self.error,
            "builtin": self.builtin,
            "provides": {kind: list(names) for kind, names in self.provides.items()},
        }


_KINDS: dict[str, tuple[str, str]] = {
    "osmosis_register_backends": ("backends", "osmosis_core.backend:BackendSpec"),
    "osmosis_register_templates": ("templates", "osmosis_core.templates:TemplateSpec"),
    "osmosis_register_graders": ("graders", "osmosis_core.templates:GraderSpec"),
}
"""Register hook -> (what ``provides`` calls its records, the record class it must return)."""
_HOOK_OF = {kind[:-1]: hook for hook, (kind, _) in _KINDS.items()}
"""``backend`` / ``template`` / ``grader`` -> its register hook."""


def _check_records(hook_name: str, items: Any) -> list[Any]:
    """The records a register hook returned, checked. :raises TypeError: naming what is wrong."""
    from osmosis_core.backend import load_object

    kind, record_path = _KINDS[hook_name]
    record = load_object(record_path)
    if items is None:
        return []
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise TypeError(f"{hook_name} must return a list of {record.__name__}, got {type(items).__name__}")
    checked = list(items)
    for item in checked:
        if not isinstance(item, record):
            raise TypeError(f"{hook_name} must return a list of {record.__name__}, got an item {item!r}")
        if not isinstance(item.name, str) or not item.name.strip():
            raise TypeError(f"{hook_name} returned a {record.__name__} without a name: {item!r}")
        factory = getattr(item, "factory", None)
        if factory is not None and not (callable(factory) or (isinstance(factory, str) and factory.strip())):
            raise TypeError(
                f"{hook_name}: {kind[:-1]} {item.name!r} has a factory that is neither callable nor "
                f"an import path: {factory!r}"
            )
    return checked


def _names(value: str | None) -> set[str] | None:
    return None if value is None else {n.strip() for n in value.split(",") if n.strip()}


@attrs.frozen
class _Provided[T]:
    item: T
    plugin: PluginInfo


def _core_version() -> str:
    from osmosis_core import __version__

    return __version__


class PluginRegistry:
    """Loads plugins and answers "which backend/template/grader is called NAME".

    :param load_entrypoints: load installed plugins (group ``osmosis``); tests pass False and
        :meth:`register` their own.
    """

    def __init__(self, *, load_entrypoints: bool = True, env: dict[str, str] | None = None) -> None:
        self.pm = pluggy.PluginManager(PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self._cache: dict[str, Any] = {}
        self._plugins: list[PluginInfo] = []
        self._info_of: dict[int, PluginInfo] = {}  # id(registered plugin object) -> its record
        environ = os.environ if env is None else env
        self._told_failure: set[str] = set()  # plugins whose progress hook raised (logged once each)
        self._disabled = _names(environ.get("OSMOSIS_DISABLE_PLUGINS")) or set()
        self._only = _names(environ.get("OSMOSIS_LOAD_PLUGINS"))
        version = _core_version()
        for name, module in BUILTIN_PLUGINS:
            self._load(name, module, "osmosis-core", version, functools.partial(importlib.import_module, module), True)
        if load_entrypoints:
            self._load_entrypoints()

    # -- loading -------------------------------------------------------------------------------

    def _load_entrypoints(self) -> None:
        seen: dict[str, PluginInfo] = {}
        for ep in sorted(entry_points(group=PROJECT_NAME), key=lambda e: e.name):
            dist, version = (ep.dist.name, ep.dist.version) if ep.dist is not None else ("?", "?")
            if ep.name in seen:
                other = seen[ep.name]
                error = (
                    f"plugin name {ep.name!r} is also provided by {other.distribution} {other.version}; "
                    "uninstall one of them"
                )
                self._record(PluginInfo(ep.name, dist, version, ep.value, "failed", error=error))
                continue
            if ep.name in self._disabled or (self._only is not None and ep.name not in self._only):
                info = self._record(PluginInfo(ep.name, dist, version, ep.value, "disabled"))
            else:
                info = self._load(ep.name, ep.value, dist, version, ep.load, False)
            seen[ep.name] = info

    def _load(
        self, name: str, module: str, dist: str, version: str, load: Callable[[], object], builtin: bool
    ) -> PluginInfo:
        try:
            plugin = load()
            self.pm.register(plugin, name=name)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "plugin %r (%s) failed to load and is skipped: %s; osmosis-core is %s "
                "(skip it with OSMOSIS_DISABLE_PLUGINS=%s)",
                name,
                f"{dist} {version}".strip(),
                error,
                _core_version(),
                name,
            )
            return self._record(PluginInfo(name, dist, version, module, "failed", error=error, builtin=builtin))
        hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or ()))
        info = self._record(PluginInfo(name, dist, version, module, "active", hooks, builtin=builtin))
        self._info_of[id(plugin)] = info
        return info

    def _record(self, info: PluginInfo) -> PluginInfo:
        self._plugins.append(info)
        return info

    @property
    def plugins(self) -> list[PluginInfo]:
        """Every plugin seen, in load order, with its status, error and what it provides.

        Its register hooks have been called (and checked) by the time this is read.
        """
        if "osmosis_register_backends" not in self._cache:
            self._validate()
        return self._plugins

    def register(self, plugin: object, name: str, *, distribution: str = "(in-process)") -> PluginInfo:
        """Register an in-process plugin object or module (tests, embedding applications).

        Its register hooks are called (and checked) now; the record returned says how it went.
        """
        self._cache.clear()
        info = self._load(name, getattr(plugin, "__name__", name), distribution, "", lambda: plugin, False)
        self._validate()
        return self._info_of.get(id(plugin), info)

    def check_pending(self) -> None:
        """Fail on a ``@hookimpl`` whose name matches no hook (a misspelt hook)."""
        self.pm.check_pending()

    # -- collecting ----------------------------------------------------------------------------

    def _info(self, plugin: object) -> PluginInfo:
        info = self._info_of.get(id(plugin))
        return info if info is not None else PluginInfo(str(self.pm.get_name(plugin)), "?", "?", "?", "active")

    def _collect(self, hook_name: str) -> dict[str, list[_Provided[Any]]]:
        if hook_name not in self._cache:
            self._validate()
        return self._cache[hook_name]  # type: ignore[no-any-return]

    def _validate(self) -> None:
        """Call every register hook once: collect the records, and fail the plugins whose hooks misbehave."""
        results: dict[str, list[tuple[object, list[Any]]]] = {hook_name: [] for hook_name in _KINDS}
        failed: dict[int, str] = {}
        for hook_name, returned in results.items():
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if id(impl.plugin) in failed:
                    continue
                try:
                    returned.append((impl.plugin, _check_records(hook_name, impl.function())))
                except Exception as exc:
                    failed[id(impl.plugin)] = f"{hook_name} failed: {type(exc).__name__}: {exc}"
        provides: dict[int, dict[str, tuple[str, ...]]] = {}
        for hook_name, returned in results.items():  # a plugin that failed any hook contributes nothing
            found: dict[str, list[_Provided[Any]]] = {}
            for plugin, items in returned:
                if id(plugin) in failed:
                    continue
                info = self._info(plugin)
                for item in items:
                    found.setdefault(_normalise(item.name), []).append(_Provided(item, info))
                if items:
                    provides.setdefault(id(plugin), {})[_KINDS[hook_name][0]] = tuple(sorted(i.name for i in items))
            self._cache[hook_name] = found
        for key, error in failed.items():
            failing = self._info_of.get(key)
            if failing is None or failing.status == "failed":
                continue
            log.warning(
                "plugin %r (%s) is skipped: %s (skip it with OSMOSIS_DISABLE_PLUGINS=%s)",
                failing.name,
                failing.provider,
                error,
                failing.name,
            )
            self._update(key, status="failed", error=error)
        for key, kinds in provides.items():
            if key in self._info_of:
                self._update(key, provides={**self._info_of[key].provides, **kinds})

    def _update(self, key: int, **changes: Any) -> None:
        """Replace a plugin's record (they are frozen) in the list and the index."""
        old = self._info_of[key]
        new = attrs.evolve(old, **changes)
        self._info_of[key] = new
        self._plugins[self._plugins.index(old)] = new

    def _pick(self, hook_name: str, kind: str, name: str) -> Any:
        found = self._collect(hook_name)
        providers = found.get(_normalise(name))
        if not providers:
            known = ", ".join(sorted(found)) or "none"
            hint = _FIRST_PARTY.get((kind, _normalise(name)))
            more = f" (it comes with {hint}: pip install {hint})" if hint else did_you_mean(name, found)
            raise PluginError(f"unknown {kind} {name!r}{more}; known {kind}s: {known}")
        if len(providers) > 1:
            who = "; ".join(f"{p.plugin.name} ({p.plugin.provider})" for p in providers)
            raise PluginError(
                f"{kind} {name!r} is provided by more than one plugin: {who}. "
                "Uninstall one, or skip one with OSMOSIS_DISABLE_PLUGINS"
            )
        return providers[0].item

    def _all(self, hook_name: str) -> list[Any]:
        return [ps[0].item for _, ps in sorted(self._collect(hook_name).items())]

    def conflicts(self) -> list[str]:
        """One line per name claimed by more than one plugin."""
        lines = []
        for kind, hook_name in _HOOK_OF.items():
            for name, providers in sorted(self._collect(hook_name).items()):
                if len(providers) > 1:
                    who = ", ".join(f"{p.plugin.name} ({p.plugin.distribution})" for p in providers)
                    lines.append(f"{kind} {name!r} is provided by: {who}")
        return lines

    def backend(self, name: str) -> BackendSpec:
        """The backend spec called ``name``. :raises PluginError: unknown or claimed twice."""
        return self._pick("osmosis_register_backends", "backend", name)  # type: ignore[no-any-return]

    def provider_of(self, kind: str, name: str) -> PluginInfo | None:
        """The plugin that registered the ``kind`` (``backend``, ``template``, ``grader``) called ``name``.

        :raises ValueError: another ``kind`` (it was read as ``grader``).
        """
        if kind not in _HOOK_OF:
            raise ValueError(f"kind must be one of {', '.join(sorted(_HOOK_OF))}, got {kind!r}")
        providers = self._collect(_HOOK_OF[kind]).get(_normalise(name))
        return providers[0].plugin if providers else None

    def backends(self) -> list[BackendSpec]:
        """Every registered backend spec (first provider of each name)."""
        return self._all("osmosis_register_backends")

    def template(self, name: str) -> TemplateSpec:
        """The template spec called ``name``."""
        return self._pick("osmosis_register_templates", "template", name)  # type: ignore[no-any-return]

    def templates(self) -> list[TemplateSpec]:
        """Every registered template spec."""
        return self._all("osmosis_register_templates")

    def grader(self, name: str) -> GraderSpec:
        """The grader spec called ``name``."""
        return self._pick("osmosis_register_graders", "grader", name)  # type: ignore[no-any-return]

    def graders(self) -> list[GraderSpec]:
        """Every registered grader spec."""
        return self._all("osmosis_register_graders")

    def add_commands(self, cli: click.Group) -> None:
        """Let every plugin add its commands; a plugin that fails here is reported and skipped.

        The names each plugin added are recorded (``osmosis plugins`` shows them).
        """
        for impl in self.pm.hook.osmosis_register_commands.get_hookimpls():
            key = id(impl.plugin)
            before = dict(cli.commands)
            try:
                impl.function(cli)
            except Exception as exc:
                cli.commands.clear()
                cli.commands.update(before)  # nothing half-added
                info = self._info(impl.plugin)
                error = f"osmosis_register_commands failed: {type(exc).__name__}: {exc}"
                log.warning("plugin %r failed to add its commands: %s: %s", info.name, type(exc).__name__, exc)
                if key in self._info_of:
                    self._update(key, status="failed", error=error)
                continue
            added = tuple(sorted(name for name in cli.commands if cli.commands[name] is not before.get(name)))
            if added and key in self._info_of:
                self._update(key, provides={**self._info_of[key].provides, "commands": added})

    def hears_progress(self) -> bool:
        """Whether any plugin implements ``osmosis_run_progress`` (else a run builds no progress records)."""
        return bool(self.pm.hook.osmosis_run_progress.get_hookimpls())

    def tell_progress(self, progress: RunProgress) -> list[tuple[str, Path]]:
        """Call every plugin's ``osmosis_run_progress``; one that raises is logged (once per plugin) and
        the others are still called: a progress hook never fails a run or a server.

        :returns: ``(plugin name, path)`` of each file a hook says it wrote (a report).
        """
        written: list[tuple[str, Path]] = []
        for impl in self.pm.hook.osmosis_run_progress.get_hookimpls():
            try:
                path = impl.function(progress)
                if isinstance(path, (str, os.PathLike)):
                    written.append((self._info(impl.plugin).name, Path(path)))
            except Exception as exc:
                name = self._info(impl.plugin).name
                if name not in self._told_failure:
                    self._told_failure.add(name)
                    log.warning(
                        "plugin %r raised in osmosis_run_progress (the run goes on; not logged again): %s: %s",
                        name,
                        type(exc).__name__,
                        exc,
                    )
        return written


_FIRST_PARTY: dict[tuple[str, str], str] = {
    ("backend", "harbor"): "osmosis-harbor",
    ("backend", "ray"): "osmosis-ray",
    **{
        ("grader", name): "osmosis-graders"
        for name in ("contains", "exact-match", "json-match", "llm-judge", "math", "numeric", "regex", "weighted")
    },
    ("template", "multiply-graders"): "osmosis-graders",
    ("command", "serve"): "osmosis-server",
    ("command", "report"): "osmosis-report",
    ("command", "gateway"): "osmosis-gateway",
    ("command", "export"): "osmosis-gateway",
    ("command", "migrate"): "osmosis-migrate",
    ("template", "multiply-local-strands"): "osmosis-strands",
    ("template", "multiply-local-openai"): "osmosis-openai-agents",
    ("template", "multiply-harbor-strands"): "osmosis-harbor",
}
"""Names the project's own plugins provide, to say what to install when one is missing."""


def first_party_hint(kind: str, name: str) -> str | None:
    """The first-party distribution that provides the ``kind`` called ``name`` (to say what to install)."""
    return _FIRST_PARTY.get((kind, _normalise(name)))


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


_registry: PluginRegistry | None = None


def get_registry() -> PluginRegistry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = PluginRegistry()
    return _registry


def reset_registry(registry: PluginRegistry | None = None) -> None:
    """Replace (or drop) the process-wide registry; for tests and embedding applications."""
    global _registry
    _registry = registry
