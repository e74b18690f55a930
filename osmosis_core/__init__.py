"""osmosis-core: agent rollouts for RL post-training.

Write an :class:`AgentWorkflow` (the agent) and a :class:`Grader` (the reward) once; run them
over a dataset with ``osmosis run``, in-process (:class:`LocalBackend`) or on a plugin backend.

Public names are imported lazily, so ``import osmosis_core`` (and the ``osmosis`` CLI) starts fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # records
    "ErrorCategory": "osmosis_core.records",
    "ErrorInfo": "osmosis_core.records",
    "ExecutionRequest": "osmosis_core.records",
    "ExecutionResult": "osmosis_core.records",
    "ExecutionStage": "osmosis_core.records",
    "ExecutionStatus": "osmosis_core.records",
    "Message": "osmosis_core.records",
    "PolicyEndpoint": "osmosis_core.records",
    "RolloutSample": "osmosis_core.records",
    "message_text": "osmosis_core.records",
    # author API
    "AgentWorkflow": "osmosis_core.workflow",
    "AgentWorkflowConfig": "osmosis_core.workflow",
    "AgentWorkflowContext": "osmosis_core.workflow",
    "ConcurrencyConfig": "osmosis_core.workflow",
    "Grader": "osmosis_core.workflow",
    "GraderConfig": "osmosis_core.workflow",
    "GraderContext": "osmosis_core.workflow",
    "WorkflowOutput": "osmosis_core.workflow",
    "RolloutContext": "osmosis_core.context",
    "SampleSource": "osmosis_core.context",
    "ROLLOUT_ID_HEADER": "osmosis_core.context",
    "get_rollout_context": "osmosis_core.context",
    "current_rollout_context": "osmosis_core.context",
    "chat_completion": "osmosis_core.policy",
    "chat_completion_response": "osmosis_core.policy",
    # backends
    "ExecutionBackend": "osmosis_core.backend",
    "BackendSetup": "osmosis_core.backend",
    "BackendSpec": "osmosis_core.backend",
    "ResultCallback": "osmosis_core.backend",
    "LocalBackend": "osmosis_core.local",
    "WorkerPool": "osmosis_core.workers",
    # errors
    "OsmosisError": "osmosis_core.errors",
    "ConfigError": "osmosis_core.errors",
    "DatasetError": "osmosis_core.errors",
    "PluginError": "osmosis_core.errors",
    "PolicyError": "osmosis_core.errors",
    "InfraError": "osmosis_core.errors",
    "RolloutLoadError": "osmosis_core.errors",
    "classify_exception": "osmosis_core.errors",
    # plugins
    "hookimpl": "osmosis_core.plugins.hookspecs",
    "TemplateSpec": "osmosis_core.templates",
    "GraderSpec": "osmosis_core.templates",
    "structure_table": "osmosis_core.config",
}

__all__ = [
    "ROLLOUT_ID_HEADER",
    "AgentWorkflow",
    "AgentWorkflowConfig",
    "AgentWorkflowContext",
    "BackendSetup",
    "BackendSpec",
    "ConcurrencyConfig",
    "ConfigError",
    "DatasetError",
    "ErrorCategory",
    "ErrorInfo",
    "ExecutionBackend",
    "ExecutionRequest",
    "ExecutionResult",
    "ExecutionStage",
    "ExecutionStatus",
    "Grader",
    "GraderConfig",
    "GraderContext",
    "GraderSpec",
    "InfraError",
    "LocalBackend",
    "Message",
    "OsmosisError",
    "PluginError",
    "PolicyEndpoint",
    "PolicyError",
    "ResultCallback",
    "RolloutContext",
    "RolloutLoadError",
    "RolloutSample",
    "SampleSource",
    "TemplateSpec",
    "WorkerPool",
    "WorkflowOutput",
    "__version__",
    "chat_completion",
    "chat_completion_response",
    "classify_exception",
    "current_rollout_context",
    "get_rollout_context",
    "hookimpl",
    "message_text",
    "structure_table",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


if TYPE_CHECKING:
    from osmosis_core.backend import BackendSetup, BackendSpec, ExecutionBackend, ResultCallback
    from osmosis_core.config import structure_table
    from osmosis_core.context import (
        ROLLOUT_ID_HEADER,
        RolloutContext,
        SampleSource,
        current_rollout_context,
        get_rollout_context,
    )
    from osmosis_core.errors import (
        ConfigError,
        DatasetError,
        InfraError,
        OsmosisError,
        PluginError,
        PolicyError,
        RolloutLoadError,
        classify_exception,
    )
    from osmosis_core.local import LocalBackend
    from osmosis_core.plugins.hookspecs import hookimpl
    from osmosis_core.policy import chat_completion, chat_completion_response
    from osmosis_core.records import (
        ErrorCategory,
        ErrorInfo,
        ExecutionRequest,
        ExecutionResult,
        ExecutionStage,
        ExecutionStatus,
        Message,
        PolicyEndpoint,
        RolloutSample,
        message_text,
    )
    from osmosis_core.templates import GraderSpec, TemplateSpec
    from osmosis_core.workers import WorkerPool
    from osmosis_core.workflow import (
        AgentWorkflow,
        AgentWorkflowConfig,
        AgentWorkflowContext,
        ConcurrencyConfig,
        Grader,
        GraderConfig,
        GraderContext,
        WorkflowOutput,
    )
