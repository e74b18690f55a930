"""What a plugin author needs from osmosis: the seam between the core and a backend, and the hooks.

A plugin (a backend, an agent integration, graders, templates, CLI commands) imports from here and
from the other public modules only; the first-party plugins do too, and the ``lint`` session
checks it (import-linter). Names are imported on first use, so a plugin's entry module stays light.
The names, in the order a plugin author meets them (``__all__`` keeps this order):

1. **The seam.** A backend is an :class:`ExecutionBackend` registered as a :class:`BackendSpec`;
   its factory gets a :class:`BackendSetup` (the workflow and grader, resolved once, their configs,
   the grading rule, the run's :class:`RunLimits`) and reports each stage through a
   :data:`ResultCallback`. :class:`BackendUnavailable` says the backend cannot run rollouts at all.
2. **The lifecycle**, written once. A backend's side: :class:`RolloutReporter` reports one rollout
   (each stage once, the cancellation shielded), :func:`run_workflow` and :func:`run_grader` run a
   stage as the ``local`` backend does. A caller's side: :func:`run_one` runs a request and returns
   its one final result; :class:`RolloutReports` holds what was reported on the way.
3. **The hooks** (:mod:`osmosis_core.hookspecs`, each with an example): implement them with
   :data:`hookimpl`; they hand out :class:`TemplateSpec` and :class:`GraderSpec`, and hear of a
   run's :class:`RunProgress`.
4. **A plugin's own config table**: :func:`structure_table` (unknown keys refused, every problem
   named with its key path), :func:`apply_config_table`, :func:`resolve_object` (a class named
   by an import path, checked) and :func:`load_object`.
5. **Messages without secrets**: :func:`redact`, :func:`redact_data`, :func:`clip` (redact, then
   cut to one line) and :func:`error_info` (an exception's category and message).
6. **The registry**: :func:`get_registry` (every plugin's backends, graders, templates) and
   :func:`local_backend`, the ``local`` backend's factory.
7. **Traces**: a trace gateway plugin provides a :class:`TraceGateway`; :class:`SharedGateways` is
   one per upstream, shared by the rollouts of a run.
8. **Deprecating your own names**: :func:`warn_deprecated` and :func:`moved_names`; and
   :class:`Waiters`, the futures a backend wakes when its state changes.

Other public modules, each under a name of its own: :mod:`osmosis_core.http` (the HTTP client and
server helpers), :mod:`osmosis_core.wire` (records to and from JSON), :mod:`osmosis_core.sampling`
(the trainer's sampling settings), :mod:`osmosis_core.templates` (the starter templates' parts),
:mod:`osmosis_core.frontend` (for a command that runs or reads runs) and
:mod:`osmosis_core.testing` (test tools, and ``BackendContract``). What a rollout author uses
(records, errors, ``current_rollout_context``) is on ``osmosis_core``.

A complete backend plugin is the example in :mod:`osmosis_core.backend` (the same code as the
README's and ``osmosis_core/testing/example_backend.py``, which the backend contract suite runs).

A plugin whose package should import fast (the ``osmosis`` CLI loads every plugin's entry module)
loads its public names on first use, as :mod:`osmosis_core.testing.exports` shows (and checks with
``check_lazy_exports``).
"""

from typing import TYPE_CHECKING, Any

from osmosis_core import _reexport
from osmosis_core import deprecation as _deprecation

if TYPE_CHECKING:
    from osmosis_core._engine.builtin import local_backend as local_backend
    from osmosis_core._engine.config import structure_table as structure_table
    from osmosis_core._engine.loader import apply_config_table as apply_config_table
    from osmosis_core._engine.registry import get_registry as get_registry
    from osmosis_core._engine.results import RunProgress as RunProgress
    from osmosis_core._engine.traces import SharedGateways as SharedGateways
    from osmosis_core._engine.waiters import Waiters as Waiters
    from osmosis_core.backend import BackendSetup as BackendSetup
    from osmosis_core.backend import BackendSpec as BackendSpec
    from osmosis_core.backend import ExecutionBackend as ExecutionBackend
    from osmosis_core.backend import ResultCallback as ResultCallback
    from osmosis_core.backend import RunLimits as RunLimits
    from osmosis_core.backend import load_object as load_object
    from osmosis_core.backend import resolve_object as resolve_object
    from osmosis_core.deprecation import moved_names as moved_names
    from osmosis_core.deprecation import warn_deprecated as warn_deprecated
    from osmosis_core.errors import BackendUnavailable as BackendUnavailable
    from osmosis_core.errors import clip as clip
    from osmosis_core.errors import error_info as error_info
    from osmosis_core.errors import redact as redact
    from osmosis_core.errors import redact_data as redact_data
    from osmosis_core.hookspecs import hookimpl as hookimpl
    from osmosis_core.lifecycle import RolloutReporter as RolloutReporter
    from osmosis_core.lifecycle import RolloutReports as RolloutReports
    from osmosis_core.lifecycle import run_grader as run_grader
    from osmosis_core.lifecycle import run_one as run_one
    from osmosis_core.lifecycle import run_workflow as run_workflow
    from osmosis_core.templates import GraderSpec as GraderSpec
    from osmosis_core.templates import TemplateSpec as TemplateSpec
    from osmosis_core.traces import TraceGateway as TraceGateway

