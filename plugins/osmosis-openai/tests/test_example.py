"""The example of the README and of ``osmosis_openai``'s docstring, run as written: one rollout
against the scripted policy server, and the same rollout against an endpoint that answers 500."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import osmosis_openai
from osmosis_core import ErrorCategory
from osmosis_core.testing import Fault, run_rollout_sync

README = Path(__file__).resolve().parents[1] / "README.md"


def _example(source: str) -> type[Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "example", "exec"), namespace)
    return namespace["AskOnce"]


def _examples() -> list[type[Any]]:
    readme = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    docstring = (osmosis_openai.__doc__ or "").split("::\n", 1)[1].split("\n\nImporting", 1)[0]
    assert readme is not None
    lines = docstring.splitlines()
    return [_example(readme.group(1)), _example("\n".join(line[4:] for line in lines))]


def test_the_documented_example_runs_and_maps_an_endpoint_failure_to_policy_error(policy_server):
    for ask_once in _examples():
        outcome = run_rollout_sync(ask_once, policy=policy_server.url, user_prompt="What is 6 times 7?")
        assert outcome.final.ok, outcome.final.error
        assert outcome.sample is not None
        assert [m["role"] for m in outcome.sample.messages] == ["user", "assistant"]
        policy_server.inject(Fault("status", status=500))
        failed = run_rollout_sync(ask_once, policy=policy_server.url, user_prompt="What is 6 times 7?")
        assert failed.final.error is not None
        assert failed.final.error.category is ErrorCategory.POLICY_ERROR
        assert "answered 500" in failed.final.error.message
