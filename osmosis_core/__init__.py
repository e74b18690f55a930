"""osmosis-core: agent rollouts for RL post-training.

Write an :class:`AgentWorkflow` (the agent) and a :class:`Grader` (the reward) once; run them
over a dataset with ``osmosis run``, in-process (:class:`LocalBackend`) or on a plugin backend.

Public names are imported on first use (``lazy_loader``), so ``import osmosis_core`` (and the ``osmosis``
CLI) starts fast; the imports under ``TYPE_CHECKING`` are what type checkers and editors read, and
``tests/test_public_api.py`` checks they name the same objects.
"""

from typing import TYPE_CHECKING, Any

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_core.context import ROLLOUT_ID_HEADER as ROLLOUT_ID_HEADER
    from osmosis_core.context import RolloutContext as RolloutContext
    from osmosis_core.context import SampleSource as SampleSource
    from osmosis_core.context import current_rollout_context as current_rollout_context
    from osmosis_core.context import get_rollout_context as get_rollout_context
    from osmosis_core.deprecation import OsmosisDeprecationWarning as OsmosisDeprecationWarning
    from osmosis_core.errors import ConfigError as ConfigError
    from osmosis_core.errors import DatasetError as DatasetError
    from osmosis_core.errors import InfraError as InfraError
    from osmosis_core.errors import OsmosisError as OsmosisError
    from osmosis_core.errors import PluginError as PluginError
    from osmosis_core.errors import PolicyError as PolicyError
    from osmosis_core.errors import RolloutLoadError as RolloutLoadError
    from osmosis_core.errors import classify_exception as classify_exception
    from osmosis_core.local import LocalBackend as LocalBackend
    from osmosis_core.policy import chat_completion as chat_completion
    from osmosis_core.policy import chat_completion_response as chat_completion_response
    from osmosis_core.records import ErrorCategory as ErrorCategory
    from osmosis_core.records import ErrorInfo as ErrorInfo
    from osmosis_core.records import ExecutionRequest as ExecutionRequest
    from osmosis_core.records import ExecutionResult as ExecutionResult
    from osmosis_core.records import ExecutionStage as ExecutionStage
    from osmosis_core.records import ExecutionStatus as ExecutionStatus
    from osmosis_core.records import Message as Message
    from osmosis_core.records import PolicyEndpoint as PolicyEndpoint
    from osmosis_core.records import RolloutSample as RolloutSample
    from osmosis_core.records import message_text as message_text
    from osmosis_core.workflow import AgentWorkflow as AgentWorkflow
    from osmosis_core.workflow import AgentWorkflowConfig as AgentWorkflowConfig
    from osmosis_core.workflow import AgentWorkflowContext as AgentWorkflowContext
    from osmosis_core.workflow import ConcurrencyConfig as ConcurrencyConfig
    from osmosis_core.workflow import Grader as Grader
    from osmosis_core.workflow import GraderConfig as GraderConfig
    from osmosis_core.workflow import GraderContext as GraderContext
    from osmosis_core.workflow import WorkflowOutput as WorkflowOutput

_getattr, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "context": [
            "ROLLOUT_ID_HEADER",
            "RolloutContext",
            "SampleSource",
            "current_rollout_context",
            "get_rollout_context",
        ],
        "deprecation": ["OsmosisDeprecationWarning"],
        "errors": [
            "ConfigError",
            "DatasetError",
            "InfraError",
            "OsmosisError",
            "PluginError",
            "PolicyError",
            "RolloutLoadError",
            "classify_exception",
        ],
        "local": ["LocalBackend"],
        "policy": ["chat_completion", "chat_completion_response"],
        "records": [
            "ErrorCategory",
            "ErrorInfo",
            "ExecutionRequest",
            "ExecutionResult",
            "ExecutionStage",
            "ExecutionStatus",
            "Message",
            "PolicyEndpoint",
            "RolloutSample",
            "message_text",
        ],
        "workflow": [
            "AgentWorkflow",
            "AgentWorkflowConfig",
            "AgentWorkflowContext",
            "ConcurrencyConfig",
            "Grader",
            "GraderConfig",
            "GraderContext",
            "WorkflowOutput",
        ],
    },
)


# a plugin author's names, on osmosis_core.plugin only since 0.2.0 (CHANGELOG): each warns and still works
_TO_PLUGIN = (
    "BackendSetup",
    "BackendSpec",
    "BackendUnavailable",
    "ExecutionBackend",
    "GraderSpec",
    "ResultCallback",
    "RunLimits",
    "TemplateSpec",
    "hookimpl",
    "structure_table",
)


def __getattr__(name: str) -> Any:
    if name == "LocalBackendConfig":  # deprecated (CHANGELOG 0.2.0); it warns when built
        from osmosis_core.local import LocalBackendConfig

        return LocalBackendConfig
    if name in _TO_PLUGIN or name == "WorkerPool":
        import importlib

        from osmosis_core.deprecation import warn_deprecated

        if name == "WorkerPool":  # an engine class: [run] workers (or BackendSetup.workers) chooses it
            instead = "[run] workers = N (osmosis_core.plugin.local_backend with BackendSetup(workers=N))"
            warn_deprecated("osmosis_core.WorkerPool", instead, "0.2.0")
            return importlib.import_module("osmosis_core._engine.workers").WorkerPool
        warn_deprecated(f"osmosis_core.{name}", f"osmosis_core.plugin.{name}", "0.2.0")
        return getattr(importlib.import_module("osmosis_core.plugin"), name)
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _getattr(name)