# the names live in modules of the osmosis_core package, imported on first use
_public_getattr, __dir__, _names = _reexport.attach(
    "osmosis_core",
    submod_attrs={
        "_engine.builtin": ["local_backend"],
        "_engine.config": ["structure_table"],
        "_engine.loader": ["apply_config_table"],
        "_engine.registry": ["get_registry"],
        "_engine.results": ["RunProgress"],
        "_engine.waiters": ["Waiters"],
        "backend": [
            "BackendSetup",
            "BackendSpec",
            "ExecutionBackend",
            "ResultCallback",
            "RunLimits",
            "load_object",
            "resolve_object",
        ],
        "deprecation": ["moved_names", "warn_deprecated"],
        "errors": ["BackendUnavailable", "clip", "error_info", "redact", "redact_data"],
        "hookspecs": ["hookimpl"],
        "lifecycle": ["RolloutReporter", "RolloutReports", "run_grader", "run_one", "run_workflow"],
        "templates": ["GraderSpec", "TemplateSpec"],
        "_engine.traces": ["SharedGateways"],
        "traces": ["TraceGateway"],
    },
    into=__name__,
)

__all__ = [  # noqa: RUF022 - in the order the docstring teaches them
    # 1. the seam
    "ExecutionBackend",
    "BackendSpec",
    "BackendSetup",
    "RunLimits",
    "ResultCallback",
    "BackendUnavailable",
    # 2. the lifecycle: a backend's side, then a caller's
    "RolloutReporter",
    "run_workflow",
    "run_grader",
    "run_one",
    "RolloutReports",
    # 3. the hooks
    "hookimpl",
    "TemplateSpec",
    "GraderSpec",
    "RunProgress",
    # 4. a plugin's own config table
    "structure_table",
    "apply_config_table",
    "resolve_object",
    "load_object",
    # 5. messages without secrets
    "redact",
    "redact_data",
    "clip",
    "error_info",
    # 6. the registry
    "get_registry",
    "local_backend",
    # 7. traces
    "TraceGateway",
    "SharedGateways",
    # 8. deprecating your own names; a backend's waiters
    "warn_deprecated",
    "moved_names",
    "Waiters",
]
assert sorted(__all__) == _names, "every name of the table is in __all__, once"

# names that moved to another public module (CHANGELOG 0.2.0): each warns and still works
_MOVED_TO: dict[str, tuple[str, ...]] = {
    # a frontend's tools (a command that runs or reads runs)
    "osmosis_core.frontend": (
        "DatasetRow",
        "ResultStats",
        "Summary",
        "TRACES",
        "config_from_dict",
        "config_options",
        "fingerprint",
        "latest_records",
        "load_rollout",
        "make_console",
        "make_trace_gateway",
        "percentile",
        "read_dataset",
        "resolve_config",
        "result_line",
        "summary_fields",
        "traces_enabled",
    ),
    "osmosis_core.http": (
        "DEFAULT_MAX_RESPONSE_BYTES",
        "KEEPALIVE_SEC",
        "ResponseTooLarge",
        "aclose_http",
        "client_session",
        "cut_response",
        "drop_connection",
        "http_request",
        "http_scope",
        "on_close",
        "proxy_options",
        "read_limited",
        "start_http_server",
    ),
    "osmosis_core.wire": (
        "chat_completion_problem",
        "policy_from_json",
        "policy_to_json",
        "result_from_json",
        "result_to_json",
        "sample_from_json",
        "sample_to_json",
    ),
    "osmosis_core.sampling": (
        "DISTRIBUTION_PARAMS",
        "SAMPLING_PARAMS",
        "agent_distribution",
        "apply_sampling",
        "check_sampling",
        "sampling_overrides",
        "sampling_problems",
        "sampling_schema",
    ),
    "osmosis_core.templates": ("GUIDES_ROOT", "MULTIPLY_DATASET", "multiply_template"),
    "osmosis_core": ("OsmosisDeprecationWarning", "current_rollout_context"),
}
_MOVED: dict[str, tuple[str, str]] = {
    **{name: (module, f"{module}.{name}") for module, names in _MOVED_TO.items() for name in names},
    "ResultWriter": ("osmosis_core._engine.results", "osmosis_core.frontend.RunFiles"),
    "RunLock": ("osmosis_core._engine.run_lock", "osmosis_core.frontend.RunFiles"),
    "build_backend": ("osmosis_core._engine.runner", "osmosis_core.frontend.load_run(config).build_backend"),
    "folder_progress": ("osmosis_core._engine.results", "osmosis_core.frontend.load_run(config).tell_progress"),
    "RunTraces": ("osmosis_core._engine.traces", "osmosis_core.frontend.RunFiles.write_trace"),
    "Rollout": ("osmosis_core.lifecycle", "osmosis_core.plugin.RolloutReporter"),
    "report_cancelled": ("osmosis_core.backend", "osmosis_core.plugin.RolloutReporter (its cancelled())"),
}
_RENAMED = {"Rollout": "RolloutReporter"}


def _plugin_getattr(name: str) -> Any:
    if name == "attach_stub":  # deprecated (CHANGELOG 0.2.0): it warns when called
        from osmosis_core.lazy import attach_stub

        return attach_stub
    if name in _MOVED:
        module, instead = _MOVED[name]
        # stacklevel 4: past this function and moved_names' __getattr__, at the caller's line
        _deprecation.warn_deprecated(f"osmosis_core.plugin.{name}", instead, "0.2.0", stacklevel=4)
        import importlib

        return getattr(importlib.import_module(module), _RENAMED.get(name, name))
    return _public_getattr(name)


# the openai client moved to the osmosis-openai distribution (CHANGELOG 0.2.0)
_OPENAI_CLIENT = ("policy_error", "rollout_openai_client")
__getattr__ = _deprecation.moved_names(
    __name__,
    {name: (f"osmosis_openai:{name}", "0.2.0", "osmosis-openai") for name in _OPENAI_CLIENT},
    fallback=_plugin_getattr,
)
