"""The OpenAPI 3.1 document of the rollout server (served at ``/openapi.json``).

The request bodies' schemas are generated from the models the server structures them into
(:class:`~osmosis_server.protocol.SubmitBody`, :class:`~osmosis_server.protocol.CancelBody`, by
:func:`~osmosis_server.protocol.body_schema`), so they list exactly the fields it reads, with their
checks. The routes and responses are written out here, and a test keeps them true: every route of
the app is in it with its method, and every status a route answers is listed under that route.
"""

from __future__ import annotations

from typing import Any, Final

from osmosis_server.protocol import LEASE_HEADER, CancelBody, RolloutStatus, SubmitBody, body_schema

__all__ = ["openapi_document"]

_STATUSES: Final = [s.value for s in RolloutStatus]
_CATEGORIES: Final = ["timeout", "lease_expired", "validation_error", "http_error", "agent_error", "internal_error"]
_OSMOSIS_CATEGORIES: Final = ["timeout", "validation_error", "agent_error", "policy_error", "infra_error", "cancelled"]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _problem(description: str) -> dict[str, Any]:
    return _json(_ref("Problem"), description)


_NULLABLE_STR: Final = {"type": ["string", "null"]}

_SAMPLE: Final = {
    "type": "object",
    "properties": {
        "messages": {"type": "array", "items": {"type": "object"}},
        "reward": {"type": ["number", "null"]},
        "metrics": {"type": "object"},
        "label": _NULLABLE_STR,
        "remove_sample": {"type": "boolean"},
        "extra_fields": {"type": "object"},
        "system_prompt": _NULLABLE_STR,
        "chat_messages": {"type": ["array", "null"], "items": {"type": "object"}},
    },
    "required": ["messages", "reward", "metrics"],
}

_RESULT: Final = {
    "type": "object",
    "properties": {
        "rollout_id": {"type": "string"},
        "status": {"enum": _STATUSES},
        "sample": {"anyOf": [_ref("Sample"), {"type": "null"}]},
        "err_message": _NULLABLE_STR,
        "err_category": {"enum": [*_CATEGORIES, None]},
        "reward": {
            "type": ["number", "null"],
            "description": "osmosis: the sample's reward when the rollout succeeded.",
        },
        "error": {
            "description": "osmosis: the failure in osmosis's own categories.",
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"category": {"enum": _OSMOSIS_CATEGORIES}, "message": {"type": "string"}},
                },
                {"type": "null"},
            ],
        },
        "stage": {"enum": ["workflow", "grader"], "description": "osmosis: the stage the result reports."},
        "timings": {
            "type": "object",
            "additionalProperties": {"type": "number"},
            "description": "osmosis: seconds per phase.",
        },
        "final": {"type": "boolean", "description": "osmosis, pushes only: true on a rollout's last delivery."},
        "policy_version": {
            "type": "string",
            "description": "osmosis, when the request gave one: its policy_version (each traced call records it too).",
        },
        "sampling_params": {
            "type": "object",
            "description": "osmosis, when the request gave them: its sampling_params as the server took them "
            "(null values left out, numbers as floats); with traces on, each call's trace.calls[].sampling says "
            "what the gateway set on it.",
        },
        "trace": {
            "type": ["object", "null"],
            "description": "osmosis, with traces on (osmosis serve --traces): the rollout's training trace, "
            "a traces.jsonl line's form (complete, incomplete_reason, capture, calls with token ids and logprobs).",
        },
    },
    "required": ["rollout_id", "status"],
}

_ADMISSION: Final = {
    "type": "object",
    "properties": {
        "rollout_id": {"type": "string"},
        "status": {"enum": _STATUSES},
        "polling_lease_token": {"type": "string", "minLength": 1},
        "result_wait_timeout_sec": {"type": "number"},
        "polling_lease_timeout_sec": {"type": "number"},
        "result": {
            "description": "osmosis, with ?wait=final only: the result (final) or the current status.",
            "$ref": "#/components/schemas/Result",
        },
    },
    "required": ["rollout_id", "status", "polling_lease_token", "result_wait_timeout_sec", "polling_lease_timeout_sec"],
}

_RETRY_AFTER: Final = {
    "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before trying again."}
}
_UNAUTHORIZED: Final = _problem("No token, or the wrong one: send Authorization: Bearer <token>.")


