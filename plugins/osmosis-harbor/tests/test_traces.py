"""``osmosis run --traces --backend harbor``: each trial calls the policy gateway with its rollout's
own URL and token, and the traces are the ones ``local`` gives for the same rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from harbor_helpers import TASKS_DIR, osmosis, request

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.together  # with osmosis-gateway installed beside this plugin


def _workspace(tmp_path: Path) -> Path:
    shutil.copytree(
        REPO / "rollouts" / "multiply-plain",
        tmp_path / "rollouts" / "multiply-plain",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "eval" / "multiply-plain.toml", tmp_path / "configs")
    return tmp_path / "configs" / "multiply-plain.toml"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def local_traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """A workspace and the traces ``local`` gives for its first 4 rows (run once for this module)."""
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    tmp_path = tmp_path_factory.mktemp("traces")
    config = _workspace(tmp_path)
    local = osmosis("run", str(config), "--stub-policy", "--traces", "--limit", "4", "--output", "local", cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    return config, _lines(tmp_path / "local" / "traces.jsonl")


def _comparable(lines: list[dict]) -> list[dict]:
    from osmosis_gateway import comparable_trace

    return sorted(map(comparable_trace, lines), key=str)


@pytest.mark.timeout(300)
def test_harbor_gives_the_traces_of_local(local_traces):
    config, on_local = local_traces
    args = ["run", str(config), "--stub-policy", "--traces", "--limit", "4"]
    harbor = osmosis(*args, "--backend", "harbor", "--output", "harbor", cwd=config.parents[1], timeout=240)
    assert harbor.returncode == 0, harbor.stdout + harbor.stderr
    assert "on backend 'harbor'" in harbor.stdout, harbor.stdout + harbor.stderr
    on_harbor = _comparable(_lines(config.parents[1] / "harbor" / "traces.jsonl"))
    assert len(on_local) == 4
    assert on_harbor == _comparable(on_local)
    assert all(t["complete"] and len(t["calls"]) == 2 and t["calls"][0]["completion_token_ids"] for t in on_harbor)
    assert all(line["status"] == "success" for line in _lines(config.parents[1] / "harbor" / "results.jsonl"))


@pytest.mark.timeout(300)
def test_a_no_network_task_calls_its_policy_through_the_gateway(local_traces):
    """A no-network trial's one path out is its socket to the gateway: its tool-calling rollout
    succeeds, graded, with the complete trace ``local`` gives for the same row."""
    config, on_local = local_traces
    nonet = config.with_name("nonet.toml")
    text = config.read_text().replace('backend = "local"', 'backend = "harbor"')
    nonet.write_text(f'{text}\n[backend.harbor]\ntask_dir = "{TASKS_DIR / "nonet"}"\n')
    run = osmosis(
        "run", str(nonet), "--stub-policy", "--traces", "--limit", "1", "--output", "nonet", cwd=config.parents[1]
    )
    assert run.returncode == 0, run.stdout + run.stderr
    [result] = _lines(config.parents[1] / "nonet" / "results.jsonl")
    assert result["status"] == "success", result
    assert result["reward"] == 1.0, result
    [trace] = _lines(config.parents[1] / "nonet" / "traces.jsonl")
    assert trace["complete"]
    assert len(trace["calls"]) == 2
    assert trace["calls"][1]["completion_token_ids"]
    same_row = [line for line in on_local if line["row_index"] == trace["row_index"]]
    assert _comparable([trace]) == _comparable(same_row)


def test_a_no_network_trial_reaches_the_gateway_and_writes_only_its_own_trace(probe, tmp_path):
    """From inside a no-network trial: the stand-in upstream's port and the gateway's port on the host's
    loopback stay unreachable, the gateway answers through the socket, and a call to another rollout's
    route (forged id, with or without the trial's token) is refused and recorded nowhere."""
    import anyio

    from osmosis_core import ExecutionRequest
    from osmosis_core.http import aclose_http
    from osmosis_core.testing import ScriptedPolicyServer
    from osmosis_harbor import HarborBackend, HarborBackendConfig

    gateway_module = pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    config = HarborBackendConfig(task_dir=str(TASKS_DIR / "nonet"))
    backend = HarborBackend(probe.workflow_class, config=config, rollout_dir=probe.rollout_dir, run_dir=tmp_path)
    seen: dict[str, object] = {}

    async def main(server: ScriptedPolicyServer) -> None:
        async with gateway_module.PolicyGateway(request("-", server.url).policy, adapter="vllm") as gateway:
            gateway_port = urlsplit(gateway.url).port
            gateway.open_rollout("victim")  # its token stays in this process
            probes = [
                {"connect": ["127.0.0.1", server.port]},
                {"connect": ["127.0.0.1", gateway_port]},
                {"chat": "What is 2 times 3?"},
                {"chat_as": ["victim", True]},
                {"chat_as": ["victim", False]},
                {"chat_as": ["not-opened", True]},
            ]
            own = ExecutionRequest(
                rollout_id="offline",
                prompt=[{"role": "user", "content": "probe"}],
                policy=gateway.open_rollout("offline"),
                metadata={"probe": probes},
                agent_timeout_sec=60,
            )
            results: list = []

            async def keep(result) -> None:
                results.append(result)

            try:
                await backend.execute(own, keep, keep)
            finally:
                await backend.aclose()
                await aclose_http()
            seen.update(result=results[-1], own=gateway.pop_trace("offline"), victim=gateway.pop_trace("victim"))

    with ScriptedPolicyServer(flavor="vllm") as server:
        anyio.run(main, server)
        served = len(server.requests)
    result = seen["result"]
    assert result.status.value == "success", result.error
    upstream, gateway_port, answer, forged, no_token, unknown = json.loads(result.sample.messages[-1]["content"])[1:]
    assert upstream.startswith("error: ConnectionRefusedError")  # the stand-in's own port: not from here
    assert gateway_port.startswith("error: ConnectionRefusedError")  # nor the gateway's, but through the socket
    assert answer
    assert not str(answer).startswith("error")
    assert (forged, no_token, unknown) == (403, 401, 403)
    own, victim = seen["own"], seen["victim"]
    assert len(own.calls) == 1
    assert own.complete
    assert own.calls[0].completion_token_ids
    assert victim.calls == []
    assert victim.complete
    assert served == 1  # the forged calls never reached the upstream
