"""Everything a plugin author needs from osmosis, under one name: ``osmosis_core.plugin``.

A plugin (a backend, an agent integration, graders, templates, CLI commands) imports from here,
from ``osmosis_core`` (records, the author API, errors) and from ``osmosis_core.testing`` (test
tools) only; the first-party plugins do too, and the ``lint`` session checks it (import-linter).
Names are imported on first use, so a plugin's entry module stays light. A frontend (a command that
runs or reads runs, as ``osmosis serve`` and ``osmosis report`` do) uses ``osmosis_core.frontend``.

A complete backend plugin is the example in :mod:`osmosis_core.backend` (the same code as the
README's and ``osmosis_core/testing/example_backend.py``).

Check it with the backend contract suite (``osmosis_core.testing.BackendContract``).

A plugin whose package should import fast (the ``osmosis`` CLI loads every plugin's entry module)
loads its public names on first use with ``lazy_loader.attach`` and imports the same names under
``if TYPE_CHECKING:`` for type checkers, as the first-party plugins do;
``osmosis_core.testing.check_lazy_exports`` checks the two lists agree. (0.1's ``attach_stub`` and
its ``.pyi`` stub still work, with a warning, for this release.)
"""

from typing import TYPE_CHECKING, Any

from osmosis_core import _reexport
from osmosis_core import deprecation as _deprecation

if TYPE_CHECKING:
    from osmosis_core._engine.builtin import local_backend as local_backend
    from osmosis_core._engine.config import config_from_dict as config_from_dict
    from osmosis_core._engine.config import structure_table as structure_table
    from osmosis_core._engine.http_server import cut_response as cut_response
    from osmosis_core._engine.http_server import drop_connection as drop_connection
    from osmosis_core._engine.http_server import start_http_server as start_http_server
    from osmosis_core._engine.http_session import DEFAULT_MAX_RESPONSE_BYTES as DEFAULT_MAX_RESPONSE_BYTES
    from osmosis_core._engine.http_session import KEEPALIVE_SEC as KEEPALIVE_SEC
    from osmosis_core._engine.http_session import ResponseTooLarge as ResponseTooLarge
    from osmosis_core._engine.http_session import aclose_http as aclose_http
    from osmosis_core._engine.http_session import client_session as client_session
    from osmosis_core._engine.http_session import http_request as http_request
    from osmosis_core._engine.http_session import http_scope as http_scope
    from osmosis_core._engine.http_session import on_close as on_close
    from osmosis_core._engine.http_session import proxy_options as proxy_options
    from osmosis_core._engine.http_session import read_limited as read_limited
    from osmosis_core._engine.loader import apply_config_table as apply_config_table
    from osmosis_core._engine.loader import load_rollout as load_rollout
    from osmosis_core._engine.loader import resolve_object as resolve_object
    from osmosis_core._engine.registry import get_registry as get_registry
    from osmosis_core._engine.results import RunProgress as RunProgress
    from osmosis_core._engine.waiters import Waiters as Waiters
    from osmosis_core.backend import BackendSetup as BackendSetup
    from osmosis_core.backend import BackendSpec as BackendSpec
    from osmosis_core.backend import ExecutionBackend as ExecutionBackend
    from osmosis_core.backend import ResultCallback as ResultCallback
    from osmosis_core.backend import RunLimits as RunLimits
    from osmosis_core.backend import load_object as load_object
    from osmosis_core.backend import report_cancelled as report_cancelled
    from osmosis_core.context import current_rollout_context as current_rollout_context
    from osmosis_core.deprecation import OsmosisDeprecationWarning as OsmosisDeprecationWarning
    from osmosis_core.deprecation import moved_names as moved_names
    from osmosis_core.deprecation import warn_deprecated as warn_deprecated
    from osmosis_core.errors import BackendUnavailable as BackendUnavailable
    from osmosis_core.errors import clip as clip
    from osmosis_core.errors import error_info as error_info
    from osmosis_core.errors import redact as redact
    from osmosis_core.errors import redact_data as redact_data
    from osmosis_core.hookspecs import hookimpl as hookimpl
    from osmosis_core.lifecycle import Rollout as Rollout
    from osmosis_core.lifecycle import run_grader as run_grader
    from osmosis_core.lifecycle import run_workflow as run_workflow
    from osmosis_core.policy import chat_completion_problem as chat_completion_problem
    from osmosis_core.sampling import DISTRIBUTION_PARAMS as DISTRIBUTION_PARAMS
    from osmosis_core.sampling import SAMPLING_PARAMS as SAMPLING_PARAMS
    from osmosis_core.sampling import agent_distribution as agent_distribution
    from osmosis_core.sampling import apply_sampling as apply_sampling
    from osmosis_core.sampling import check_sampling as check_sampling
    from osmosis_core.sampling import sampling_overrides as sampling_overrides
    from osmosis_core.sampling import sampling_problems as sampling_problems
    from osmosis_core.sampling import sampling_schema as sampling_schema
    from osmosis_core.templates import GUIDES_ROOT as GUIDES_ROOT
    from osmosis_core.templates import MULTIPLY_DATASET as MULTIPLY_DATASET
    from osmosis_core.templates import GraderSpec as GraderSpec
    from osmosis_core.templates import TemplateSpec as TemplateSpec
    from osmosis_core.templates import multiply_template as multiply_template
    from osmosis_core.traces import SharedGateways as SharedGateways
    from osmosis_core.traces import TraceGateway as TraceGateway
    from osmosis_core.wire import policy_from_json as policy_from_json
    from osmosis_core.wire import policy_to_json as policy_to_json
    from osmosis_core.wire import result_from_json as result_from_json
    from osmosis_core.wire import result_to_json as result_to_json
    from osmosis_core.wire import sample_from_json as sample_from_json
    from osmosis_core.wire import sample_to_json as sample_to_json

