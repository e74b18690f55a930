"""Fixtures of the osmosis-harbor tests (helpers live in ``harbor_helpers``)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for ``import harbor_helpers`` (importlib mode)
os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def pytest_configure(config: pytest.Config) -> None:
    if shutil.which("bwrap") is None:
        raise pytest.UsageError("the osmosis-harbor tests run real trials in bubblewrap: apt-get install -y bubblewrap")


@pytest.fixture
def probe() -> Any:
    """The probe rollout (workflow and grader), loaded like ``osmosis run`` loads it."""
    from harbor_helpers import PROBE_DIR, load

    return load(PROBE_DIR, "probe_rollout.py")
