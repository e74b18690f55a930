"""Fixtures of the osmosis-ray tests: one real two-node Ray cluster for the whole session.

The cluster is Ray's own ``ray.cluster_utils.Cluster`` (a head node and a second node, one CPU
each, both on this machine), and this process is a driver connected to it, so every backend
built here attaches to it (and never shuts it down). CLI tests reach the same cluster with
``[backend.ray] address``. Ray's files go to a short folder of its own (unix socket paths are
limited), usage statistics and token authentication are off.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for ``import ray_helpers`` (importlib mode)

_TMP = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
os.environ["RAY_TMPDIR"] = _TMP  # before Ray is imported; child processes inherit it
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.pop("RAY_ADDRESS", None)


class SessionCluster:
    """The session's cluster: its address, and the second node (which a test may remove and re-add)."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        self.tmp = Path(_TMP)
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "include_dashboard": False},
        )
        self.worker = self.cluster.add_node(num_cpus=1)
        self.address: str = self.cluster.address

    def connect(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, logging_level="WARNING")

    def replace_worker(self) -> None:
        """Add a fresh second node (after a test removed it) and wait until it is up."""
        self.worker = self.cluster.add_node(num_cpus=1)
        self.cluster.wait_for_nodes()

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="session")
def cluster() -> Any:
    session = SessionCluster()
    session.connect()
    try:
        yield session
    finally:
        session.shutdown()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def policy() -> Any:
    """The scripted calculator server on 127.0.0.1 (real HTTP), for the whole session."""
    from osmosis_core.testing import ScriptedPolicyServer

    server = ScriptedPolicyServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
