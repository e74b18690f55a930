"""A trainer's per-request knobs: ``sampling_params`` set on every model call of the rollout, and
``policy_version`` recorded on each traced call; both echoed in the result and written to the run
folder. Real servers, real HTTP, the scripted policy as the only model stand-in."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from server_helpers import REFERENCE, TOKEN, read_lines, reference_validate
from workflows import TwoCallsOfItsOwn

from osmosis_core import LocalBackend
from osmosis_core.testing import ScriptedPolicyServer
from osmosis_server import LEASE_HEADER, ServerSettings

AUTH = {"Authorization": f"Bearer {TOKEN}"}
TRAINER = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 64, "seed": None}
APPLIED = {"temperature": 1.0, "top_p": 0.9, "max_tokens": 64}  # (a null: not set)
OWN = (0.2, 0.5, 512)  # the workflow's own temperature, top_p and max_tokens


def _body(rollout_id: str, url: str, **extra: object) -> dict:
    return {
        "rollout_id": rollout_id,
        "initial_messages": [{"role": "user", "content": f"val1 = 6\nval2 = 7 ({rollout_id})"}],
        "chat_completions_url": url,
        **extra,
    }


def _sent(body: dict) -> tuple:
    return body["temperature"], body["top_p"], body["max_tokens"]


def test_without_traces_every_call_takes_the_trainers_settings_and_the_folder_records_them(serve):
    served = serve(LocalBackend(TwoCallsOfItsOwn), settings=ServerSettings(grace_sec=1, retention_sec=0.2))
    http = httpx.Client(base_url=served.url, headers=AUTH, timeout=30)
    with ScriptedPolicyServer() as upstream:
        tuned = http.post(
            "/rollout?wait=final",
            json=_body("tuned", upstream.url, sampling_params=TRAINER, policy_version="step-7"),
        ).json()
        plain = http.post("/rollout?wait=final", json=_body("plain", upstream.url)).json()
        sent = {rid: [r.body for r in upstream.requests_for(rid)] for rid in ("tuned", "plain")}
    result = tuned["result"]
    assert result["status"] == "success", result
    assert result["policy_version"] == "step-7"
    assert result["sampling_params"] == APPLIED
    assert plain["result"]["status"] == "success"
    assert "policy_version" not in plain["result"]
    assert "sampling_params" not in plain["result"]
    assert [_sent(body) for body in sent["tuned"]] == [(1.0, 0.9, 64)] * 2  # every call, not the workflow's
    assert [_sent(body) for body in sent["plain"]] == [OWN] * 2
    assert "seed" not in sent["tuned"][0]  # a null leaves it to the workflow (which set none)

    folder = served.service.folder
    folder.flush()
    lines = {line["rollout_id"]: line for line in read_lines(folder.path / "results.jsonl")}
    assert lines["tuned"]["sampling_params"] == APPLIED
    assert lines["tuned"]["policy_version"] == "step-7"
    assert "sampling_params" not in lines["plain"]
    assert "policy_version" not in lines["plain"]
    while served.service.health()["server"]["retained_results"]:  # past its retention: read back from the line
        time.sleep(0.05)
    again = http.get("/rollout/tuned/result", headers={LEASE_HEADER: tuned["polling_lease_token"]}).json()
    assert again == result


@pytest.mark.together
def test_with_traces_the_gateway_sets_them_and_each_traced_call_records_them(serve):
    """``osmosis serve --traces``: the rollouts of one upstream share a gateway whatever their settings;
    each call goes upstream with its rollout's settings, and its trace keeps what the workflow sent
    (``request``), what the gateway set (``sampling``) and the rollout's ``policy_version``."""
    pytest.importorskip("osmosis_gateway", reason="traces need osmosis-gateway")
    served = serve(LocalBackend(TwoCallsOfItsOwn), traces={"adapter": "vllm"}, settings=ServerSettings(grace_sec=1))
    http = httpx.Client(base_url=served.url, headers=AUTH, timeout=30)
    other = {"temperature": 0.7, "max_tokens": 32, "stop": ["\n\n"]}
    with ScriptedPolicyServer(flavor="vllm") as upstream:
        results = {
            rid: http.post("/rollout?wait=final", json=_body(rid, upstream.url, **extra)).json()["result"]
            for rid, extra in (
                ("a", {"sampling_params": TRAINER, "policy_version": "step-7"}),
                ("b", {"sampling_params": other, "policy_version": "step-8"}),
                ("plain", {}),
            )
        }
        sent = {rid: [r.body for r in upstream.requests_for(rid)] for rid in results}
        assert served.service.gateways.open_count == 1  # one upstream, one gateway
    assert [_sent(body) for body in sent["a"]] == [(1.0, 0.9, 64)] * 2
    # the workflow's top_p is not the trainer's to keep: the trainer decides the distribution
    assert [(b["temperature"], b.get("top_p"), b["max_tokens"], b["stop"]) for b in sent["b"]] == [
        (0.7, None, 32, ["\n\n"])
    ] * 2
    assert [_sent(body) for body in sent["plain"]] == [OWN] * 2

    expected = {"a": (APPLIED, "step-7"), "b": (other, "step-8"), "plain": (None, None)}
    folder = served.service.folder
    folder.flush()
    written = {line["rollout_id"]: line for line in read_lines(folder.path / "traces.jsonl")}
    for rid, result in results.items():
        assert result["status"] == "success", result
        trace = result["trace"]
        assert trace["complete"] is True
        assert written[rid]["calls"] == trace["calls"]  # traces.jsonl holds the same
        sampling, version = expected[rid]
        assert result.get("policy_version") == version
        assert len(trace["calls"]) == 2
        for call in trace["calls"]:
            assert call["sampling"] == sampling
            assert call["sampling_dropped"] == (["top_p"] if rid == "b" else None)
            assert call["policy_version"] == version
            own = call["request"]
            assert (own["temperature"], own["top_p"], own["max_tokens"]) == OWN  # as the workflow sent them
            assert call["prompt_token_ids"]
            assert len(call["completion_token_ids"]) == len(call["logprobs"])


