"""The wire protocol of the rollout server: request bodies, response documents, status vocabulary.

It is osmosis-ai's (0.3.8) rollout protocol, so a trainer written against that SDK's
``RolloutClient`` drives this server unchanged, plus a few optional fields of our own. Every
extension is *added*: a reference client ignores the response fields it does not know, and a
request that uses none of ours is a valid reference request.

``POST /rollout`` body (:class:`SubmitBody`)::

    {"rollout_id": "step3-row7-s2",                 # required, one path segment (no "/", not "." or "..")
     "initial_messages": [{"role": "user", "content": "..."}],      # required
     "chat_completions_url": "http://trainer:8000/v1",               # required: the policy's base URL
     "llm_api_key": "...",                            # optional bearer for that URL (never logged or written)
     "label": "42", "metadata": {...}, "grade": true,
     "agent_timeout_sec": 300, "grader_timeout_sec": 60, "extra_fields": {...},
     # ours, all optional:
     "callback_url": "http://trainer:9000/results",  # push mode: results are POSTed here
     "callback_api_key": "...",                       # sent as "Authorization: Bearer ..." to callback_url
     "model": "Qwen/Qwen3-8B",                        # the model name sent to the policy (default: the server's)
     "row": 7, "sample_index": 2,                     # where the rollout goes in results.jsonl
     "sampling_params": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 1024},  # the trainer's, over the agent's
     "policy_version": "step-12"}                     # recorded on each traced call, echoed in the result

A finished rollout's result (``GET /rollout/{id}/result``, and each push)::

    {"rollout_id": "...", "status": "success",        # queued | running | grading | success | failure | cancelled
     "sample": {"messages": [...], "reward": 1.0, "metrics": {...}, "label": "42", "remove_sample": false,
                "extra_fields": {}, "system_prompt": null, "chat_messages": null},
     "err_message": null, "err_category": null,       # the reference's vocabulary (see REFERENCE_CATEGORY)
     # ours:
     "reward": 1.0, "error": null,                    # error: {"category", "message"} in osmosis's categories
     "stage": "grader", "timings": {"queued": 0.0, "workflow": 0.4, "grader": 0.01},
     "policy_version": "step-12"}                     # only when the request gave one

>>> body = parse_submit(b'{"rollout_id": "r1", "initial_messages": [], "chat_completions_url": "http://h/v1"}')
>>> body.rollout_id, body.grade
('r1', True)
>>> parse_submit(b'{"rollout_id": "r1", "initial_messages": {}, "chat_completions_url": "http://h/v1"}')
Traceback (most recent call last):
...
osmosis_server.protocol.BadRequest: expected an array of message objects, got an object @ $.initial_messages
"""

from __future__ import annotations

import functools
import json
import math
import re
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, NewType

import attrs

from osmosis_core import ErrorCategory, ExecutionResult, ExecutionStatus
from osmosis_core.sampling import SAMPLING_PARAMS, sampling_problems, sampling_schema
from osmosis_trainer.wire import LEASE_HEADER, RolloutStatus, retry_after_seconds  # shared with the client

if TYPE_CHECKING:
    import cattrs

__all__ = [
    "LEASE_HEADER",
    "REFERENCE_CATEGORY",
    "SUBMIT_FIELDS",
    "BadRequest",
    "CancelBody",
    "RolloutStatus",
    "SubmitBody",
    "body_schema",
    "dumps",
    "parse_cancel",
    "parse_submit",
    "result_document",
    "result_from_line",
    "retry_after_seconds",
]

MAX_ID_BYTES: Final = 512
"""The longest ``rollout_id``, in bytes of UTF-8."""


REFERENCE_CATEGORY: Final[Mapping[ErrorCategory, str | None]] = {
    ErrorCategory.TIMEOUT: "timeout",
    ErrorCategory.VALIDATION_ERROR: "validation_error",
    ErrorCategory.AGENT_ERROR: "agent_error",
    ErrorCategory.POLICY_ERROR: "http_error",
    ErrorCategory.INFRA_ERROR: "internal_error",
    ErrorCategory.CANCELLED: None,
}
"""osmosis's error category -> the reference's ``err_category`` (whose client validates the value
against its own enum: timeout, lease_expired, validation_error, http_error, agent_error,
internal_error). The exact osmosis category travels in our own ``error`` field."""

