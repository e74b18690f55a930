"""The core's side of traces: the [traces] table, and the hook a gateway plugin provides."""

from __future__ import annotations

import pytest

from osmosis_core import PolicyEndpoint
from osmosis_core._engine.config import config_from_dict
from osmosis_core._engine.registry import PluginRegistry
from osmosis_core._engine.traces import make_trace_gateway
from osmosis_core.errors import ConfigError
from osmosis_core.traces import traces_enabled

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


def test_shared_gateways_share_by_upstream_keep_idle_ones_up_to_the_limit_and_close_all():
    import anyio

    from osmosis_core.hookspecs import hookimpl
    from osmosis_core.plugin import SharedGateways

    events: list[tuple[str, str]] = []

    class Gateway:
        def __init__(self, upstream):
            self.url = upstream.base_url

        async def start(self):
            events.append(("start", self.url))

        async def aclose(self):
            events.append(("close", self.url))

        def open_rollout(self, rollout_id):
            return PolicyEndpoint(f"{self.url}/rollouts/{rollout_id}", "m")

        def pop_trace(self, rollout_id):
            return f"trace of {rollout_id}"

    class Plugin:
        @hookimpl
        def osmosis_policy_gateway(self, upstream, settings, source):
            return Gateway(upstream)

    registry = PluginRegistry(load_entrypoints=False)
    registry.register(Plugin(), "fake-gateway")
    one, two = PolicyEndpoint("http://one/v1", "m"), PolicyEndpoint("http://two/v1", "m")

    async def main():
        gateways = SharedGateways({}, source="$.traces", keep_idle=1, registry=registry)
        assert (await gateways.open(one, "a")).base_url == "http://one/v1/rollouts/a"
        await gateways.open(one, "b")  # the same upstream: the same gateway
        assert gateways.take(one, "a") == "trace of a"
        assert gateways.take(one, "b") == "trace of b"
        await gateways.close_idle()  # one idle gateway is within keep_idle=1
        assert gateways.upstreams == ["http://one/v1"]
        await gateways.open(two, "c")  # a second upstream: the idle one past the limit is stopped
        assert gateways.upstreams == ["http://two/v1"]
        await gateways.aclose()
        assert gateways.open_count == 0

    anyio.run(main)
    assert events == [("start", "http://one/v1"), ("close", "http://one/v1"), ("start", "http://two/v1"),
                      ("close", "http://two/v1")]  # fmt: skip
