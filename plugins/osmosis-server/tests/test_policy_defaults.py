"""The server's default policy is one ``PolicyEndpoint`` (``[policy]``), passed through whole; 0.1's
``model`` / ``api_key`` / ``headers`` / ``max_response_bytes`` keywords warn and still work."""

from __future__ import annotations

import warnings

import pytest

from osmosis_core import LocalBackend, OsmosisDeprecationWarning, PolicyEndpoint
from osmosis_server import create_app


def _app(tmp_path, **kwargs):
    from osmosis_core import AgentWorkflow

    class Echo(AgentWorkflow):
        async def run(self, ctx):
            return list(ctx.prompt)

    return create_app(LocalBackend(Echo), run_dir=tmp_path / "run", auth=False, configure_logging=False, **kwargs)


def _service(app):
    return app.state.service


def test_the_policy_is_passed_through_whole(tmp_path):
    policy = PolicyEndpoint("", "qwen", "sk-Zq9x7Wv5Ut3", {"X-Team": "t-Zq9x7Wv5"}, max_response_bytes=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OsmosisDeprecationWarning)
        service = _service(_app(tmp_path, policy=policy))
    assert service.policy is policy
    assert set(service._server_secrets) == {"sk-Zq9x7Wv5Ut3", "t-Zq9x7Wv5"}


def test_the_0_1_keywords_warn_at_the_callers_line_and_build_the_same_policy(tmp_path):
    with pytest.warns(OsmosisDeprecationWarning, match=r"create_app\(api_key, headers, model=\.\.\.\)") as caught:
        service = _service(_app(tmp_path, model="qwen", api_key="sk-Zq9x7Wv5Ut3", headers={"X-Team": "t"}))
    assert caught[0].filename == __file__
    assert service.policy == PolicyEndpoint("", "qwen", "sk-Zq9x7Wv5Ut3", {"X-Team": "t"})


def test_both_or_an_unknown_keyword_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="not both"):
        _app(tmp_path, policy=PolicyEndpoint("", "m"), model="other")
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['modle'\]"):
        _app(tmp_path, modle="m")
