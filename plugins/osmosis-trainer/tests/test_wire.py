"""The client's records on the wire: a request's body (with the trainer's sampling settings and
policy version), a result document read back, and the enums that must behave as osmosis-core's."""

from __future__ import annotations

import json

import pytest

from osmosis_trainer import (
    ErrorCategory,
    ErrorInfo,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    SamplingParams,
)
from osmosis_trainer.sampling import SAMPLING_FIELDS


def _request(**more) -> RolloutRequest:
    return RolloutRequest(
        rollout_id="r1",
        initial_messages=[{"role": "user", "content": "hi"}],
        chat_completions_url="http://h/v1",
        **more,
    )


REFERENCE_FIELDS = [
    "rollout_id",
    "initial_messages",
    "chat_completions_url",
    "llm_api_key",
    "label",
    "metadata",
    "grade",
    "agent_timeout_sec",
    "grader_timeout_sec",
    "extra_fields",
]


def test_a_request_without_the_new_settings_sends_what_an_older_server_always_read():
    body = _request().to_json()
    assert list(body) == REFERENCE_FIELDS
    assert list(_request(sampling_params=SamplingParams()).to_json()) == REFERENCE_FIELDS  # nothing set: not sent


def test_sampling_params_and_policy_version_go_on_the_wire_when_set():
    every = {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 50,
        "min_p": 0.05,
        "max_tokens": 512,
        "stop": ["</answer>", "\n\n"],
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
    }
    assert list(every) == list(SAMPLING_FIELDS)
    request = _request(sampling_params=every, policy_version="step-12")  # a JSON object is read and checked
    assert isinstance(request.sampling_params, SamplingParams)
    body = json.loads(json.dumps(request.to_json()))
    assert body["sampling_params"] == every
    assert body["policy_version"] == "step-12"
    assert _request(sampling_params=SamplingParams(temperature=0.0)).to_json()["sampling_params"] == {
        "temperature": 0.0
    }  # a 0 is a setting, not an absence


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"temperature": -0.1}, "sampling_params.temperature must be >= 0"),
        ({"top_p": 0}, r"sampling_params.top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"sampling_params.top_p must be in \(0, 1\]"),
        ({"min_p": 2}, r"sampling_params.min_p must be in \[0, 1\]"),
        ({"top_k": -2}, "sampling_params.top_k must be -1, 0"),
        ({"top_k": 2.5}, "sampling_params.top_k must be an integer, got float"),
        ({"max_tokens": 0}, "sampling_params.max_tokens must be >= 1"),
        ({"max_tokens": True}, "sampling_params.max_tokens must be an integer, got bool"),
        ({"temperature": "hot"}, "sampling_params.temperature must be a number, got str"),
        ({"temperature": float("nan")}, "sampling_params.temperature must be finite"),
        ({"presence_penalty": 3}, r"sampling_params.presence_penalty must be in \[-2, 2\]"),
        ({"repetition_penalty": 0}, "sampling_params.repetition_penalty must be > 0"),
        ({"stop": [1]}, "sampling_params.stop must be a string or a list of strings"),
        ({"seed": "7"}, "sampling_params.seed must be an integer"),
        ({"seed": 2**63}, "sampling_params.seed must fit in 64 bits"),
        ({"temprature": 1.0}, "sampling_params.temprature: not a sampling setting"),
    ],
)
def test_a_bad_sampling_setting_is_refused_before_it_is_sent_naming_it(given, message):
    with pytest.raises((ValueError, TypeError), match=message):
        _request(sampling_params=given)


def test_policy_version_must_be_a_string_the_server_takes():
    with pytest.raises(TypeError, match="policy_version must be a string, got int"):
        _request(policy_version=3)
    for bad in ("", "v" * 257):  # osmosis serve answers 422: refused before it is sent, not mid-batch
        with pytest.raises(ValueError, match="policy_version must be None or a string of 1 to 256 characters"):
            _request(policy_version=bad)
    assert _request(policy_version="v" * 256).policy_version == "v" * 256


def test_the_key_of_a_request_is_kept_out_of_its_repr():
    request = _request(llm_api_key="sk-secret-0123456789", callback_api_key="cb-secret-0123456789")
    assert "secret" not in repr(request)


def test_a_result_of_osmosis_serve_reads_back_with_its_sample_error_and_trace():
    trace = {"rollout_id": "r1", "capture": "tokens", "calls": [], "complete": True, "incomplete_reason": None}
    result = RolloutResult.from_json(
        {
            "rollout_id": "r1",
            "status": "success",
            "sample": {"messages": [{"role": "assistant", "content": "#### 42"}], "reward": 1, "remove_sample": False},
            "reward": 1,
            "error": None,
            "stage": "grader",
            "timings": {"workflow": 0.5},
            "trace": trace,
        }
    )
    assert result.ok
    assert result.final
    assert result.reward == 1.0
    assert result.sample is not None
    assert result.sample.reward == 1.0
    assert result.trace == trace
    failed = RolloutResult.from_json(
        {"rollout_id": "r2", "status": "failure", "error": {"category": "timeout", "message": "past 300s"}}
    )
    assert failed.error == ErrorInfo(ErrorCategory.TIMEOUT, "past 300s")
    assert not failed.ok


@pytest.mark.parametrize(
    ("err_category", "category"),
    [
        ("timeout", "timeout"),
        ("http_error", "policy_error"),
        ("internal_error", "infra_error"),
        ("lease_expired", "cancelled"),
        ("something_new", "agent_error"),
    ],
)
def test_a_reference_servers_categories_are_mapped_to_osmosis_ones(err_category, category):
    result = RolloutResult.from_json(
        {"rollout_id": "r", "status": "failure", "err_category": err_category, "err_message": "boom"}
    )
    assert result.error is not None
    assert result.error.category == category
    assert result.err_category == err_category


@pytest.mark.parametrize(
    ("data", "message"),
    [([], "no rollout_id"), ({"status": "success"}, "no rollout_id"), ({"rollout_id": "r", "status": "done"}, "done")],
)
def test_what_is_not_a_result_is_refused(data, message):
    with pytest.raises(ValueError, match=message):
        RolloutResult.from_json(data)


def test_the_enums_are_strings_that_print_as_their_values_on_every_python():
    assert str(RolloutStatus.SUCCESS) == f"{RolloutStatus.SUCCESS}" == "success"
    assert json.dumps({"status": RolloutStatus.RUNNING, "category": ErrorCategory.TIMEOUT}) == (
        '{"status": "running", "category": "timeout"}'
    )
    assert ErrorCategory("infra_error") is ErrorCategory.INFRA_ERROR
    assert str(ErrorInfo(ErrorCategory.CANCELLED, "stopped")) == "cancelled: stopped"
    assert {ErrorCategory.TIMEOUT: 1}["timeout"] == 1
    assert [s.value for s in RolloutStatus if s.final] == ["success", "failure", "cancelled"]