# the names live in modules of the osmosis_core package, imported on first use
_public_getattr, __dir__, __all__ = _reexport.attach(
    "osmosis_core",
    submod_attrs={
        "_engine.builtin": ["local_backend"],
        "_engine.config": ["config_from_dict", "structure_table"],
        "_engine.http_server": ["cut_response", "drop_connection", "start_http_server"],
        "_engine.http_session": [
            "DEFAULT_MAX_RESPONSE_BYTES",
            "KEEPALIVE_SEC",
            "ResponseTooLarge",
            "aclose_http",
            "client_session",
            "http_request",
            "http_scope",
            "on_close",
            "proxy_options",
            "read_limited",
        ],
        "_engine.loader": ["apply_config_table", "load_rollout", "resolve_object"],
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
            "report_cancelled",
        ],
        "context": ["current_rollout_context"],
        "deprecation": ["OsmosisDeprecationWarning", "moved_names", "warn_deprecated"],
        "errors": ["BackendUnavailable", "clip", "error_info", "redact", "redact_data"],
        "hookspecs": ["hookimpl"],
        "lifecycle": ["Rollout", "run_grader", "run_workflow"],
        "policy": ["chat_completion_problem"],
        "sampling": [
            "DISTRIBUTION_PARAMS",
            "SAMPLING_PARAMS",
            "agent_distribution",
            "apply_sampling",
            "check_sampling",
            "sampling_overrides",
            "sampling_problems",
            "sampling_schema",
        ],
        "templates": ["GUIDES_ROOT", "GraderSpec", "MULTIPLY_DATASET", "TemplateSpec", "multiply_template"],
        "traces": ["SharedGateways", "TraceGateway"],
        "wire": [
            "policy_from_json",
            "policy_to_json",
            "result_from_json",
            "result_to_json",
            "sample_from_json",
            "sample_to_json",
        ],
    },
    into=__name__,
)

# 0.1's names for a frontend's tools (CHANGELOG 0.2.0): each warns and still works
_FRONTEND = "osmosis_core.frontend"
_TO_FRONTEND = [
    "DatasetRow",
    "ResultStats",
    "Summary",
    "TRACES",
    "config_options",
    "fingerprint",
    "latest_records",
    "make_console",
    "make_trace_gateway",
    "percentile",
    "read_dataset",
    "resolve_config",
    "result_line",
    "summary_fields",
    "traces_enabled",
]
_MOVED: dict[str, tuple[str, str]] = {
    **{name: (_FRONTEND, name) for name in _TO_FRONTEND},
    "ResultWriter": ("osmosis_core._engine.results", "osmosis_core.frontend.RunFiles"),
    "RunLock": ("osmosis_core._engine.run_lock", "osmosis_core.frontend.RunFiles"),
    "build_backend": ("osmosis_core._engine.runner", "osmosis_core.frontend.load_run(config).build_backend"),
    "folder_progress": ("osmosis_core._engine.results", "osmosis_core.frontend.load_run(config).tell_progress"),
    "RunTraces": ("osmosis_core.traces", "osmosis_core.frontend.RunFiles.write_trace"),
}


def _plugin_getattr(name: str) -> Any:
    if name == "attach_stub":  # deprecated (CHANGELOG 0.2.0): it warns when called
        from osmosis_core.lazy import attach_stub

        return attach_stub
    if name in _MOVED:
        module, instead = _MOVED[name]
        where = instead if "." in instead else f"{module}.{name}"
        # stacklevel 4: past this function and moved_names' __getattr__, at the caller's line
        _deprecation.warn_deprecated(f"osmosis_core.plugin.{name}", where, "0.2.0", stacklevel=4)
        import importlib

        return getattr(importlib.import_module(module), name)
    return _public_getattr(name)


# the openai client moved to the osmosis-openai distribution (CHANGELOG 0.2.0)
_OPENAI_CLIENT = ("policy_error", "rollout_openai_client")
__getattr__ = _deprecation.moved_names(
    __name__,
    {name: (f"osmosis_openai:{name}", "0.2.0", "osmosis-openai") for name in _OPENAI_CLIENT},
    fallback=_plugin_getattr,
)
