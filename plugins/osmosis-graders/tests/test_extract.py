"""Every extractor, table-driven, including the ugly replies."""

from __future__ import annotations

import pytest

from osmosis_core import RolloutSample
from osmosis_graders import extract_answer, final_text
from osmosis_graders.extract import EXTRACTORS, find_boxed, find_json, json_field

CASES = [
    # (extractors, reply, expected text or None)
    # -- hash (GSM8K)
    ("hash", "3 + 4 = 7\n#### 7", "7"),
    ("hash", "#### 1,000.", "1,000."),
    ("hash", "#### 5\nmore words\n#### −12", "−12"),
    ("hash", "#### -3.5 dollars", "-3.5 dollars"),
    ("hash", "####42", "42"),
    ("hash", "#### \n", None),
    ("hash", "no marker", None),
    ("gsm8k", "#### 8", "8"),
    # -- boxed
    ("boxed", r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
    ("boxed", r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),
    ("boxed", r"first \boxed{1}, then \boxed{2}, finally \boxed{x^{2}+1}", "x^{2}+1"),
    ("boxed", r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    ("boxed", r"\boxed{3} and a broken \boxed{4", "3"),
    ("boxed", r"\boxed{ -5 }", "-5"),
    ("boxed", r"\fbox{7}", "7"),
    ("boxed", r"\boxed 5.", "5"),
    ("boxed", r"$\boxed{[0, 1)}$", "[0, 1)"),
    ("boxed", "no box", None),
    ("boxed", r"\boxed{}", ""),
    # -- answer-line
    ("answer-line", "work\nAnswer: 42", "42"),
    ("answer-line", "work\n**Final Answer:** 42.", "42."),
    ("answer-line", "The answer is (B).", "(B)."),
    ("answer-line", "answer: 1\nthen answer: 2", "2"),
    ("answer-line", "Final answer:\n\n  17", "17"),
    ("answer-line", "answerable question, no colon", None),
    # -- last-number
    ("last-number", "I got 3, then 1,234.5.", "1,234.5"),
    ("last-number", "it is −5", "−5"),
    ("last-number", "costs $18 total", "$18"),
    ("last-number", "about 3/4 of them", "3/4"),
    ("last-number", "1e-3 is small", "1e-3"),
    ("last-number", "val1 and x2 are names", None),
    ("last-number", "", None),
    # -- json
    ("json", '{"a": 1}', '{"a": 1}'),
    ("json", 'Here:\n```json\n{"b": [1, 2]}\n```\nand {"c": 3}', '{"b": [1, 2]}'),
    ("json", 'text {"a": {"b": 2}} more', '{"a": {"b": 2}}'),
    ("json", "not json {at all", None),
    # -- tag
    ("tag", "<think>x</think><answer> 42 </answer>", "42"),
    ("tag", "<answer>1</answer> then <answer>2</answer>", "2"),
    ("tag", "<answer>unclosed", None),
    # -- final
    ("final", "  the whole reply \n", "the whole reply"),
    ("final", "   ", None),
    # -- chains: the first that finds an answer
    (["hash", "last-number"], "no marker but 12 here", "12"),
    (["boxed", "hash"], r"#### 3 and \boxed{4}", "4"),
    (["hash", "boxed"], r"#### 3 and \boxed{4}", r"3 and \boxed{4}"),
]


@pytest.mark.parametrize(("extractors", "reply", "expected"), CASES)
def test_extractor(extractors, reply, expected):
    names = [extractors] if isinstance(extractors, str) else extractors
    found = extract_answer(reply, names)
    assert (found.text if found is not None else None) == expected


def test_every_extractor_is_covered_by_the_table():
    named = {e for e, *_ in CASES if isinstance(e, str)}
    assert set(EXTRACTORS) <= named


def test_a_json_field_by_path_and_a_missing_one():
    reply = '{"answer": {"values": [10, 20]}, "note": "x"}'
    found = extract_answer(reply, ["json"], json_path="answer.values.1")
    assert found is not None
    assert found.text == "20"
    assert found.value == 20
    assert extract_answer(reply, ["json"], json_path="answer.missing") is None
    assert extract_answer(reply, ["json", "final"], json_path="nope").extractor == "final"
    assert json_field([1, [2, 3]], "1.-1") == 3
    with pytest.raises(KeyError):
        json_field({"a": 1}, "a.b")


def test_a_custom_tag():
    assert extract_answer("<result>9</result>", ["tag"], tag="result").text == "9"


def test_an_unknown_extractor_is_an_error():
    with pytest.raises(ValueError, match="unknown extractor 'boxd'"):
        extract_answer("x", ["boxd"])


def test_find_boxed_and_find_json_on_hostile_input_stay_linear_enough():
    many = "\\boxed{" * 2000 + "x"  # nothing balanced
    assert find_boxed(many) is None
    braces = "{" * 5000
    assert find_json(braces) == (False, None)


def test_final_text_reads_the_last_assistant_message_and_content_parts():
    sample = RolloutSample(
        messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "text", "text": "#### "}, {"type": "text", "text": "4"}]},
            {"role": "tool", "content": "tool output 99"},
        ]
    )
    assert final_text(sample) == "#### 4"
    chat = RolloutSample(messages=[{"native": True}], chat_messages=[{"role": "assistant", "content": "#### 5"}])
    assert final_text(chat) == "#### 5"
    assert final_text(RolloutSample(messages=[{"role": "user", "content": "only"}])) == "only"
    assert final_text(RolloutSample()) == ""
