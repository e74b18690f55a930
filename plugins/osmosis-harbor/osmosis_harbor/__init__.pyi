from osmosis_harbor.agent import OsmosisWorkflowAgent as OsmosisWorkflowAgent
from osmosis_harbor.backend import HarborBackend as HarborBackend
from osmosis_harbor.bwrap import BubblewrapMissing as BubblewrapMissing
from osmosis_harbor.bwrap import Sandbox as Sandbox
from osmosis_harbor.config import EnvironmentSection as EnvironmentSection
from osmosis_harbor.config import HarborBackendConfig as HarborBackendConfig
from osmosis_harbor.config import SandboxSection as SandboxSection
from osmosis_harbor.sandbox import BubblewrapEnvironment as BubblewrapEnvironment
from osmosis_harbor.tasks import DEFAULT_TASK_DIR as DEFAULT_TASK_DIR
from osmosis_harbor.tasks import dataset_rows as dataset_rows
from osmosis_harbor.tasks import write_dataset as write_dataset
from osmosis_harbor.verifier import OsmosisGraderVerifier as OsmosisGraderVerifier

__version__: str
