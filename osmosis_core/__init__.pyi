"""The public names of osmosis_core: written once here, read by type checkers and by the lazy loader."""

from osmosis_core.backend import (
    BackendSetup as BackendSetup,
    BackendSpec as BackendSpec,
    ExecutionBackend as ExecutionBackend,
    ResultCallback as ResultCallback,
)
from osmosis_core.config import structure_table as structure_table
from osmosis_core.context import (
    ROLLOUT_ID_HEADER as ROLLOUT_ID_HEADER,
    RolloutContext as RolloutContext,
    SampleSource as SampleSource,
    current_rollout_context as current_rollout_context,
    get_rollout_context as get_rollout_context,
)
from osmosis_core.errors import (
    BackendUnavailable as BackendUnavailable,
    ConfigError as ConfigError,
    DatasetError as DatasetError,
    InfraError as InfraError,
    OsmosisError as OsmosisError,
    PluginError as PluginError,
    PolicyError as PolicyError,
    RolloutLoadError as RolloutLoadError,
    classify_exception as classify_exception,
)
from osmosis_core.local import LocalBackend as LocalBackend
from osmosis_core.plugins.hookspecs import hookimpl as hookimpl
from osmosis_core.policy import chat_completion as chat_completion
from osmosis_core.policy import chat_completion_response as chat_completion_response
from osmosis_core.records import (
    ErrorCategory as ErrorCategory,
    ErrorInfo as ErrorInfo,
    ExecutionRequest as ExecutionRequest,
    ExecutionResult as ExecutionResult,
    ExecutionStage as ExecutionStage,
    ExecutionStatus as ExecutionStatus,
    Message as Message,
    PolicyEndpoint as PolicyEndpoint,
    RolloutSample as RolloutSample,
    message_text as message_text,
)
from osmosis_core.templates import GraderSpec as GraderSpec
from osmosis_core.templates import TemplateSpec as TemplateSpec
from osmosis_core.workers import WorkerPool as WorkerPool
from osmosis_core.workflow import (
    AgentWorkflow as AgentWorkflow,
    AgentWorkflowConfig as AgentWorkflowConfig,
    AgentWorkflowContext as AgentWorkflowContext,
    ConcurrencyConfig as ConcurrencyConfig,
    Grader as Grader,
    GraderConfig as GraderConfig,
    GraderContext as GraderContext,
    WorkflowOutput as WorkflowOutput,
)

__version__: str
