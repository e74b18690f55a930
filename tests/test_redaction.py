"""Redaction of secrets and of every run of 8 or more of their characters (issue 16, item 5).

``redact`` is checked against a brute-force reference (every 8-character substring of every
secret, each occurrence marked) on generated texts; the results writer and ``clip`` on the
masked forms providers echo.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from osmosis_core._engine.results import ResultWriter
from osmosis_core.errors import clip, error_info, holds_secret, redact, redact_data

KEY = "sk-proj-abcd1234EFGH5678ijkl9012MNOPwxyz"
HEADER = "org-0123456789abcdefXYZ"


def fragments(secret: str, n: int = 8) -> set[str]:
    return {secret[i : i + n] for i in range(len(secret) - n + 1)}


def reference(text: str, secrets: list[str]) -> str:
    """Every maximal stretch covered by an 8-character substring of a long secret, or by a whole
    short (4 to 7 characters) secret found afterwards, becomes ``***``."""
    covered = [False] * len(text)
    for secret in secrets:
        if len(secret) >= 8:
            for gram in fragments(secret):
                at = text.find(gram)
                while at >= 0:
                    covered[at : at + 8] = [True] * 8
                    at = text.find(gram, at + 1)
    out, i = [], 0
    while i < len(text):
        if covered[i]:
            while i < len(text) and covered[i]:
                i += 1
            out.append("***")
        else:
            out.append(text[i])
            i += 1
    result = "".join(out)
    for secret in secrets:
        if 4 <= len(secret) < 8:
            result = result.replace(secret, "***")
    return result


def test_a_masked_key_and_a_header_prefix_lose_every_run_of_eight():
    echoed = f"Incorrect API key provided: {KEY[:16]}{'*' * 16}{KEY[-4:]}; bad header {HEADER[:16]}"
    out = redact(echoed, [KEY, HEADER])
    assert out == "Incorrect API key provided: ***" + "*" * 16 + "wxyz; bad header ***"
    assert not any(f in out for f in fragments(KEY) | fragments(HEADER))
    assert redact("sk-proj-", [KEY]) == "***"  # exactly eight
    assert redact("k-proj-", [KEY]) == "k-proj-"  # seven is not a run to redact
    assert holds_secret(KEY[5:13], [KEY])
    assert not holds_secret(KEY[5:12], [KEY])


def test_short_secrets_are_redacted_only_whole_and_tiny_values_never():
    assert redact("tok abc12 and abc1", ["abc12"]) == "tok *** and abc1"
    assert redact("abc", ["ab", None, ""]) == "abc"


@settings(max_examples=300, deadline=None)
@given(
    secrets=st.lists(st.text(alphabet="abcdeXY-01", min_size=4, max_size=30), min_size=1, max_size=3),
    pieces=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(0, 30), st.text("abc XY01", max_size=6))
    ),
)
def test_redact_matches_the_brute_force_reference(secrets, pieces):
    text = "".join(secrets[k % len(secrets)][a:b] + filler for k, a, b, filler in pieces)
    assert redact(text, secrets) == reference(text, secrets)


@settings(max_examples=200, deadline=None)
@given(
    cuts=st.lists(st.tuples(st.integers(0, 170), st.integers(0, 170), st.text("ab ÿ€XY01", max_size=40)), max_size=8)
)
def test_long_secrets_take_the_one_pass_precheck_and_still_match_the_reference(cuts):
    """A key of OpenAI's length has more blocks than ``_MANY_BLOCKS``: the set of its 4-byte windows
    is the pre-check (non-ASCII text included); the result is still exactly the reference's."""
    key = "sk-proj-" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7-_" * 5 + "ÿ€xyz"
    secrets = [key, HEADER]
    text = "".join(key[a:b] + filler for a, b, filler in cuts)
    assert redact(text, secrets) == reference(text, secrets)


def test_clip_redacts_fragments_before_cutting():
    message = f"policy endpoint http://x/v1 answered 401: Incorrect API key provided: {KEY[:16]}****{KEY[-4:]}"
    line = clip(message, [KEY], limit=60)
    assert not any(f in line for f in fragments(KEY)), line
    assert line.endswith("…")
    assert "401" in line


def test_error_info_redacts_fragments():
    info = error_info(RuntimeError(f"key {KEY[:16]}... rejected"), secrets=[KEY])
    assert KEY[:8] not in info.message
    assert "rejected" in info.message


def test_the_results_writer_redacts_fragments_anywhere_in_a_line(tmp_path: Path):
    writer = ResultWriter(tmp_path / "results.jsonl", [KEY])
    writer.write({"row": 0, "error": {"message": f"bad key {KEY[:16]}****{KEY[-4:]}"}})
    writer.write({"row": 1, "sample": {"messages": [{"content": f"header {HEADER[2:18]}"}]}}, [HEADER])
    writer.write({"row": 2, "sample": {"messages": [{"content": "nothing secret"}]}})
    writer.close()
    text = (tmp_path / "results.jsonl").read_text()
    assert not any(f in text for f in fragments(KEY) | fragments(HEADER)), text
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0]["error"]["message"] == f"bad key *******{KEY[-4:]}"
    assert lines[2]["sample"]["messages"][0]["content"] == "nothing secret"


def test_redact_data_walks_keys_and_values():
    assert redact_data({KEY[:9]: [KEY[1:12], 3, None]}, [KEY]) == {"***": ["***", 3, None]}


def test_the_results_writer_redacts_a_secret_in_a_key_that_is_not_a_string(tmp_path: Path):
    """A metric keyed by a number is a string only once the line is encoded: it is redacted there too."""
    path = tmp_path / "results.jsonl"
    writer = ResultWriter(path, secrets=["12345678"])
    writer.write({"metrics": {12345678: 1, "ok": (b"x12345678", "y")}})
    writer.close()
    text = path.read_text()
    assert "12345678" not in text, text
    assert json.loads(text)["metrics"]["***"] == 1
