from osmosis_gateway.adapters import ADAPTERS as ADAPTERS
from osmosis_gateway.adapters import AdapterName as AdapterName
from osmosis_gateway.atif import trace_to_atif as trace_to_atif
from osmosis_gateway.gateway import POLICY_VERSION_FIELD as POLICY_VERSION_FIELD
from osmosis_gateway.gateway import POLICY_VERSION_HEADER as POLICY_VERSION_HEADER
from osmosis_gateway.gateway import PolicyGateway as PolicyGateway
from osmosis_gateway.settings import TracesSettings as TracesSettings
from osmosis_gateway.trace import RolloutTrace as RolloutTrace
from osmosis_gateway.trace import TraceCall as TraceCall
from osmosis_gateway.trace import TrainerView as TrainerView
from osmosis_gateway.trace import TrainingSequence as TrainingSequence
from osmosis_gateway.trace import comparable_trace as comparable_trace
from osmosis_gateway.trace import read_traces as read_traces
from osmosis_gateway.trace import trace_from_json as trace_from_json
from osmosis_gateway.trace import trainer_view as trainer_view

__version__: str