LEASE_EXPIRED: Final = "lease_expired"


class BadRequest(ValueError):
    """A request body the server refuses (422); the message names the field (``@ $.field``)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_decode = json.JSONDecoder(parse_constant=_reject_constant).decode


_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


def loads(raw: bytes) -> Any:
    """Parse a request body: strict UTF-8 JSON (no NaN or Infinity), any failure as :class:`BadRequest`.

    A ``\\uD800``-style escape that decodes to a lone surrogate is refused too (naming where it is):
    such a string is not Unicode, so it could be neither logged, sent nor written as UTF-8.
    """
    try:
        data = _decode(raw.decode("utf-8"))
    except RecursionError:
        raise BadRequest("the body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(raw):  # rare: only then look (a pair of escapes is one valid character)
        where = _lone_surrogate(data, "$")
        if where is not None:
            raise BadRequest(f"a string holds a lone surrogate (\\ud800-\\udfff escape); not valid UTF-8 @ {where}")
    return data


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _lone_surrogate(value: Any, path: str) -> str | None:
    """Where the first string (or key) holding a lone surrogate is, as ``$.a[0].b``; None when none does."""
    if isinstance(value, str):
        return path if _has_surrogate(value) else None
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{i}]")
            if found is not None:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            if _has_surrogate(key):
                return f"{path} (a key)"
            found = _lone_surrogate(item, f"{path}.{key}")
            if found is not None:
                return found
    return None


_dumps_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def dumps(document: Any) -> bytes:
    """A response body: compact UTF-8 JSON. :raises ValueError, TypeError: not JSON-serialisable."""
    return _dumps_compact(document).encode()


# -------------------------------------------------------------------------------------------------
# request bodies: attrs models, structured by a cattrs converter
# -------------------------------------------------------------------------------------------------
#
# Each checked kind of value is a NewType with one structure hook (its check and its message) and
# one JSON schema (for the OpenAPI document, generated from the models by :func:`body_schema`).
# cattrs walks the models and reports every problem with its path (``@ $.field``, ``[i]``).

RolloutId = NewType("RolloutId", str)
"""One path segment, one header value and one log line (see :func:`_rollout_id`)."""
HttpUrl = NewType("HttpUrl", str)
"""An ``http://`` or ``https://`` URL."""
NonEmptyText = NewType("NonEmptyText", str)
"""A non-empty string (an optional field: omitted or null for none)."""
Seconds = NewType("Seconds", float)
"""A positive, finite number of seconds (an optional field: omitted or null for no limit)."""
Index = NewType("Index", int)
"""A whole number >= 0 (an optional field)."""
JsonObject = NewType("JsonObject", dict[str, Any])
"""A JSON object (an optional field)."""
Message = NewType("Message", dict[str, Any])
"""A chat message object."""
RolloutIds = NewType("RolloutIds", list[str])
"""An array of rollout ids (strings)."""
Prefix = NewType("Prefix", str)
"""A non-empty rollout-id prefix."""
SamplingParams = NewType("SamplingParams", dict[str, Any])
"""A trainer's sampling settings (:data:`osmosis_core.sampling.SAMPLING_PARAMS`): an object of known keys."""
Version = NewType("Version", str)
"""A policy version: a non-empty string of at most :data:`MAX_VERSION_CHARS` characters."""

MAX_VERSION_CHARS: Final = 256
"""The longest ``policy_version`` (it is recorded on every traced call of its rollout)."""


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(value), "an object"
    )


