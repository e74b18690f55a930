"""Malformed requests, generated with hypothesis, never get a 5xx (nor break the server)."""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from server_helpers import TOKEN
from workflows import Trivial

from osmosis_core import LocalBackend
from osmosis_server import LEASE_HEADER
from osmosis_server.protocol import SUBMIT_FIELDS

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
# bodies near a valid one: every field present or not, each with any JSON value
near_valid = st.fixed_dictionaries(
    {},
    optional={
        "rollout_id": st.text(max_size=30) | json_values,
        "initial_messages": st.lists(st.dictionaries(st.text(max_size=5), json_values, max_size=2), max_size=2)
        | json_values,
        "chat_completions_url": st.sampled_from(["http://127.0.0.1:9/v1", "https://x", "ftp://x", ""]) | json_values,
        **{field: json_values for field in SUBMIT_FIELDS[3:]},
    },
)
bodies = (
    st.binary(max_size=200)
    | json_values.map(lambda v: json.dumps(v).encode())
    | near_valid.map(lambda v: json.dumps(v).encode())
    | st.sampled_from([b"NaN", b'{"rollout_id": Infinity}', b"[" * 5000, b'{"a": "\\ud800"}', b"\xff\xfe{}"])
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from server_helpers import Served

    from osmosis_server import ServerSettings, create_app

    app = create_app(
        LocalBackend(Trivial, max_concurrent=64),
        token=TOKEN,
        run_dir=tmp_path_factory.mktemp("fuzz") / "run",
        settings=ServerSettings(grace_sec=1),
        configure_logging=False,
    )
    with Served(app) as served, httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        yield served, http


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, path=st.sampled_from(["/rollout", "/rollout/cancel"]))
def test_malformed_posts_never_get_a_5xx(server, body, path):
    _, http = server
    response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code < 500, (body, response.text)
    assert response.status_code in (200, 202, 409, 422, 429), (body, response.text)


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rollout_id=st.text(min_size=1, max_size=40), lease=st.text(max_size=60))
@example(rollout_id="0", lease=" ")
def test_any_result_poll_gets_a_4xx_not_a_5xx(server, rollout_id, lease):
    _, http = server
    headers = (
        # what an HTTP client can send at all: printable ASCII without surrounding white space (h11 refuses the rest)
        {LEASE_HEADER: lease} if lease.isascii() and lease.isprintable() and lease == lease.strip(" \t") else {}
    )
    response = http.get(f"/rollout/{quote(rollout_id, safe='')}/result", headers=headers)
    assert response.status_code in (403, 404, 422), response.text


def test_the_server_still_serves_after_the_fuzzing(server):
    served, http = server
    assert http.get("/health").json()["status"] == "ok"
    assert served.service.health()["server"]["counts"].get("error:infra_error", 0) == 0


BEYOND_THE_SCHEMA = {"rollout_id", "chat_completions_url", "callback_url"}
"""Fields whose checks the schema states only in part (path segment, printable, http(s) scheme)."""


@settings(max_examples=300, deadline=None, database=None)
@given(body=near_valid)
@example(body={"rollout_id": "r", "initial_messages": [{}, 1], "chat_completions_url": "http://h/v1", "row": -1})
@example(body={"agent_timeout_sec": 0, "grade": None, "metadata": [], "llm_api_key": ""})
def test_the_openapi_submit_schema_refuses_exactly_what_the_server_refuses(body):
    """The SubmitBody schema of /openapi.json is generated from the model the server structures a
    body into: a field the server refuses is one the schema refuses, and the other way round (but
    for the checks a JSON schema cannot state), every problem named at its field."""
    jsonschema = pytest.importorskip("jsonschema")
    from osmosis_server.openapi import openapi_document
    from osmosis_server.protocol import BadRequest, loads, parse_submit

    raw = json.dumps(body).encode()
    try:
        loads(raw)
    except BadRequest:  # not JSON at all (an infinity): refused before any field is looked at
        return
    problem = ""
    try:
        parse_submit(raw)
    except BadRequest as exc:
        problem = str(exc)
    refused = set(re.findall(r"@ \$\.(\w+)", problem))
    assert refused or not problem, problem  # every problem is named at its field
    schema = openapi_document("test")["components"]["schemas"]["SubmitBody"]
    invalid: set[str] = set()
    for error in jsonschema.Draft202012Validator(schema).iter_errors(body):
        if error.validator == "required":
            invalid |= set(schema["required"]) - set(body)
        else:
            invalid.add(str(error.absolute_path[0]))
    # JSON Schema counts 1.0 as an integer; the server takes only JSON integers for integer fields.
    whole_floats = {key for key, value in body.items() if isinstance(value, float) and value.is_integer()}
    beyond = BEYOND_THE_SCHEMA | whole_floats
    assert refused - beyond == invalid - beyond, (body, refused, invalid)
    assert invalid <= refused, (body, refused, invalid)  # the schema never refuses what the server takes
