"""`llm-judge` against a real HTTP judge (the scripted server on 127.0.0.1), well-formed and not."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import pytest

from osmosis_core import AgentWorkflow, ConfigError, GraderContext, PolicyError, RolloutSample, chat_completion
from osmosis_core.http import http_scope
from osmosis_core.plugin import apply_config_table
from osmosis_core.testing import Fault, Reply, ScriptedPolicyServer, run_rollout_sync
from osmosis_graders import JudgeConfig, LLMJudgeGrader, parse_judgement

KEY = "sk-judge-secret-0123456789"


def judge_with(score: Any = 8, reason: str = "close enough"):
    def script(request: dict[str, Any]) -> Reply:
        return Reply(content=json.dumps({"reason": reason, "score": score}))

    return script


def config(server: ScriptedPolicyServer, **more: Any) -> JudgeConfig:
    return JudgeConfig(base_url=server.url, model="judge-1", api_key_env="JUDGE_API_KEY", **more)


@pytest.fixture(autouse=True)
def judge_key(monkeypatch):
    monkeypatch.setenv("JUDGE_API_KEY", KEY)


def test_a_well_formed_judgement_is_scaled_to_0_1(grade):
    seen: list[dict[str, Any]] = []

    def script(request: dict[str, Any]) -> Reply:
        seen.append(request)
        return Reply(content='{"reason": "right value", "score": 8}')

    with ScriptedPolicyServer(script, api_key=KEY) as server:
        reward, sample = grade(LLMJudgeGrader(config(server)), "It is 42.", "42", prompt="What is 6 x 7?")
        [logged] = server.requests
    assert reward == pytest.approx(0.8)
    assert sample.metrics["llm-judge.raw_scores"] == [8]
    assert sample.metrics["llm-judge.judge_reason"] == "right value"
    assert sample.metrics["llm-judge.extracted"] == "It is 42."
    assert logged.authorized
    assert logged.status == 200
    [request] = seen
    assert request["model"] == "judge-1"
    assert request["temperature"] == 0.0
    assert request["response_format"]["type"] == "json_schema"
    rubric = request["messages"][-1]["content"]
    assert "What is 6 x 7?" in rubric
    assert "It is 42." in rubric
    assert "\n42\n" in rubric
    assert "from 0 (wrong) to 10" in rubric


def test_a_custom_rubric_sees_the_conversation_and_a_system_prompt(grade):
    seen: list[dict[str, Any]] = []

    def script(request: dict[str, Any]) -> Reply:
        seen.append(request)
        return Reply(content='```json\n{"score": 1}\n```')

    rubric = "Conversation:\n{{conversation}}\nLabel: {{ label }}. Score {{min_score}}-{{max_score}} as JSON."
    with ScriptedPolicyServer(script, api_key=KEY) as server:
        grader = LLMJudgeGrader(
            config(server, rubric=rubric, system_prompt="Be strict.", min_score=0, max_score=1, response_format="none")
        )
        reward, _ = grade(grader, "#### 7", "7", prompt="3 + 4?")
    assert reward == 1.0
    messages = seen[0]["messages"]
    assert messages[0] == {"role": "system", "content": "Be strict."}
    assert messages[1]["content"] == "Conversation:\nuser: 3 + 4?\n\nassistant: #### 7\nLabel: 7. Score 0-1 as JSON."
    assert "response_format" not in seen[0]


@pytest.mark.parametrize(
    ("scores", "aggregate", "reward"),
    [([2, 8, 8], "mean", 0.6), ([2, 8, 8], "majority", 0.8), ([2, 8], "majority", 0.2), ([10, 10, 4], "mean", 0.8)],
)
def test_n_judges_mean_or_majority(grade, scores, aggregate, reward):
    answers = itertools.cycle(scores)

    def script(request: dict[str, Any]) -> Reply:
        return Reply(content=json.dumps({"reason": "r", "score": next(answers)}))

    with ScriptedPolicyServer(script, api_key=KEY) as server:
        got, sample = grade(LLMJudgeGrader(config(server, n=len(scores), aggregate=aggregate)), "x", "y")
        assert len(server.requests) == len(scores)
    assert got == pytest.approx(reward)
    assert sorted(sample.metrics["llm-judge.raw_scores"]) == sorted(scores)


BAD_JUDGEMENTS = [
    ("I'd give it an 8.", "the judgement is not JSON"),
    ('{"reason": "ok"}', "the judgement is not a JSON object with a score"),
    ('{"score": "8"}', "the judgement's score is not a number: '8'"),
    ('{"score": true}', "the judgement's score is not a number: True"),
    ('{"score": 11}', "the judgement's score 11 is outside [0, 10]"),
    ('{"score": -1}', "the judgement's score -1 is outside [0, 10]"),
    ("[8]", "the judgement is not a JSON object with a score"),
    ('{"score": 8} and more', "the judgement is not JSON"),
    ("", "the judgement is not JSON"),
]


@pytest.mark.parametrize(("content", "message"), BAD_JUDGEMENTS)
def test_a_malformed_or_out_of_range_judgement_fails_the_grading_never_a_silent_zero(grade, content, message):
    with ScriptedPolicyServer(lambda request: Reply(content=content), api_key=KEY) as server:
        with pytest.raises(PolicyError) as caught:
            grade(LLMJudgeGrader(config(server)), "x", "y")
        assert len(server.requests) == 1  # no hidden retry
        url = server.url
    error = caught.value
    assert message in str(error)
    assert f"judge {url}/chat/completions (model judge-1) answered 200" in str(error)
    assert error.status == 200
    assert error.endpoint == f"{url}/chat/completions"


@pytest.mark.parametrize(
    ("fault", "status", "message"),
    [
        (Fault("status", status=503, message="overloaded"), 503, "answered 503: overloaded"),
        (Fault("status", status=401, message="bad key"), 401, "answered 401: bad key"),
        (Fault("html"), 200, "sent a malformed completion (JSONDecodeError): <!DOCTYPE html>"),
        (Fault("truncate"), 200, "sent a malformed completion"),
        (Fault("drop"), None, "failed: ServerDisconnectedError"),
    ],
)
def test_a_failing_judge_is_a_policy_error_naming_the_endpoint_and_status(grade, fault, status, message):
    with ScriptedPolicyServer(judge_with(), api_key=KEY) as server:
        server.inject(fault)
        with pytest.raises(PolicyError) as caught:
            grade(LLMJudgeGrader(config(server)), "x", "y")
        assert len(server.requests) == 1  # one POST, never re-sent
        url = server.url
    assert message in str(caught.value)
    assert url in str(caught.value)
    assert caught.value.status == status


def test_an_unreachable_judge(grade):
    with ScriptedPolicyServer(judge_with()) as server:
        url = server.url
    with pytest.raises(
        PolicyError, match=rf"judge {url}/chat/completions \(model judge-1\) failed: ClientConnectorError"
    ):
        grade(LLMJudgeGrader(JudgeConfig(base_url=url, model="judge-1")), "x", "y")


def test_the_key_never_appears_in_an_error_even_when_the_judge_echoes_it(grade):
    with ScriptedPolicyServer(lambda request: Reply(content=f"my key is {KEY}"), api_key=KEY) as server:
        with pytest.raises(PolicyError) as caught:
            grade(LLMJudgeGrader(config(server)), "x", "y")
        host = server.url.removeprefix("http://")
        with pytest.raises(PolicyError) as with_password:  # credentials in the URL are not shown either
            grade(LLMJudgeGrader(JudgeConfig(base_url=f"http://user:{KEY}@{host}", model="m")), "x", "y")
    assert KEY not in str(caught.value)
    assert "***" in str(caught.value)
    assert KEY not in str(with_password.value)
    assert "user" not in str(with_password.value)


def test_the_judge_s_own_concurrency_limit(grade):
    with ScriptedPolicyServer(judge_with(), latency=0.3) as server:

        def timed(limit: int) -> float:
            started = time.perf_counter()
            grade(
                LLMJudgeGrader(JudgeConfig(base_url=server.url, model="m", n=4, max_concurrent_requests=limit)),
                "x",
                "y",
            )
            return time.perf_counter() - started

        assert timed(2) >= 0.6  # 4 requests, 2 at a time: two waves of 0.3 s
        assert timed(4) < 0.55  # all at once: one wave


def test_many_gradings_share_the_limit_of_one_loop():
    with ScriptedPolicyServer(judge_with(), latency=0.2) as server:
        grader_config = JudgeConfig(base_url=server.url, model="m", max_concurrent_requests=3)

        async def main() -> float:
            async with http_scope():
                samples = [RolloutSample(messages=[{"role": "assistant", "content": "x"}]) for _ in range(6)]
                started = time.perf_counter()
                await asyncio.gather(
                    *(
                        LLMJudgeGrader(grader_config).grade(GraderContext(s, "y", [], {}, grader_config))
                        for s in samples
                    )
                )
                return time.perf_counter() - started

        assert asyncio.run(main()) >= 0.4  # 6 gradings, 3 requests at a time


# -- configs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "message", "path"),
    [
        ({"model": "m"}, "the judge's endpoint is required (it is never the policy's)", "base_url"),
        ({"rubric": "{{answer}}"}, "the judge's endpoint is required (it is never the policy's)", "base_url"),
        ({"n": 3, "model": "m"}, "the judge's endpoint is required (it is never the policy's)", "base_url"),
        ({"base_url": "http://127.0.0.1:9/v1"}, "the judge model's name is required", "model"),
        ({"base_url": "ftp://x", "model": "m"}, "must be an http(s) URL", "base_url"),
        (
            {"base_url": "http://h/v1", "model": "m", "api_key_env": "sk-123"},
            "must name an environment variable",
            "api_key_env",
        ),
        ({"rubric": "{{question}} {{answer}}"}, "unknown placeholder(s) question", "rubric"),
        ({"min_score": 5, "max_score": 5}, "must be above min_score (5)", "max_score"),
        ({"aggregate": "median"}, "must be one of mean, majority", "aggregate"),
        ({"n": 0}, "must be a whole number >= 1", "n"),
        ({"response_format": "xml"}, "must be one of json_schema, json_object, none", "response_format"),
        ({"params": {"model": "other"}}, "may not set model", "params"),
    ],
)
def test_a_bad_judge_config_is_refused_with_its_key_path(table, message, path):
    with pytest.raises(ConfigError) as caught:
        apply_config_table(JudgeConfig(), table, "$.rollout.grader_config", "run.toml")
    (problem,) = caught.value.problems
    assert message in problem, problem
    assert f"@ $.rollout.grader_config.{path}" in problem, problem


def test_an_unconfigured_judge_or_a_missing_key_fails_the_grading_without_a_request(grade, monkeypatch):
    with pytest.raises(ValueError, match="llm-judge needs base_url and model"):
        grade(LLMJudgeGrader(), "x", "y")
    monkeypatch.delenv("JUDGE_API_KEY")
    with ScriptedPolicyServer(judge_with()) as server:
        with pytest.raises(ValueError, match="the environment variable JUDGE_API_KEY \\(api_key_env\\) is not set"):
            grade(LLMJudgeGrader(config(server)), "x", "y")
        assert server.requests == []


def test_parse_judgement_accepts_a_think_block_and_one_fence():
    assert parse_judgement('<think>8? 9?</think>\n{"score": 9, "reason": "r"}', 0, 10) == (9, "r")
    assert parse_judgement('```json\n{"score": 0.5}\n```', 0, 1) == (0.5, None)


# -- through a rollout: the judge's endpoint, never the policy's --------------------------------------


class Ask(AgentWorkflow):
    async def run(self, ctx):
        return [*ctx.prompt, await chat_completion(ctx.prompt)]


def test_a_rollout_judged_end_to_end_never_calls_the_policy_for_the_judgement():
    with ScriptedPolicyServer() as policy, ScriptedPolicyServer(judge_with(score=10), api_key=KEY) as judge:
        grader_config = config(judge)
        outcome = run_rollout_sync(
            Ask, LLMJudgeGrader, policy=policy, user_prompt="3 * 4", label="12", grader_config=grader_config
        )
        assert outcome.error is None
        assert outcome.reward == 1.0
        assert len(policy.requests) == 1
        assert len(judge.requests) == 1
        assert "The product is 12" in judge.requests[0].body["messages"][-1]["content"]

        judge.inject(Fault("status", status=503))
        failed = run_rollout_sync(
            Ask, LLMJudgeGrader, policy=policy, user_prompt="3 * 4", label="12", grader_config=grader_config
        )
        judge_url = judge.url
    assert failed.workflow.ok
    assert failed.grader is not None
    assert not failed.grader.ok
    assert failed.error.category == "policy_error"
    assert f"judge {judge_url}/chat/completions (model judge-1) answered 503" in failed.error.message
    assert KEY not in failed.error.message
    assert len(policy.requests) == 2  # one per rollout, none for a judgement


def test_one_failing_judgement_of_n_fails_the_grading(grade):
    with ScriptedPolicyServer(judge_with(), api_key=KEY) as server:
        server.inject(Fault("status", status=500, message="boom"))
        with pytest.raises(PolicyError, match="answered 500: boom"):
            grade(LLMJudgeGrader(config(server, n=3)), "x", "y")