def _rollout_id(value: Any, _type: Any = None) -> str:
    """An id that is one path segment, one header value and one log line: printable, valid UTF-8,
    no separator, at most :data:`MAX_ID_BYTES` bytes."""
    if type(value) is not str:
        raise ValueError(f"expected a string, got {_kind(value)}")
    if not value or value in (".", "..") or "/" in value or "\\" in value:
        raise ValueError("rollout_id must be a single path segment (no '/' or '\\', not '.' or '..')")
    if _has_surrogate(value):
        raise ValueError("rollout_id holds a lone surrogate: it is not valid UTF-8")
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise ValueError(
            f"rollout_id must be printable: it holds U+{ord(bad):04X} (a control, format or separator character, "
            "which cannot be a header value or part of one log line)"
        )
    size = len(value.encode("utf-8"))
    if size > MAX_ID_BYTES:
        raise ValueError(f"rollout_id is {size} bytes of UTF-8, more than {MAX_ID_BYTES}")
    return value


def _url(value: Any, _type: Any) -> str:
    if type(value) is not str:
        raise ValueError(f"expected a URL string, got {_kind(value)}")
    if not value.startswith(("http://", "https://")) or len(value) < 8:
        raise ValueError("must be an http:// or https:// URL")
    return value


def _non_empty(value: Any, _type: Any) -> str:
    if type(value) is not str:
        raise ValueError(f"expected a string or null, got {_kind(value)}")
    if not value:
        raise ValueError("must be omitted or a non-empty string")
    return value


def _seconds(value: Any, _type: Any) -> float:
    if type(value) is not float and type(value) is not int:
        raise ValueError(f"expected a number of seconds or null, got {_kind(value)}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a positive, finite number of seconds (omit it for no limit)")
    return float(value)


def _index(value: Any, _type: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"expected a whole number >= 0 or null, got {value!r}")
    return int(value)


