"""The wire protocol: every status code provoked, and the OpenAPI document kept true to it."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from server_helpers import TOKEN, read_lines, run
from workflows import EndsWithLabel, Sleepy, Trivial

from osmosis_core import LocalBackend
from osmosis_server import LEASE_HEADER, RolloutStatus, ServerSettings
from osmosis_server.protocol import SUBMIT_FIELDS
from osmosis_trainer import RolloutClient, RolloutConflict, RolloutRequest

AUTH = {"Authorization": f"Bearer {TOKEN}"}
POLICY = "http://127.0.0.1:9/v1"  # never called by these workflows


def body(rollout_id: str, **more):
    return {
        "rollout_id": rollout_id,
        "initial_messages": [{"role": "user", "content": "hi"}],
        "chat_completions_url": POLICY,
        **more,
    }


class Recorder:
    """An HTTP client that remembers which (method, route, status) it saw."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, headers=AUTH, timeout=30)
        self.seen: set[tuple[str, str, int]] = set()

    def request(self, method: str, route: str, path: str | None = None, **kwargs) -> httpx.Response:
        response = self.http.request(method, path or route, **kwargs)
        self.seen.add((method.lower(), route, response.status_code))
        return response


def test_every_status_of_the_protocol_is_provoked_and_documented(serve):
    settings = ServerSettings(max_queued=1, lease_timeout_sec=60, result_wait_sec=0.3, max_body_mb=1, grace_sec=1)
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel, max_concurrent=1), settings=settings)
    http = Recorder(served.url)
    result_route = "/rollout/{rollout_id}/result"

    ok = http.request("POST", "/rollout", json=body("a", metadata={"sleep": 30}, label="42"))
    assert ok.status_code == 202
    admission = ok.json()
    assert set(admission) == {
        "rollout_id",
        "status",
        "polling_lease_token",
        "result_wait_timeout_sec",
        "polling_lease_timeout_sec",
    }
    assert admission["status"] == "queued"
    assert admission["polling_lease_timeout_sec"] > admission["result_wait_timeout_sec"]
    # 409: the id is taken by another body; the same body again is "already admitted", with the lease
    other = http.request("POST", "/rollout", json=body("a", metadata={"sleep": 1}))
    assert other.status_code == 409
    assert "polling_lease_token" not in other.json()
    same = http.request("POST", "/rollout", json=body("a", metadata={"sleep": 30}, label="42"))
    assert same.status_code == 409
    assert same.json()["polling_lease_token"] == admission["polling_lease_token"]
    # 422: bad bodies, each naming its field
    for bad, field in (
        (b"not json", "not JSON"),
        (json.dumps(body("a/b")).encode(), "$.rollout_id"),
        (json.dumps(body("..")).encode(), "$.rollout_id"),
        (json.dumps({"rollout_id": "x"}).encode(), "$.initial_messages"),
        (json.dumps(body("x", chat_completions_url="ftp://h")).encode(), "$.chat_completions_url"),
        (json.dumps(body("x", agent_timeout_sec=-1)).encode(), "$.agent_timeout_sec"),
        (json.dumps(body("x", llm_api_key="")).encode(), "$.llm_api_key"),
        (json.dumps(body("x", grade="yes")).encode(), "$.grade"),
        (
            b'{"rollout_id": "x", "initial_messages": [], "chat_completions_url": "http://h/v1", "metadata": NaN}',
            "JSON",
        ),
    ):
        response = http.request("POST", "/rollout", content=bad, headers={"Content-Type": "application/json"})
        assert response.status_code == 422, bad
        assert field in response.json()["detail"], (bad, response.json())
    # 429: one slot, one queued: a third is refused, with Retry-After
    assert http.request("POST", "/rollout", json=body("b", metadata={"sleep": 30})).status_code == 202
    full = http.request("POST", "/rollout", json=body("c"))
    assert full.status_code == 429
    assert int(full.headers["Retry-After"]) >= 1
    # results: 200 (a status while in flight), 403 wrong lease, 404 unknown, 422 no lease header
    lease = {LEASE_HEADER: admission["polling_lease_token"]}
    polled = http.request("GET", result_route, "/rollout/a/result", headers=lease)
    assert polled.status_code == 200
    assert polled.json() == {"rollout_id": "a", "status": "running"}
    assert http.request("GET", result_route, "/rollout/a/result", headers={LEASE_HEADER: "x" * 43}).status_code == 403
    assert http.request("GET", result_route, "/rollout/nope/result", headers=lease).status_code == 404
    assert http.request("GET", result_route, "/rollout/a/result").status_code == 422
    # cancel: 200 with dispositions, 422 unless exactly one selector
    assert http.request("POST", "/rollout/cancel", json={}).status_code == 422
    assert http.request("POST", "/rollout/cancel", json={"ids": ["a"], "all": True}).status_code == 422
    cancelled = http.request("POST", "/rollout/cancel", json={"ids": ["a", "b", "zzz"]})
    assert cancelled.status_code == 200
    assert cancelled.json() == {"dispositions": {"a": "cancelled_running", "b": "cancelled_queued", "zzz": "not_found"}}
    final = http.request("GET", result_route, "/rollout/a/result", headers=lease).json()
    assert final["status"] == "cancelled"
    assert final["error"]["category"] == "cancelled"
    assert "cancelled by a /rollout/cancel request during the workflow stage" in final["error"]["message"]
    # 413: a body over the limit
    big = http.request(
        "POST", "/rollout", content=b"x" * (2 * 1024 * 1024), headers={"Content-Type": "application/json"}
    )
    assert big.status_code == 413
    # health, livez, openapi
    health = http.request("GET", "/health").json()
    assert health["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": 0}
    assert health["max_concurrency"] == 1
    assert health["server"]["capacity"] == 2
    assert {"instance_id", "process_id"} <= set(health)
    assert http.request("GET", "/livez").json() == {"status": "ok"}
    document = http.request("GET", "/openapi.json").json()
    # 401 on every route but /livez
    bare = httpx.Client(base_url=served.url, timeout=30)
    for method, route, path in (
        ("POST", "/rollout", "/rollout"),
        ("GET", result_route, "/rollout/a/result"),
        ("POST", "/rollout/cancel", "/rollout/cancel"),
        ("GET", "/health", "/health"),
        ("GET", "/openapi.json", "/openapi.json"),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
            response = bare.request(method, path, headers=headers, json={})
            assert response.status_code == 401, (method, path, headers)
            http.seen.add((method.lower(), route, 401))
    assert bare.get("/livez").status_code == 200
    # 503: draining
    served.call(served.service.drain)
    draining = http.request("POST", "/rollout", json=body("d"))
    assert draining.status_code == 503
    assert draining.headers["Retry-After"]

    # the document is true to the app: the same routes, every status seen documented, the same submit fields
    routes = {
        (method.lower(), route.path) for route in served.app.routes for method in route.methods if method != "HEAD"
    }
    documented = {(method, path) for path, item in document["paths"].items() for method in item}
    assert routes == documented
    for method, route, status in http.seen:
        responses = document["paths"][route][method]["responses"]
        assert str(status) in responses, f"{method.upper()} {route} answered {status}, which the document omits"
    # written out here: SUBMIT_FIELDS and the schema are both generated from SubmitBody now
    wire_fields = {
        "rollout_id", "initial_messages", "chat_completions_url", "llm_api_key", "label", "metadata", "grade",
        "agent_timeout_sec", "grader_timeout_sec", "extra_fields", "callback_url", "callback_api_key", "model",
        "row", "sample_index", "sampling_params", "policy_version",
    }  # fmt: skip
    assert set(document["components"]["schemas"]["SubmitBody"]["properties"]) == wire_fields
    assert set(SUBMIT_FIELDS) == wire_fields
    assert {s for (_, _, s) in http.seen} >= {200, 202, 401, 403, 404, 409, 413, 422, 429, 503}


def test_an_identical_resubmit_is_already_admitted_and_another_body_conflicts(serve):
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel))
    request = RolloutRequest(
        rollout_id="same",
        initial_messages=[{"role": "user", "content": "hi"}],
        chat_completions_url=POLICY,
        label="42",
        metadata={"sleep": 0.3},
    )

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        first = await client.submit(request)
        again = await client.submit(request)  # a trainer resubmitting after a lost answer
        assert again.resubmitted
        assert not first.resubmitted
        assert again.lease_token == first.lease_token
        with pytest.raises(RolloutConflict):
            await client.submit(RolloutRequest(rollout_id="same", initial_messages=[], chat_completions_url=POLICY))
        return await client.result(again)

    result = run(go)
    assert result.status is RolloutStatus.SUCCESS
    assert result.reward == 1.0
    assert len(read_lines(served.service.folder.results_path)) == 1  # ran once