def openapi_document(version: str) -> dict[str, Any]:
    """The document, for server version ``version``."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "osmosis rollout server",
            "version": version,
            "description": "Runs agent rollouts for a trainer: submit, poll (or receive pushes), cancel. "
            "Wire-compatible with osmosis-ai 0.3.8's rollout server; fields marked 'osmosis:' are additions.",
        },
        "security": [{"bearer": []}],
        "paths": {
            "/rollout": {
                "post": {
                    "operationId": "submit",
                    "summary": "Admit one rollout; it runs at once or waits for a backend slot.",
                    "parameters": [
                        {
                            "name": "wait",
                            "in": "query",
                            "required": False,
                            "schema": {"enum": ["final"]},
                            "description": "osmosis: answer once the rollout is final (or result_wait_timeout_sec "
                            "has passed), with its result in the admission's 'result'.",
                        }
                    ],
                    "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("SubmitBody")}}},
                    "responses": {
                        "202": _json(_ref("Admission"), "Admitted: poll its result with the lease token."),
                        "401": _UNAUTHORIZED,
                        "409": _json(
                            {"allOf": [_ref("Problem"), {"anyOf": [_ref("Admission"), {"type": "object"}]}]},
                            "The id is taken: in flight, or recorded in the run folder (by this server or an "
                            "earlier one on the same folder). When the body is identical (a resubmit after a lost "
                            "answer) the admission is included: poll its result with that lease.",
                        ),
                        "413": _problem("The body is over the size limit."),
                        "422": _problem("The body is not valid; the message names the field."),
                        "429": {
                            **_problem("The queue is full: try again after Retry-After seconds."),
                            "headers": _RETRY_AFTER,
                        },
                        "503": {
                            **_problem(
                                "The server is draining (shutting down), its backend is unavailable, or the "
                                "admission cannot be recorded in the run folder. Nothing was admitted."
                            ),
                            "headers": _RETRY_AFTER,
                        },
                    },
                }
            },
            "/rollout/{rollout_id}/result": {
                "get": {
                    "operationId": "result",
                    "summary": "Long poll: the final result at once, else the status after the next change "
                    "(or result_wait_timeout_sec). Each poll renews the lease.",
                    "parameters": [
                        {"name": "rollout_id", "in": "path", "required": True, "schema": {"type": "string"}},
                        {"name": LEASE_HEADER, "in": "header", "required": True, "schema": {"type": "string"}},
                        {
                            "name": "wait",
                            "in": "query",
                            "required": False,
                            "schema": {"enum": ["final"]},
                            "description": "osmosis: wait through status changes until the rollout is final "
                            "(or result_wait_timeout_sec); one poll per rollout.",
                        },
                    ],
                    "responses": {
                        "200": _json(
                            _ref("Result"),
                            "The result (final) or the current status. A result that left memory after "
                            "retention_sec, or was recorded by an earlier server on the run folder, is read "
                            "back from results.jsonl.",
                        ),
                        "401": _UNAUTHORIZED,
                        "403": _problem("The lease token is not this rollout's."),
                        "404": _problem("No such rollout: never admitted on this run folder."),
                        "410": _json(
                            {
                                "allOf": [
                                    _ref("Problem"),
                                    {
                                        "type": "object",
                                        "properties": {
                                            "rollout_id": {"type": "string"},
                                            "status": {"const": "lost"},
                                            "attempts": {"type": "integer", "minimum": 1},
                                        },
                                    },
                                ]
                            },
                            "osmosis: lost. A server on this run folder admitted it, then stopped (killed, "
                            "crashed) before it was recorded. Submit it again: it runs once more.",
                        ),
                        "422": _problem("The lease header is missing."),
                        "500": _problem("Recorded, but its line in results.jsonl cannot be read back."),
                    },
                }
            },
            "/rollout/cancel": {
                "post": {
                    "operationId": "cancel",
                    "summary": "Cancel rollouts in flight: exactly one of ids, prefix, all.",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("CancelBody")}}},
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "dispositions": {
                                        "type": "object",
                                        "additionalProperties": {
                                            "enum": ["cancelled_queued", "cancelled_running", "not_found"]
                                        },
                                    }
                                },
                            },
                            "What happened to each selected rollout.",
                        ),
                        "401": _UNAUTHORIZED,
                        "413": _problem("The body is over the size limit."),
                        "422": _problem("Not exactly one selector, or a bad one."),
                    },
                }
            },
            "/health": {
                "get": {
                    "operationId": "health",
                    "summary": "The backend's health, the server's identity, lifecycle and counters.",
                    "responses": {"200": _json({"type": "object"}, "Health."), "401": _UNAUTHORIZED},
                }
            },
            "/livez": {
                "get": {
                    "operationId": "livez",
                    "summary": "Liveness, without authentication and without detail.",
                    "security": [],
                    "responses": {"200": _json({"type": "object"}, "The process is up.")},
                }
            },
            "/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document.",
                    "responses": {"200": _json({"type": "object"}, "The OpenAPI document."), "401": _UNAUTHORIZED},
                }
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "SubmitBody": body_schema(SubmitBody),
                "Admission": _ADMISSION,
                "Result": _RESULT,
                "Sample": _SAMPLE,
                "CancelBody": body_schema(CancelBody),
                "Problem": {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]},
            },
        },
    }