def test_bad_settings_are_refused_naming_the_key_and_nothing_is_admitted(serve):
    served = serve(LocalBackend(TwoCallsOfItsOwn))
    http = httpx.Client(base_url=served.url, headers=AUTH, timeout=30)
    url = "http://127.0.0.1:9/v1"
    bad_pair = {"sampling_params": {"top_p": 0, "max_tokens": 1.5}}  # both named
    cases = [
        ({"sampling_params": {"temprature": 1.0}}, "did you mean 'temperature'? (known: temperature, top_p, top_k"),
        ({"sampling_params": {"temprature": 1.0}}, "@ $.sampling_params.temprature"),
        ({"sampling_params": {"max_completion_tokens": 64}}, "send max_tokens"),
        (bad_pair, "expected a number > 0 and <= 1, got 0 @ $.sampling_params.top_p"),
        (bad_pair, "expected a whole number >= 1, got 1.5 @ $.sampling_params.max_tokens"),
        ({"sampling_params": [["temperature", 1]]}, "got an array @ $.sampling_params"),
        ({"policy_version": 12}, "expected a string or null, got a number @ $.policy_version"),
        ({"policy_version": "v" * 257}, "a string of 1 to 256 characters @ $.policy_version"),
    ]
    for extra, named in cases:
        answer = http.post("/rollout", json=_body("refused", url, **extra))
        assert answer.status_code == 422, answer.text
        assert named in answer.json()["detail"], answer.json()["detail"]
    assert served.service.health()["server"]["counts"].get("admitted", 0) == 0
    ok = http.post("/rollout", json=_body("refused", url, sampling_params={"temperature": 0}, grade=False))
    assert ok.status_code == 202  # the id was never taken


def test_the_openapi_document_states_the_same_checks_as_the_server(serve):
    """``/openapi.json`` documents both fields; its SubmitBody schema refuses exactly the settings the
    server refuses (the schema of ``sampling_params`` is generated from the same table as its checks)."""
    jsonschema = pytest.importorskip("jsonschema")
    from osmosis_server.protocol import BadRequest, parse_submit

    served = serve(LocalBackend(TwoCallsOfItsOwn))
    document = httpx.get(f"{served.url}/openapi.json", headers=AUTH).json()
    schema = document["components"]["schemas"]["SubmitBody"]
    assert {"sampling_params", "policy_version"} <= set(schema["properties"])
    assert schema["properties"]["sampling_params"]["properties"]["max_tokens"]["minimum"] == 1
    assert {"sampling_params", "policy_version"} <= set(document["components"]["schemas"]["Result"]["properties"])
    validator = jsonschema.Draft202012Validator(schema)
    settings = [
        None, {}, TRAINER, {"top_k": -1, "min_p": 0, "stop": "\n", "seed": 2**63 - 1, "repetition_penalty": 1.1},
        {"presence_penalty": -2, "frequency_penalty": 2, "stop": ["a", "b"], "temperature": 0},
        {"temperature": -0.1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}, {"min_p": 1.01}, {"max_tokens": 0},
        {"stop": [1]}, {"stop": 3}, {"seed": 2**63}, {"presence_penalty": 2.5}, {"repetition_penalty": 0},
        {"n": 2}, {"temperature": "1"}, {"temperature": True}, [], "x",
    ]  # fmt: skip
    for sampling in settings:
        for version in (None, "v1", "", 3):
            body = _body("r", "http://h/v1", sampling_params=sampling, policy_version=version)
            try:
                parse_submit(json.dumps(body).encode())
                taken = True
            except BadRequest:
                taken = False
            assert validator.is_valid(body) is taken, (sampling, version)


@pytest.mark.reference
@pytest.mark.skipif(not REFERENCE, reason="set OSMOSIS_AI_PYTHON to a Python with osmosis-ai[server]==0.3.8")
def test_the_reference_client_reads_a_result_that_echoes_the_knobs(serve, tmp_path):
    """osmosis-ai 0.3.8's own result model accepts a document with ``policy_version`` and
    ``sampling_params`` (its client ignores them)."""
    served = serve(LocalBackend(TwoCallsOfItsOwn))
    http = httpx.Client(base_url=served.url, headers=AUTH, timeout=30)
    with ScriptedPolicyServer() as upstream:
        body = _body("ref", upstream.url, sampling_params=TRAINER, policy_version="step-7")
        document = http.post("/rollout?wait=final", json=body).json()["result"]
    assert document["policy_version"] == "step-7"
    [read] = reference_validate(tmp_path, [document])["results"]
    assert (read["rollout_id"], read["status"]) == ("ref", "success")