def test_a_rollout_nobody_polls_is_cancelled_when_its_lease_expires(serve):
    settings = ServerSettings(lease_timeout_sec=0.6, result_wait_sec=0.2, grace_sec=1)
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel), settings=settings)
    http = httpx.Client(base_url=served.url, headers=AUTH, timeout=30)
    forgotten = http.post("/rollout", json=body("forgotten", metadata={"sleep": 30})).json()

    async def watched():
        client = RolloutClient(served.url, token=TOKEN)
        return await client.run(  # polled all along: it outlives many lease periods
            RolloutRequest(
                rollout_id="watched",
                initial_messages=[{"role": "user", "content": "hi"}],
                chat_completions_url=POLICY,
                label="42",
                metadata={"sleep": 2.0},
            )
        )

    assert run(watched).reward == 1.0
    late = http.get("/rollout/forgotten/result", headers={LEASE_HEADER: forgotten["polling_lease_token"]}).json()
    assert late["status"] == "cancelled"
    assert late["err_category"] == "lease_expired"
    assert late["error"]["category"] == "cancelled"
    assert "polling lease expired" in late["error"]["message"]
    lines = {line["rollout_id"]: line for line in read_lines(served.service.folder.results_path)}
    assert lines["forgotten"]["status"] == "cancelled"
    assert "lease" in lines["forgotten"]["error"]["message"]
    assert lines["watched"]["status"] == "success"
    assert served.service.health()["server"]["counts"]["lease_expired"] == 1


