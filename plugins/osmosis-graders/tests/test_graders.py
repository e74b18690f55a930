"""The answer graders (exact-match, numeric, regex, contains, json-match, math's fast path), table-driven,
and their configs as a run config's [rollout.grader_config] table reads them."""

from __future__ import annotations

import pytest

from osmosis_core import ConfigError
from osmosis_core.plugin import apply_config_table
from osmosis_graders import (
    ContainsConfig,
    ContainsGrader,
    ExactMatchConfig,
    ExactMatchGrader,
    JsonMatchConfig,
    JsonMatchGrader,
    MathConfig,
    MathGrader,
    NumericConfig,
    NumericGrader,
    RegexConfig,
    RegexGrader,
)

EXACT = [
    # (config, reply, label, reward)
    ({}, "#### 1,000.", "1000", 1.0),
    ({}, "#### 1000.0", "1,000", 1.0),
    ({}, "#### −12", "-12", 1.0),
    ({}, "#### $18", "18", 1.0),
    ({}, "#### 18 dollars", "18", 0.0),
    ({}, "#### 0.5", "1/2", 0.0),  # a fraction stays a fraction: use numeric or math for values
    ({}, r"The result: \boxed{\text{Paris}}", "paris", 1.0),
    ({}, "Answer: (B)", "B", 1.0),
    ({}, "  Paris. ", "paris", 1.0),
    ({}, "Paris", ["Lyon", "Paris"], 1.0),  # a list label: any accepted answer
    ({}, "Paris", ["Lyon", "Nice"], 0.0),
    ({"case_sensitive": True}, "paris", "Paris", 0.0),
    ({"punctuation": "all", "articles": True}, "The Eiffel Tower!", "eiffel tower", 1.0),
    ({"extract": "hash"}, "no marker, just 42", "42", 0.0),
    ({"extract": ["hash", "last-number"]}, "no marker, just 42.", "42", 1.0),
    ({"label_extract": "hash"}, "#### 72", "She sold 48/2 = 24 clips...\n#### 72", 1.0),  # GSM8K's raw label
    ({}, "", "42", 0.0),
]


@pytest.mark.parametrize(("config", "reply", "label", "reward"), EXACT)
def test_exact_match(grade, config, reply, label, reward):
    assert grade(ExactMatchGrader(ExactMatchConfig(**config)), reply, label)[0] == reward


def test_exact_match_records_what_it_extracted_and_why(grade):
    reward, sample = grade(ExactMatchGrader(), "#### 1,000.", "999")
    assert reward == 0.0
    assert sample.metrics == {
        "exact-match.extracted": "1,000.",
        "exact-match.extractor": "hash",
        "exact-match.score": 0.0,
        "exact-match.reason": "not equal",
        "exact-match.normalized": "1000",
    }
    reward, sample = grade(ExactMatchGrader(ExactMatchConfig(metrics_prefix="gsm8k")), "", "1")
    assert sample.metrics == {
        "gsm8k.extracted": None,
        "gsm8k.extractor": None,
        "gsm8k.score": 0.0,
        "gsm8k.reason": "empty reply",
    }
    _reward, sample = grade(ExactMatchGrader(ExactMatchConfig(extract="boxed")), "no box", "1")
    assert sample.metrics["exact-match.reason"] == "no answer found (tried boxed)"


def test_a_label_that_label_extract_cannot_read_fails_the_grading(grade):
    with pytest.raises(ValueError, match=r"no answer in the label 'seventy' \(label_extract: hash\)"):
        grade(ExactMatchGrader(ExactMatchConfig(label_extract="hash")), "#### 70", "seventy")


