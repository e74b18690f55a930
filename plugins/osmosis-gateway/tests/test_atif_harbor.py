"""The ATIF export against Harbor's own ``Trajectory`` model: every case of ``test_atif.py``, the
generated traces, a cut stream over real HTTP. Harbor comes with osmosis-harbor, so these run in the
``plugins_all`` nox session (``together``); there a missing Harbor fails them. The gateway's own
session checks the same documents with Harbor's JSON Schema (``atif_helpers.check_atif``), which the
first test here keeps equal to the model's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from atif_helpers import BROKEN, CASES, SCHEMA, broken_document, cut_stream_then_carry_on, harbor_trajectory, traces
from gateway_helpers import run
from hypothesis import HealthCheck, given, settings

from osmosis_gateway import RolloutTrace, trace_to_atif

pytestmark = pytest.mark.together  # Harbor is installed with osmosis-harbor


@pytest.fixture(scope="module")
def trajectory(request: pytest.FixtureRequest) -> Any:
    return harbor_trajectory(request.config)


def validate(trajectory: Any, trace: RolloutTrace) -> Any:
    document = trace_to_atif(trace)
    assert document is not None
    return trajectory.model_validate(json.loads(json.dumps(document)))


def test_the_schema_the_gateway_session_checks_is_harbors(trajectory):
    assert json.loads(SCHEMA.read_text(encoding="utf-8")) == trajectory.model_json_schema(), (
        f"Harbor's Trajectory model changed: write its model_json_schema() to {SCHEMA.name} "
        "(json.dumps(..., indent=1, sort_keys=True)) and check the export against the change"
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_harbor_accepts_every_case(trajectory, name):
    validated = validate(trajectory, CASES[name]())
    assert validated.schema_version == "ATIF-v1.7"


def test_harbor_accepts_a_stream_cut_over_real_http_that_the_rollout_carried_on_from(trajectory):
    validated = validate(trajectory, run(cut_stream_then_carry_on))
    cut = next(s for s in validated.steps if s.llm_call_count == 1)
    assert cut.extra["status"] != "ok"
    assert cut.observation.results[0].source_call_id == cut.tool_calls[0].tool_call_id


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_harbor_refuses_what_the_check_refuses(trajectory, name):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        trajectory.model_validate(broken_document(name))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_harbor_accepts_every_generated_trace(trajectory, trace):
    if trace.calls:
        validated = validate(trajectory, trace)
        assert [s.extra["call_id"] for s in validated.steps if s.llm_call_count == 1] == [
            c.call_id for c in trace.calls
        ]
