"""`weighted`: parts by registered name, each recorded; bad part configs reported with their key path."""

from __future__ import annotations

import pytest

from osmosis_core import ConfigError, PolicyError
from osmosis_core.plugin import apply_config_table
from osmosis_core.testing import Fault, ScriptedPolicyServer
from osmosis_graders import WeightedConfig, WeightedGrader, WeightedPart

FORMAT = WeightedPart(
    grader="regex", weight=0.1, name="format", config={"pattern": r"^####\s*\S+\s*$", "multiline": True}
)


def test_a_format_part_and_a_correctness_part(grade):
    grader = WeightedGrader(
        WeightedConfig(
            parts=[FORMAT, WeightedPart(grader="exact-match", weight=0.9, config={"extract": ["hash", "last-number"]})]
        )
    )
    reward, sample = grade(grader, "work\n#### 1,000", "1000")
    assert reward == pytest.approx(1.0)
    assert sample.metrics["weighted.format"] == 1.0
    assert sample.metrics["weighted.exact-match"] == 1.0
    assert sample.metrics["format.matched"] == "#### 1,000"
    assert sample.metrics["exact-match.extracted"] == "1,000"
    assert sample.metrics["exact-match.extractor"] == "hash"

    reward, sample = grade(grader, "it is 1000", "1000")  # right answer, wrong format
    assert reward == pytest.approx(0.9)
    assert sample.metrics["weighted.format"] == 0.0
    assert sample.metrics["format.reason"] == "no match"
    assert sample.reward is None  # the parts never set the real sample's reward; the backend does


def test_weights_that_add_up_to_one_give_exactly_one(grade):
    parts = [WeightedPart(grader="contains", weight=w, name=f"p{i}") for i, w in enumerate((0.7, 0.2, 0.1))]
    assert 0.7 + 0.2 + 0.1 != 1.0
    assert grade(WeightedGrader(WeightedConfig(parts=parts)), "paris", "paris")[0] == 1.0


def test_normalised_and_negative_weights(grade):
    grader = WeightedGrader(
        WeightedConfig(
            parts=[
                WeightedPart(grader="exact-match", weight=3.0),
                WeightedPart(grader="contains", weight=1.0, name="mentions"),
            ],
            normalize=True,
        )
    )
    assert grade(grader, "Paris", "paris")[0] == pytest.approx(1.0)
    assert grade(grader, "I say Paris", "paris")[0] == pytest.approx(0.25)
    hedge = WeightedPart(grader="regex", weight=-0.5, name="hedge", config={"pattern": r"\bmaybe\b"})
    penalty = WeightedGrader(WeightedConfig(parts=[WeightedPart(grader="numeric"), hedge]))
    assert grade(penalty, "maybe 4", "4")[0] == pytest.approx(0.5)
    assert grade(penalty, "maybe 5", "4")[0] == pytest.approx(-0.5)


def test_a_part_by_import_path_and_a_nested_weighted(grade):
    inner = {"parts": [{"grader": "numeric", "weight": 1.0, "config": {"abs_tol": 0.5}}]}
    grader = WeightedGrader(
        WeightedConfig(
            parts=[
                WeightedPart(grader="osmosis_graders.exact:ExactMatchGrader", weight=0.5, name="exact"),
                WeightedPart(grader="weighted", weight=0.5, name="inner", config=inner),
            ]
        )
    )
    reward, sample = grade(grader, "#### 3.2", "3")
    assert reward == pytest.approx(0.5)
    assert sample.metrics["weighted.exact"] == 0.0
    assert sample.metrics["weighted.inner"] == 1.0
    assert sample.metrics["inner.numeric"] == 1.0  # the nested one's parts, under its name


def test_a_failing_part_fails_the_grading_with_its_own_category(grade):
    with ScriptedPolicyServer() as judge:
        judge.inject(Fault("status", status=503))
        grader = WeightedGrader(
            WeightedConfig(
                parts=[
                    FORMAT,
                    WeightedPart(grader="llm-judge", weight=0.9, config={"base_url": judge.url, "model": "j"}),
                ]
            )
        )
        with pytest.raises(PolicyError, match="answered 503"):
            grade(grader, "#### 1", "1")


def test_weighted_with_no_parts_fails_the_grading(grade):
    with pytest.raises(ValueError, match="weighted has no parts"):
        grade(WeightedGrader(), "x", "y")