def _object(value: Any, _type: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise ValueError(f"expected an object or null, got {_kind(value)}")
    return value


def _message(value: Any, _type: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise ValueError(f"expected a message object, got {_kind(value)}")
    return value


def _boolean(value: Any, _type: Any) -> bool:
    if type(value) is not bool:
        raise ValueError(f"expected true or false, got {_kind(value)}")
    return value


def _rollout_ids(value: Any, _type: Any) -> list[str]:
    if type(value) is not list or not all(type(i) is str for i in value):
        raise ValueError("expected an array of rollout ids")
    return value


def _version(value: Any, _type: Any) -> str:
    if type(value) is not str:
        raise ValueError(f"expected a string or null, got {_kind(value)}")
    if not value or len(value) > MAX_VERSION_CHARS:
        raise ValueError(f"must be omitted or a string of 1 to {MAX_VERSION_CHARS} characters")
    return value


def _sampling_params(value: Any, _type: Any) -> dict[str, Any]:
    """The settings as sent (checked; null values left out): the core checks them again, the same way,
    when the rollout's endpoint is built. The first problem only (the fast converter's)."""
    problems = sampling_problems(value)
    if problems:
        name, problem = problems[0]
        raise ValueError(problem if name is None else f"{name}: {problem}")
    return {name: SAMPLING_PARAMS[name].check(item) for name, item in value.items() if item is not None}


def _sampling_params_named(value: Any, _type: Any) -> dict[str, Any]:
    """:func:`_sampling_params` for the detailed converter: each problem named at its key
    (``@ $.sampling_params.top_p``), as cattrs names a field of a nested class."""
    from cattrs.errors import AttributeValidationNote, ClassValidationError

    problems = sampling_problems(value)
    if not problems:
        return _sampling_params(value, _type)
    errors = []
    for name, problem in problems:
        if name is None:  # not an object at all
            raise ValueError(problem)
        error = ValueError(problem)
        error.__notes__ = [AttributeValidationNote(f"Structuring sampling_params @ attribute {name}", name, Any)]
        errors.append(error)
    raise ClassValidationError("invalid sampling_params", errors, dict)


def _prefix(value: Any, _type: Any) -> str:
    if type(value) is not str:
        raise ValueError(f"expected a string, got {_kind(value)}")
    if not value:
        raise ValueError('an empty prefix would select every rollout; send {"all": true} for that')
    return value


_VALUE_TYPES: Final[dict[Any, tuple[Callable[[Any, Any], Any], dict[str, Any]]]] = {
    RolloutId: (_rollout_id, {"type": "string", "minLength": 1, "maxLength": MAX_ID_BYTES}),
    HttpUrl: (_url, {"type": "string", "format": "uri"}),
    NonEmptyText: (_non_empty, {"type": "string", "minLength": 1}),
    Seconds: (_seconds, {"type": "number", "exclusiveMinimum": 0}),
    Index: (_index, {"type": "integer", "minimum": 0}),
    JsonObject: (_object, {"type": "object"}),
    Message: (_message, {"type": "object"}),
    bool: (_boolean, {"type": "boolean"}),
    RolloutIds: (_rollout_ids, {"type": "array", "items": {"type": "string"}}),
    Prefix: (_prefix, {"type": "string", "minLength": 1}),
    Version: (_version, {"type": "string", "minLength": 1, "maxLength": MAX_VERSION_CHARS}),
    SamplingParams: (_sampling_params, sampling_schema()),
}
"""Each checked kind of value: its structure hook and its JSON schema."""


def _is(wanted: Any) -> Callable[[Any], bool]:
    return lambda type_: bool(type_ == wanted)


def _or_null(hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda value, type_: None if value is None else hook(value, type_)


def _converter(detailed: bool) -> cattrs.Converter:
    """A converter of request bodies (unknown keys are ignored, as the reference does); a
    ``detailed`` one reports every problem with its path, the other stops at the first (faster)."""
    import cattrs

    converter = cattrs.Converter(detailed_validation=detailed)
    for type_, (hook, _) in _VALUE_TYPES.items():
        converter.register_structure_hook(type_, hook)
        converter.register_structure_hook_func(_is(type_ | None), _or_null(hook))  # once, not per call
    if detailed:  # each problem of a trainer's sampling settings named at its key
        converter.register_structure_hook(SamplingParams, _sampling_params_named)
        converter.register_structure_hook_func(_is(SamplingParams | None), _or_null(_sampling_params_named))
    items = converter.get_structure_hook(list[Message])

    def messages(value: Any, type_: Any) -> list[dict[str, Any]]:
        if type(value) is not list:
            raise ValueError(f"expected an array of message objects, got {_kind(value)}")
        for message in value:
            if type(message) is not dict:
                return items(value, type_)  # type: ignore[no-any-return]  # cattrs names the item: [i]
        return value

    converter.register_structure_hook_func(_is(list[dict[str, Any]]), messages)  # each checked as a Message
    return converter


@functools.cache
def _converters() -> tuple[cattrs.Converter, cattrs.Converter]:
    """The fast and the detailed converter, built for the first body a server checks (the client,
    which imports this module for its records, never loads cattrs)."""
    return _converter(detailed=False), _converter(detailed=True)


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@attrs.define(repr=False)
class SubmitBody:
    """A checked ``POST /rollout`` body (see the module docstring for the fields)."""

    rollout_id: RolloutId = attrs.field(
        metadata=_doc(
            "One path segment, one header value, one log line: no '/' or '\\', not '.' or '..', "
            "printable (no control, format or separator character but the space), valid UTF-8 (no lone "
            "surrogate), at most 512 bytes of UTF-8. Admitted once per run folder."
        )
    )
    initial_messages: list[dict[str, Any]] = attrs.field(metadata=_doc("The prompt: chat messages."))
    chat_completions_url: HttpUrl = attrs.field(
        metadata=_doc("The policy's OpenAI-compatible base URL; calls go to {url}/chat/completions.")
    )
    llm_api_key: NonEmptyText | None = attrs.field(
        default=None, kw_only=True, metadata=_doc("Bearer token for chat_completions_url (never logged or written).")
    )
    label: Any = attrs.field(
        default=None, kw_only=True, metadata=_doc("The row's ground truth, given to the grader only (any JSON value).")
    )
    metadata: JsonObject | None = attrs.field(
        default=None, kw_only=True, metadata=_doc("The row's other fields, given to the workflow and the grader.")
    )
    grade: bool = attrs.field(
        default=True,
        kw_only=True,
        metadata=_doc("false: no grading, even with a label. A row without a label is not graded."),
    )
    agent_timeout_sec: Seconds | None = attrs.field(
        default=None, kw_only=True, metadata=_doc("The workflow's timeout (default: the server's).")
    )
    grader_timeout_sec: Seconds | None = attrs.field(
        default=None, kw_only=True, metadata=_doc("The grader's timeout (default: the server's).")
    )
    extra_fields: JsonObject | None = attrs.field(
        default=None, kw_only=True, metadata=_doc("Kept with the request; not used by the server.")
    )
    callback_url: HttpUrl | None = attrs.field(
        default=None,
        kw_only=True,
        metadata=_doc("osmosis: push mode: the workflow's result, then the final one, are POSTed here (no lease)."),
    )
    callback_api_key: NonEmptyText | None = attrs.field(
        default=None, kw_only=True, metadata=_doc("osmosis: sent to callback_url as a bearer token.")
    )
    model: NonEmptyText | None = attrs.field(
        default=None, kw_only=True, metadata=_doc("osmosis: the model name sent to the policy (default: the server's).")
    )
    row: Index | None = attrs.field(
        default=None,
        kw_only=True,
        metadata=_doc("osmosis: the rollout's row in results.jsonl (default: metadata.row, else a running index)."),
    )
    sample_index: Index | None = attrs.field(
        default=None,
        kw_only=True,
        metadata=_doc("osmosis: its sample index in results.jsonl (default: metadata.sample_index, else 0)."),
    )
    sampling_params: SamplingParams | None = attrs.field(
        default=None,
        kw_only=True,
        metadata=_doc(
            "osmosis: the trainer's sampling settings, set on every model call of the rollout over what the agent "
            "asks for (a null value leaves the agent's). With traces on, the policy gateway sets them and each "
            "traced call records them (trace.calls[].sampling) beside the request as the agent sent it; without, "
            "the rollout's osmosis clients do (chat_completion, the Strands and OpenAI Agents integrations). "
            "max_tokens replaces the agent's max_tokens and max_completion_tokens alike; an unknown key is refused."
        ),
    )
    policy_version: Version | None = attrs.field(
        default=None,
        kw_only=True,
        metadata=_doc(
            "osmosis: the version of the policy serving this rollout: recorded on each traced call "
            "(trace.calls[].policy_version), echoed in the result and written to results.jsonl."
        ),
    )

    def __repr__(self) -> str:  # no key in a repr
        return f"SubmitBody(rollout_id={self.rollout_id!r}, chat_completions_url={self.chat_completions_url!r})"


attrs.resolve_types(SubmitBody)  # the annotations are strings (postponed): give cattrs and body_schema the types
SUBMIT_FIELDS: Final = tuple(field.name for field in attrs.fields(SubmitBody))
"""Every field :func:`parse_submit` reads (the OpenAPI document lists the same: it is generated from them)."""


@attrs.define
class CancelBody:
    """A checked ``POST /rollout/cancel`` body: exactly one of ``ids``, ``prefix``, ``all``."""

    ids: RolloutIds | None = attrs.field(default=None, metadata=_doc("The rollouts to cancel."))
    prefix: Prefix | None = attrs.field(
        default=None, metadata=_doc("Cancel every rollout whose id starts with it. Not empty: all=true for all.")
    )
    all: bool = attrs.field(default=False, metadata=_doc("Cancel every rollout in flight."))


attrs.resolve_types(CancelBody)


def _structure[T](raw: bytes, type_: type[T]) -> T:
    data = loads(raw)
    if type(data) is not dict:
        raise BadRequest(f"expected a JSON object, got {_kind(data)} @ $")
    fast, detailed = _converters()
    try:
        return fast.structure(data, type_)
    except (ValueError, TypeError, KeyError):  # a bad body: structured again, to name every problem's place
        pass
    import cattrs

    from osmosis_core.wire import structure_problems  # with cattrs: only for a bad body

    try:
        return detailed.structure(data, type_)
    except cattrs.ClassValidationError as exc:
        raise BadRequest("; ".join(structure_problems(exc, missing="required field missing"))) from None


def parse_submit(raw: bytes) -> SubmitBody:
    """Check a ``POST /rollout`` body. Unknown fields are ignored (as the reference does).

    :raises BadRequest: every problem found, each naming its field.
    """
    return _structure(raw, SubmitBody)


def parse_cancel(raw: bytes) -> CancelBody:
    """Check a ``POST /rollout/cancel`` body. :raises BadRequest: not exactly one selector, or a bad one."""
    body = _structure(raw, CancelBody)
    if (body.ids is not None) + (body.prefix is not None) + body.all != 1:
        raise BadRequest("pass exactly one selector: ids, prefix, or all @ $")
    return body


def body_schema(model: type[Any]) -> dict[str, Any]:
    """The JSON schema of a request model: each field's from its type (:data:`_VALUE_TYPES`, ``X | None``
    adds null), its description and default; the fields without a default are required."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in attrs.fields(model):
        type_ = field.type
        args = typing.get_args(type_)
        nullable = type(None) in args
        if nullable:
            [type_] = [a for a in args if a is not type(None)]
        if type_ is Any:
            schema: dict[str, Any] = {}
        elif type_ == list[dict[str, Any]]:  # initial_messages
            schema = {"type": "array", "items": dict(_VALUE_TYPES[Message][1])}
        else:
            schema = dict(_VALUE_TYPES[type_][1])
        if nullable:
            schema["type"] = [schema["type"], "null"]
        if field.default is attrs.NOTHING:
            required.append(field.name)
        elif field.default is not None:
            schema["default"] = field.default
        if "doc" in field.metadata:
            schema["description"] = field.metadata["doc"]
        properties[field.name] = schema
    document: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        document["required"] = required
    return document


# -------------------------------------------------------------------------------------------------
# results
# -------------------------------------------------------------------------------------------------


def _nonfinite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_nonfinite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_nonfinite(v) for v in value)
    return False


def _finite(metrics: dict[str, Any]) -> Any:
    """``metrics`` with each NaN or infinity spelled as ``results.jsonl`` spells it (the core's rule,
    imported only then: this module stays light)."""
    if not _nonfinite(metrics):
        return metrics
    from osmosis_core.frontend import finite_json

    return finite_json(metrics)


def result_document(result: ExecutionResult, *, label: Any = None, lease_expired: bool = False) -> dict[str, Any]:
    """The wire form of a rollout's final result (the reference's shape, plus ours).

    The reward is null unless the rollout succeeded (as the reference sends it). A sample that is
    not JSON-serialisable is found by the caller when it encodes the document.
    """
    status = result.status
    sample = result.sample
    success = status is ExecutionStatus.SUCCESS
    reward = sample.reward if success and sample is not None else None
    error = result.error
    sample_doc = None
    if sample is not None:
        sample_doc = {
            "messages": sample.messages,
            "reward": reward,
            "metrics": _finite(sample.metrics),  # (a NaN metric as "NaN", as results.jsonl holds it)
            "label": label if isinstance(label, str) else None,
            "remove_sample": False,
            "extra_fields": {},
            "system_prompt": sample.system_prompt,
            "chat_messages": sample.chat_messages,
        }
    if error is None:
        err_category = None
    elif lease_expired:
        err_category = LEASE_EXPIRED
    else:
        err_category = REFERENCE_CATEGORY.get(error.category)
    return {
        "rollout_id": result.rollout_id,
        "status": status.value,
        "sample": sample_doc,
        "err_message": error.message if error is not None else None,
        "err_category": err_category,
        "reward": reward,
        "error": None if error is None else {"category": error.category.value, "message": error.message},
        "stage": result.stage.value,
        "timings": {k: round(v, 6) for k, v in result.timings.items()},
    }


def result_from_line(line: Mapping[str, Any]) -> ExecutionResult:
    """The final result a ``results.jsonl`` line records (the inverse of
    :func:`osmosis_core.frontend.result_line`): how a restarted server answers a recorded rollout.

    :raises ValueError, KeyError: not a result line.
    """
    from osmosis_core.wire import result_from_json

    sample = line.get("sample")
    return result_from_json(
        {
            "rollout_id": line["rollout_id"],
            "stage": line["stage"],
            "status": line["status"],
            "error": line.get("error"),
            "timings": line.get("timings") or {},
            "sample": None
            if sample is None
            else {**sample, "reward": line.get("reward"), "metrics": line.get("metrics") or {}},
        }
    )
