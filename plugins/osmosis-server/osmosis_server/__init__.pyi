from osmosis_server.app import create_app as create_app
from osmosis_server.client import Admission as Admission
from osmosis_server.client import RolloutAlreadyAdmitted as RolloutAlreadyAdmitted
from osmosis_server.client import RolloutClient as RolloutClient
from osmosis_server.client import RolloutClientError as RolloutClientError
from osmosis_server.client import RolloutConflict as RolloutConflict
from osmosis_server.client import RolloutLost as RolloutLost
from osmosis_server.client import RolloutProtocolError as RolloutProtocolError
from osmosis_server.client import RolloutRequest as RolloutRequest
from osmosis_server.client import RolloutResult as RolloutResult
from osmosis_server.client import ServerUnavailable as ServerUnavailable
from osmosis_server.client import Unauthorized as Unauthorized
from osmosis_server.protocol import LEASE_HEADER as LEASE_HEADER
from osmosis_server.protocol import RolloutStatus as RolloutStatus
from osmosis_server.run_folder import RunFolder as RunFolder
from osmosis_server.serving import serve as serve
from osmosis_server.settings import ServerSettings as ServerSettings

__version__: str