NUMERIC = [
    ({}, "#### 1,000.", "1000", 1.0),
    ({}, "#### 72 dollars", "72", 1.0),
    ({}, "#### −3.5", -3.5, 1.0),
    ({}, r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    ({}, "#### 0.5", "1/2", 1.0),
    ({}, "Answer: 50%", "50", 1.0),
    ({}, "the total is 17", 17, 1.0),
    ({}, "#### 17.0000001", "17", 1.0),  # within abs_tol 1e-6
    ({}, "#### 17.01", "17", 0.0),
    ({"rel_tol": 0.01}, "#### 101", "100", 1.0),
    ({"rel_tol": 0.01}, "#### 102", "100", 0.0),
    ({"abs_tol": 0.5}, "#### 2.4", "2", 1.0),
    ({}, "#### many", "3", 0.0),
    ({}, "#### 3", ["4", "3"], 1.0),
]


@pytest.mark.parametrize(("config", "reply", "label", "reward"), NUMERIC)
def test_numeric(grade, config, reply, label, reward):
    assert grade(NumericGrader(NumericConfig(**config)), reply, label)[0] == reward


def test_numeric_refuses_a_label_that_is_not_a_number(grade):
    with pytest.raises(ValueError, match="numeric: the label 'n/a' is not a number"):
        grade(NumericGrader(), "#### 3", "n/a")
    _reward, sample = grade(NumericGrader(), "#### many", "3")
    assert sample.metrics["numeric.reason"] == "the answer is not a number"


REGEX = [
    ({"pattern": r"^####\s*-?[\d,]+$", "multiline": True}, "work\n#### 1,000", "x", 1.0),
    ({"pattern": r"^####\s*-?[\d,]+$", "multiline": True}, "#### 1,000 dollars", "x", 0.0),
    (
        {"pattern": r"<think>.*?</think>\s*<answer>.*?</answer>", "fullmatch": True, "dotall": True},
        "<think>a\nb</think>\n<answer>4</answer>",
        "x",
        1.0,
    ),
    (
        {"pattern": r"<think>.*?</think>\s*<answer>.*?</answer>", "fullmatch": True, "dotall": True},
        "preamble <think>a</think><answer>4</answer>",
        "x",
        0.0,
    ),
    ({"pattern": r"####\s*{{label}}\s*$"}, "#### 3.5", "3.5", 1.0),  # the label is escaped: . is a dot
    ({"pattern": r"####\s*{{label}}\s*$"}, "#### 315", "3.5", 0.0),
    ({"pattern": "PARIS", "ignore_case": True}, "paris!", "x", 1.0),
    ({}, "order 66", r"\d+", 1.0),  # no pattern: the label is the pattern
]


@pytest.mark.parametrize(("config", "reply", "label", "reward"), REGEX)
def test_regex(grade, config, reply, label, reward):
    assert grade(RegexGrader(RegexConfig(**config)), reply, label)[0] == reward


CONTAINS = [
    ({}, "The total is 1,000 apples.", "1000", 1.0),
    ({}, "THE CAPITAL IS PARIS", "paris", 1.0),
    ({}, "the capital is Lyon", "paris", 0.0),
    ({"match": "all"}, "red, green and blue", ["red", "blue"], 1.0),
    ({"match": "all"}, "red and green", ["red", "blue"], 0.0),
    ({"match": "any"}, "red and green", ["red", "blue"], 1.0),
    ({"normalize": False}, "1,000", "1000", 0.0),
]


@pytest.mark.parametrize(("config", "reply", "label", "reward"), CONTAINS)
def test_contains(grade, config, reply, label, reward):
    assert grade(ContainsGrader(ContainsConfig(**config)), reply, label)[0] == reward


SCHEMA = {"type": "object", "required": ["name", "args"], "properties": {"args": {"type": "object"}}}
JSON = [
    ({}, '{"a": 1, "b": "Paris"}', {"a": 1.0, "b": "paris"}, 1.0),
    ({}, 'Sure! ```json\n{"a": 1, "b": "x", "extra": 2}\n```', {"a": 1, "b": "x"}, 1.0),
    ({}, '{"a": 2, "b": "x"}', {"a": 1, "b": "x"}, 0.0),
    ({"scoring": "fraction"}, '{"a": 2, "b": "x"}', {"a": 1, "b": "x"}, 0.5),
    ({}, '{"a": true}', {"a": 1}, 0.0),  # true is not 1
    ({}, '{"a": [1, 2]}', {"a": [2, 1]}, 0.0),
    ({"unordered_lists": True}, '{"a": [1, 2]}', {"a": [2, 1]}, 1.0),
    ({}, '{"a": 1}', '{"a": 1}', 1.0),  # a JSON-string label
    ({"fields": ["args.city"]}, '{"name": "w", "args": {"city": "Oslo", "x": 1}}', {"args": {"city": "oslo"}}, 1.0),
    ({"fields": "args.city"}, '{"name": "w", "args": {}}', {"args": {"city": "oslo"}}, 0.0),
    ({"schema": SCHEMA}, '{"name": "w", "args": {"city": "Oslo"}}', {"name": "w"}, 1.0),
    ({"schema": SCHEMA}, '{"name": "w", "args": "Oslo"}', {"name": "w"}, 0.0),
    ({"schema": SCHEMA}, '{"args": {}}', {}, 0.0),
    ({"schema": SCHEMA}, '{"name": "w", "args": {}}', {}, 1.0),  # an empty label: the schema is the test
    ({}, "no json here", {"a": 1}, 0.0),
    ({"extract": "tag"}, '<answer>{"a": 1}</answer>', {"a": 1}, 1.0),
    ({"extract": "json", "json_field": "result"}, '{"result": [1, "two"]}', [1, "Two"], 1.0),
]


@pytest.mark.parametrize(("config", "reply", "label", "reward"), JSON)
def test_json_match(grade, config, reply, label, reward):
    assert grade(JsonMatchGrader(JsonMatchConfig(**config)), reply, label)[0] == reward


def test_json_match_says_which_rule_failed(grade):
    _r, sample = grade(JsonMatchGrader(JsonMatchConfig(schema=SCHEMA)), '{"name": "w", "args": "Oslo"}', {})
    assert sample.metrics["json-match.reason"] == "schema: 'Oslo' is not of type 'object' (at args)"
    _r, sample = grade(JsonMatchGrader(JsonMatchConfig(scoring="fraction")), '{"a": 2, "b": "x"}', {"a": 1, "b": "x"})
    assert sample.metrics["json-match.reason"] == "fields differ: a"
    assert (sample.metrics["json-match.matched"], sample.metrics["json-match.fields"]) == (1, 2)
    with pytest.raises(ValueError, match="json-match: the label 'not json' is not JSON"):
        grade(JsonMatchGrader(), "{}", "not json")
    with pytest.raises(ValueError, match="the label has no field 'zz'"):
        grade(JsonMatchGrader(JsonMatchConfig(fields=["zz"])), '{"zz": 1}', {"a": 1})


MATH_FAST = [
    # decided on the loop, never reaching the CAS
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", 1.0),
    (r"\boxed{0.5}", "1/2", 1.0),
    (r"\boxed{-3}", "−3", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{0.333333}", "1/3", 1.0),
    (r"\boxed{4}", "5", 0.0),
    (r"\boxed{ \sqrt{2} }", r"\sqrt{2}", 1.0),  # identical after clean-up
    (r"Answer: 12", "12", 1.0),
    ("#### 1,000.", "1000", 1.0),
    (r"first \boxed{3} then \boxed{7}", "7", 1.0),
    ("no answer here", "7", 0.0),
]


@pytest.mark.parametrize(("reply", "label", "reward"), MATH_FAST)
def test_math_fast_path(grade, reply, label, reward):
    reward_, sample = grade(MathGrader(), reply, label)
    assert reward_ == reward
    if "math.path" in sample.metrics:
        assert sample.metrics["math.path"] == "fast"


def test_a_long_answer_never_reaches_the_cas(grade):
    reward, sample = grade(MathGrader(MathConfig(max_answer_chars=10)), r"\boxed{" + "x+" * 20 + "1}", "1")
    assert reward == 0.0
    assert sample.metrics["math.reason"] == "answer too large to parse (41 chars > limit 10, max_answer_chars)"
    assert sample.metrics["math.limit"] == "max_answer_chars"


def test_a_megabyte_boxed_answer_names_the_size_limit(grade):
    reply = r"\boxed{" + "1" * (1 << 20) + "}"
    reward, sample = grade(MathGrader(), reply, "1")
    assert reward == 0.0
    assert sample.metrics["math.reason"] == (
        "answer too large to parse (1,048,584 chars > limit 100,000, max_chars): "
        r"its \boxed{ starts before the part read"
    )
    assert sample.metrics["math.limit"] == "max_chars"


def test_deeply_nested_braces_name_the_depth_limit(grade):
    reward, sample = grade(MathGrader(), r"\boxed{" + "{" * 40 + "1" + "}" * 40 + "}", "1")
    assert reward == 0.0
    assert "math.path" not in sample.metrics  # never sent to the CAS
    assert sample.metrics["math.reason"].startswith("braces nested deeper than 32 (40 levels, max_brace_depth)")
    assert sample.metrics["math.limit"] == "max_brace_depth"
    # nested so deep that the reply outgrows the part read: the size limit is the cause
    reward, sample = grade(MathGrader(), r"\boxed{" + "{" * 60_000 + "1" + "}" * 60_000 + "}", "1")
    assert reward == 0.0
    assert sample.metrics["math.reason"].startswith("answer too large to parse (120,009 chars > ")


def test_a_long_reply_without_an_answer_says_only_its_end_was_read(grade):
    reward, sample = grade(ExactMatchGrader(ExactMatchConfig(extract="hash", max_chars=100)), "x" * 500, "1")
    assert reward == 0.0
    assert sample.metrics["exact-match.reason"] == (
        "no answer found in the last 100 chars read (the reply has 500 > limit 100, max_chars; tried hash)"
    )


# -- configs read from a [rollout.grader_config] table ---------------------------------------------

BAD = [
    (ExactMatchConfig, {"extract": "boxd"}, "unknown extractor 'boxd'", "$.rollout.grader_config.extract"),
    (
        ExactMatchConfig,
        {"extract": ["hash", 3]},
        "expected an extractor name or a list",
        "$.rollout.grader_config.extract",
    ),
    (
        ExactMatchConfig,
        {"punctuation": "some"},
        "must be one of edges, all, keep",
        "$.rollout.grader_config.punctuation",
    ),
    (ExactMatchConfig, {"tolerance": 1}, "unknown key 'tolerance'", "$.rollout.grader_config"),
    (ExactMatchConfig, {"case_sensitive": "yes"}, "expected true or false", "$.rollout.grader_config.case_sensitive"),
    (NumericConfig, {"abs_tol": -1.0}, "must be a finite number >= 0", "$.rollout.grader_config.abs_tol"),
    (RegexConfig, {"pattern": "(unclosed"}, "not a valid regular expression", "$.rollout.grader_config.pattern"),
    (ContainsConfig, {"match": "most"}, "must be 'any' or 'all'", "$.rollout.grader_config.match"),
    (JsonMatchConfig, {"schema": {"type": 12}}, "not a valid JSON Schema", "$.rollout.grader_config.schema"),
    (JsonMatchConfig, {"scoring": "half"}, "must be 'all' or 'fraction'", "$.rollout.grader_config.scoring"),
    (JsonMatchConfig, {"fields": [1]}, "expected a field path", "$.rollout.grader_config.fields"),
    (MathConfig, {"cas_timeout_sec": 0.0}, "must be a number of seconds", "$.rollout.grader_config.cas_timeout_sec"),
    (MathConfig, {"cas_workers": 0}, "must be a whole number >= 1", "$.rollout.grader_config.cas_workers"),
    (MathConfig, {"metrics_prefix": " "}, "must not be empty", "$.rollout.grader_config.metrics_prefix"),
]


@pytest.mark.parametrize(("config_type", "table", "message", "path"), BAD)
def test_a_bad_config_table_is_refused_with_its_key_path(config_type, table, message, path):
    with pytest.raises(ConfigError) as caught:
        apply_config_table(config_type(), table, "$.rollout.grader_config", "run.toml")
    (problem,) = caught.value.problems
    assert message in problem, problem
    assert f"@ {path}" in problem, problem


def test_a_good_config_table_is_read_into_the_config_type():
    config = apply_config_table(
        MathConfig(), {"extract": "boxed", "label_extract": ["boxed", "hash"], "cas_timeout_sec": 2}, "$.r", "run.toml"
    )
    assert config.extract == ("boxed",)
    assert config.label_extract == ("boxed", "hash")
    assert config.cas_timeout_sec == 2.0
    assert isinstance(config, MathConfig)
    aliases = ExactMatchConfig(extract=["gsm8k", "number", "whole"])
    assert aliases.extract == ("hash", "last-number", "final")