def test_cancel_by_ids_prefix_and_all_reaches_queued_and_running_rollouts(serve):
    settings = ServerSettings(result_wait_sec=0.5, grace_sec=1)
    served = serve(LocalBackend(Sleepy, max_concurrent=2), settings=settings)
    ids = [f"p-{i}" for i in range(3)] + [f"q-{i}" for i in range(3)]

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        admissions = {}
        for rid in ids:
            admissions[rid] = await client.submit(
                RolloutRequest(
                    rollout_id=rid,
                    initial_messages=[{"role": "user", "content": "hi"}],
                    chat_completions_url=POLICY,
                    metadata={"sleep": 60},
                )
            )
        for rid in ("p-0", "p-1"):  # the two with a slot: wait until they run
            while (await client.poll(admissions[rid])).status is not RolloutStatus.RUNNING:
                pass
        by_prefix = await client.cancel(prefix="p-")
        assert by_prefix == {"p-0": "cancelled_running", "p-1": "cancelled_running", "p-2": "cancelled_queued"}
        again = await client.cancel(["p-0", "q-0"])
        assert again["p-0"] in ("not_found", "cancelled_running")  # idempotent: finished or still reporting
        assert again["q-0"] in ("cancelled_running", "cancelled_queued")
        rest = await client.cancel(all=True)
        assert set(rest) <= {"q-0", "q-1", "q-2"}
        assert "q-1" in rest
        assert "q-2" in rest
        assert await client.cancel(all=True) == {}
        return {rid: await client.result(admission) for rid, admission in admissions.items()}

    results = run(go)
    for _rid, result in results.items():
        assert result.status is RolloutStatus.CANCELLED, result
        assert result.error.category.value == "cancelled"
    assert "while queued" in results["p-2"].error.message
    assert "during the workflow stage" in results["p-0"].error.message
    lines = read_lines(served.service.folder.results_path)
    assert sorted(line["rollout_id"] for line in lines) == sorted(ids)
    assert {line["status"] for line in lines} == {"cancelled"}


def test_grade_false_skips_grading_and_an_unlabeled_row_is_not_graded(serve):
    served = serve(LocalBackend(Trivial, grader=EndsWithLabel))

    def request(rid: str, **more) -> RolloutRequest:
        return RolloutRequest(
            rollout_id=rid, initial_messages=[{"role": "user", "content": "hi"}], chat_completions_url=POLICY, **more
        )

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        return {
            rid: await client.run(req)
            for rid, req in {
                "graded": request("graded", label="42"),
                "wrong": request("wrong", label="7"),
                "not-graded": request("not-graded", label="42", grade=False),
                "unlabeled": request("unlabeled"),
            }.items()
        }

    results = run(go)
    assert (results["graded"].reward, results["graded"].stage) == (1.0, "grader")
    assert (results["wrong"].reward, results["wrong"].stage) == (0.0, "grader")
    for rid in ("not-graded", "unlabeled"):
        result = results[rid]
        assert result.status is RolloutStatus.SUCCESS, result
        assert result.error is None, result
        assert result.reward is None
        assert result.stage == "workflow"
        assert result.sample.messages[-1]["content"] == "#### 42"


