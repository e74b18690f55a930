"""The core's side of traces: the [traces] table, and the hook a gateway plugin provides."""

from __future__ import annotations

import pytest

from osmosis_core import PolicyEndpoint
from osmosis_core._engine.config import config_from_dict
from osmosis_core._engine.registry import PluginRegistry
from osmosis_core.errors import ConfigError
from osmosis_core.traces import make_trace_gateway, traces_enabled

BASE = {"rollout": {"path": "rollouts/x"}}


def test_the_traces_table_is_a_table_and_turns_traces_on_unless_disabled():
    assert config_from_dict({**BASE, "traces": {"adapter": "vllm"}}).traces == {"adapter": "vllm"}
    with pytest.raises(ConfigError, match=r"\$\.traces"):
        config_from_dict({**BASE, "traces": 3})
    assert traces_enabled({"adapter": "vllm"})
    assert traces_enabled({"enabled": True})
    assert not traces_enabled({})
    assert not traces_enabled({"enabled": False, "adapter": "vllm"})


def test_without_a_gateway_plugin_the_error_says_what_to_install():
    registry = PluginRegistry(load_entrypoints=False)
    with pytest.raises(ConfigError, match="pip install osmosis-gateway") as caught:
        make_trace_gateway(PolicyEndpoint("http://127.0.0.1:9/v1", "m", "sk-secret-key"), {}, registry=registry)
    assert "sk-secret-key" not in str(caught.value)


def test_a_plugin_provides_the_gateway_through_the_hook():
    from osmosis_core.hookspecs import hookimpl

    seen = {}

    class Plugin:
        @hookimpl
        def osmosis_policy_gateway(self, upstream, settings, source):
            seen.update(upstream=upstream, settings=settings, source=source)
            return "the gateway"

    registry = PluginRegistry(load_entrypoints=False)
    registry.register(Plugin(), "fake-gateway")
    policy = PolicyEndpoint("http://127.0.0.1:9/v1", "m")
    assert make_trace_gateway(policy, {"adapter": "sglang"}, source="run.toml", registry=registry) == "the gateway"
    assert seen == {"upstream": policy, "settings": {"adapter": "sglang"}, "source": "run.toml"}


def test_a_trace_line_reads_back_as_the_trace_it_was_written_from():
    from osmosis_core.frontend import trace_from_line
    from osmosis_core.traces import trace_line

    trace = {"rollout_id": "r-1", "complete": False, "incomplete_reason": "cut", "calls": [{"call_id": "c0"}]}
    line = trace_line("r-1", 3, 1, trace)
    assert (line["row_index"], line["sample_index"]) == (3, 1)
    assert trace_from_line(line) == trace
