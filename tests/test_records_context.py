"""Records, the error classifier, redaction, and the ambient RolloutContext."""

from __future__ import annotations

import asyncio
import math

import anyio
import pytest

from osmosis_core import (
    ErrorCategory,
    ErrorInfo,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    PolicyEndpoint,
    PolicyError,
    RolloutContext,
    RolloutSample,
    classify_exception,
    current_rollout_context,
    get_rollout_context,
)
from osmosis_core.errors import InfraError, error_info, redact

POLICY = PolicyEndpoint("http://127.0.0.1:8000/v1", "m", api_key="sk-topsecret")


def test_reward_is_a_finite_float():
    s = RolloutSample()
    s.reward = 1
    assert s.reward == 1.0
    assert isinstance(s.reward, float)
    for bad in (math.nan, math.inf, "1", True):
        with pytest.raises((TypeError, ValueError)):
            s.reward = bad


def test_a_failure_needs_an_error():
    with pytest.raises(ValueError, match="needs an error"):
        ExecutionResult("r", ExecutionStage.WORKFLOW, ExecutionStatus.FAILURE)
    ok = ExecutionResult("r", ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS)
    assert ok.ok
    assert ok.reward is None


def test_api_key_is_not_in_repr():
    assert "sk-topsecret" not in repr(POLICY)
    assert POLICY.chat_completions_url == "http://127.0.0.1:8000/v1/chat/completions"


@pytest.mark.parametrize(
    ("exc", "category"),
    [
        (TimeoutError(), ErrorCategory.TIMEOUT),
        (ValueError(), ErrorCategory.VALIDATION_ERROR),
        (TypeError(), ErrorCategory.VALIDATION_ERROR),
        (AssertionError(), ErrorCategory.VALIDATION_ERROR),
        (RuntimeError(), ErrorCategory.AGENT_ERROR),
        (PolicyError("down"), ErrorCategory.POLICY_ERROR),
        (InfraError("sandbox"), ErrorCategory.INFRA_ERROR),
    ],
)
def test_classifier(exc, category):
    assert classify_exception(exc) is category


def test_http_client_errors_are_policy_errors_even_when_wrapped():
    import httpx

    exc = httpx.ConnectError("refused")
    assert classify_exception(exc) is ErrorCategory.POLICY_ERROR

    def give_up() -> None:
        try:
            raise httpx.ReadTimeout("slow")
        except httpx.ReadTimeout as inner:
            raise RuntimeError("agent gave up") from inner

    with pytest.raises(RuntimeError) as outer:
        give_up()
    assert classify_exception(outer.value) is ErrorCategory.POLICY_ERROR


def test_error_info_is_one_line_and_redacted():
    info = error_info(RuntimeError("bad key sk-topsecret\nsecond line"), secrets=["sk-topsecret"])
    assert "\n" not in info.message
    assert "sk-topsecret" not in info.message
    assert "***" in info.message
    assert info.message.startswith("RuntimeError: ")
    assert str(info).startswith("agent_error: ")
    assert redact("abc", ["ab"]) == "abc"  # too short to be a secret: left alone


def test_context_is_ambient_and_nesting_restores_the_outer_one():
    assert current_rollout_context() is None
    with pytest.raises(RuntimeError, match="no active rollout"):
        get_rollout_context()
    with RolloutContext("outer", POLICY) as outer:
        with RolloutContext("inner", POLICY):
            assert get_rollout_context().rollout_id == "inner"
        assert get_rollout_context() is outer
    assert current_rollout_context() is None


def test_context_follows_tasks_and_threads():
    async def main():
        seen = []
        with RolloutContext("r-7", POLICY):

            async def child():
                seen.append(get_rollout_context().rollout_id)

            await asyncio.gather(child(), child())
            seen.append(await anyio.to_thread.run_sync(lambda: get_rollout_context().rollout_id))
        return seen

    assert anyio.run(main) == ["r-7", "r-7", "r-7"]


def test_one_sample_source_per_rollout_and_headers():
    ctx = RolloutContext("r-1", PolicyEndpoint("http://x/v1", "m", api_key="k-1234", headers={"X-A": "1"}))

    async def source():
        return RolloutSample(messages=[{"role": "assistant", "content": "hi"}])

    ctx.set_sample_source(source)
    with pytest.raises(ValueError, match="already has a sample source"):
        ctx.set_sample_source(source)
    sample = anyio.run(ctx.get_sample)
    assert sample.last_text() == "hi"
    assert ctx.headers() == {"X-A": "1", "X-Osmosis-Rollout-Id": "r-1", "Authorization": "Bearer k-1234"}


def test_entering_the_same_context_twice_is_refused():
    ctx = RolloutContext("r", POLICY)
    with ctx, pytest.raises(RuntimeError, match="already active"), ctx:
        pass


def test_last_text_flattens_content_parts():
    s = RolloutSample(messages=[{"role": "assistant", "content": [{"text": "a"}, {"type": "text", "text": "b"}]}])
    assert s.last_text() == "ab"
    s.chat_messages = [{"role": "assistant", "content": "chat"}]
    assert s.last_text() == "chat"
    assert ErrorInfo(ErrorCategory.TIMEOUT, "x").category.value == "timeout"


def test_a_non_finite_metric_crosses_every_format_as_a_string_and_the_grader_metrics_are_told_apart():
    import pickle

    from osmosis_core.wire import grader_metrics, nonfinite_paths, result_line, result_to_json

    sample = RolloutSample(messages=[], reward=1.0, metrics={"acc": math.nan, "steps": [1.0, -math.inf], "n": 2})
    graded = ExecutionResult("r", ExecutionStage.GRADER, ExecutionStatus.SUCCESS, sample=sample)
    assert result_to_json(graded)["sample"]["metrics"] == {"acc": "NaN", "steps": [1.0, "-Infinity"], "n": 2}
    assert math.isnan(sample.metrics["acc"])  # the sample itself is left as it is
    assert nonfinite_paths(sample.metrics, "metrics") == [
        ("metrics.acc", sample.metrics["acc"]),
        ("metrics.steps[1]", -math.inf),
    ]
    # the workflow's metrics as a worker process sends them (other objects, the same NaN): not the grader's
    before = pickle.loads(pickle.dumps({"acc": math.nan, "steps": [1.0, -math.inf]}))
    sample.metrics["score"] = 0.5
    assert grader_metrics(graded, before) == ["n", "score"]
    assert result_line(0, 0, graded, workflow_metrics=before)["grader_metrics"] == ["n", "score"]
    assert "grader_metrics" not in result_line(0, 0, graded)  # not known: not said