def test_a_failing_workflow_is_a_result_with_both_vocabularies(serve):
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel))

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        return await client.run(
            RolloutRequest(
                rollout_id="bad",
                initial_messages=[{"role": "user", "content": "hi"}],
                chat_completions_url=POLICY,
                label="42",
                metadata={"fail": "the tool broke"},
            )
        )

    result = run(go)
    assert result.status is RolloutStatus.FAILURE
    assert result.error.category.value == "validation_error"
    assert "the tool broke" in result.error.message
    assert result.err_category == "validation_error"
    assert result.reward is None
    time.sleep(0.05)
    [line] = read_lines(served.service.folder.results_path)
    assert line["status"] == "failure"
    assert line["error"]["category"] == "validation_error"


def test_a_poll_returns_at_each_status_change_unless_it_asks_to_wait_for_the_final(serve):
    served = serve(LocalBackend(Sleepy, grader=EndsWithLabel), settings=ServerSettings(result_wait_sec=10, grace_sec=1))
    http = httpx.Client(base_url=served.url, headers=AUTH, timeout=30)
    metadata = {"sleep": 0.3, "grade_sleep": 0.3}
    plain = http.post("/rollout", json=body("plain", label="42", metadata=metadata)).json()
    final = http.post("/rollout", json=body("final", label="42", metadata=metadata)).json()
    plain_lease = {LEASE_HEADER: plain["polling_lease_token"]}
    statuses = [http.get("/rollout/plain/result", headers=plain_lease).json()["status"]]  # running
    while statuses[-1] not in ("success", "failure", "cancelled"):
        statuses.append(http.get("/rollout/plain/result", headers=plain_lease).json()["status"])
    assert statuses == ["running", "grading", "success"] or statuses == ["grading", "success"], statuses
    started = time.monotonic()
    answer = http.get("/rollout/final/result?wait=final", headers={LEASE_HEADER: final["polling_lease_token"]}).json()
    assert answer["status"] == "success"
    assert answer["reward"] == 1.0
    assert time.monotonic() - started < 5


def test_a_submit_can_wait_for_its_result_in_one_request(serve):
    served = serve(LocalBackend(Trivial, grader=EndsWithLabel))
    http = httpx.Client(base_url=served.url, headers=AUTH, timeout=30)
    answer = http.post("/rollout?wait=final", json=body("inline", label="42"))
    assert answer.status_code == 202
    data = answer.json()
    assert data["rollout_id"] == "inline"
    assert data["polling_lease_token"]
    assert data["result"]["status"] == "success"
    assert data["result"]["reward"] == 1.0
    polled = http.get("/rollout/inline/result", headers={LEASE_HEADER: data["polling_lease_token"]}).json()
    assert polled == data["result"]  # the same result stays readable by polling


def test_a_nan_metric_reaches_the_trainer_as_its_spelling_and_the_rollout_succeeds(serve):
    """A metric that is not a number does not fail the rollout (as in results.jsonl): the result
    document holds it as "NaN", strict JSON a trainer's parser reads."""
    from workflows import NanMetric

    from osmosis_core.testing import ScriptedPolicyServer

    served = serve(LocalBackend(NanMetric), settings=ServerSettings(grace_sec=1))
    with ScriptedPolicyServer() as upstream:
        http = httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        body = {"rollout_id": "nan", "initial_messages": [{"role": "user", "content": "6 * 7"}],
                "chat_completions_url": upstream.url}  # fmt: skip
        lease = http.post("/rollout", json=body).json()["polling_lease_token"]
        raw = http.get("/rollout/nan/result?wait=final", headers={LEASE_HEADER: lease}).content
    document = json.loads(raw, parse_constant=lambda name: pytest.fail(f"not strict JSON: {name}"))
    assert document["status"] == "success", document
    assert document["sample"]["metrics"] == {"ratio": "NaN", "turns": 1}