BAD = [
    (
        {"parts": [{"grader": "llm-judge"}]},  # a judge part must name its own endpoint: never the policy's
        "the judge's endpoint is required (it is never the policy's) "
        "@ $.rollout.grader_config.parts[0].config.base_url",
    ),
    (
        {"parts": [{"grader": "exact-match"}, {"grader": "numeric", "config": {"abs_tol": -1.0}}]},
        "must be a finite number >= 0, got -1.0 @ $.rollout.grader_config.parts[1].config.abs_tol",
    ),
    (
        {"parts": [{"grader": "numeric", "config": {"abs_tol": "small"}}]},
        "expected a number, got 'small' @ $.rollout.grader_config.parts[0].config.abs_tol",
    ),
    (
        {"parts": [{"grader": "exact-match", "config": {"tolerence": 1}}]},
        "unknown key 'tolerence' (ExactMatchConfig has no such field) "
        "@ $.rollout.grader_config.parts[0].config.tolerence",
    ),
    (
        {"parts": [{"grader": "math", "config": {"extract": "boxd"}}]},
        "unknown extractor 'boxd' (known: hash, boxed, answer-line, last-number, json, tag, final) "
        "@ $.rollout.grader_config.parts[0].config.extract",
    ),
    ({"parts": [{"grader": "exact-match"}, {"grader": "nope"}]}, "unknown grader 'nope'; known graders: "),
    ({"parts": [{"grader": "nope"}]}, "@ $.rollout.grader_config.parts[0].grader"),
    ({"parts": [{"weight": 1}]}, "required: a registered grader's name @ $.rollout.grader_config.parts[0].grader"),
    (
        {"parts": [{"grader": "regex", "weight": "heavy"}]},
        "expected a number, got 'heavy' @ $.rollout.grader_config.parts[0].weight",
    ),
    (
        {"parts": [{"grader": "regex", "wieght": 1}]},
        "unknown key(s) wieght (a part has grader, weight, config, name) @ $.rollout.grader_config.parts[0]",
    ),
    (
        {"parts": ["exact-match"]},
        "expected a table (grader, weight, config), got 'exact-match' @ $.rollout.grader_config.parts[0]",
    ),
    (
        {"parts": "exact-match"},
        "expected an array of tables ([[rollout.grader_config.parts]]), got 'exact-match' "
        "@ $.rollout.grader_config.parts",
    ),
    (
        {"parts": [{"grader": "regex", "config": "x"}]},
        "expected a table, got 'x' @ $.rollout.grader_config.parts[0].config",
    ),
    (
        {"parts": [{"grader": "regex"}, {"grader": "regex"}]},
        "the part name 'regex' is taken by parts[0]; give each part a distinct name "
        "@ $.rollout.grader_config.parts[1].name",
    ),
    (
        {"parts": [{"grader": "regex", "weight": float("nan")}]},
        "must be a finite number, got nan @ $.rollout.grader_config.parts[0].weight",
    ),
    (
        {
            "parts": [
                {
                    "grader": "weighted",
                    "config": {
                        "parts": [{"grader": "exact-match"}, {"grader": "numeric", "config": {"rel_tol": -2.0}}]
                    },
                }
            ]
        },
        "@ $.rollout.grader_config.parts[0].config.parts[1].config.rel_tol",
    ),
    (
        {"parts": [{"grader": "regex", "weight": 0}], "normalize": True},
        "the weights sum to 0, so they cannot be normalised @ $.rollout.grader_config.normalize",
    ),
]


@pytest.mark.parametrize(("table", "message"), BAD)
def test_a_bad_part_is_reported_with_its_full_key_path(table, message):
    with pytest.raises(ConfigError) as caught:
        apply_config_table(WeightedConfig(), table, "$.rollout.grader_config", "run.toml")
    (problem,) = caught.value.problems
    assert message in problem, problem


def test_several_bad_parts_are_all_reported():
    table = {"parts": [{"grader": "nope"}, {"grader": "numeric", "config": {"abs_tol": -1.0}}]}
    with pytest.raises(ConfigError) as caught:
        apply_config_table(WeightedConfig(), table, "$.rollout.grader_config", "run.toml")
    (problem,) = caught.value.problems
    assert "parts[0].grader" in problem
    assert "parts[1].config.abs_tol" in problem


def test_the_config_is_built_once_and_copied_per_rollout():
    config = apply_config_table(
        WeightedConfig(), {"parts": [{"grader": "numeric", "weight": 2, "config": {"abs_tol": 0.5}}]}, "$.r", "run.toml"
    )
    [part] = config.resolved
    assert part.name == "numeric"
    assert part.weight == 2.0
    assert part.config.abs_tol == 0.5
    assert part.config.metrics_prefix == "numeric"
