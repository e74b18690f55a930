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
     "row": 7, "sample_index": 2}                     # where the rollout goes in results.jsonl

A finished rollout's result (``GET /rollout/{id}/result``, and each push)::

    {"rollout_id": "...", "status": "success",        # queued | running | grading | success | failure | cancelled
     "sample": {"messages": [...], "reward": 1.0, "metrics": {...}, "label": "42", "remove_sample": false,
                "extra_fields": {}, "system_prompt": null, "chat_messages": null},
     "err_message": null, "err_category": null,       # the reference's vocabulary (see REFERENCE_CATEGORY)
     # ours:
     "reward": 1.0, "error": null,                    # error: {"category", "message"} in osmosis's categories
     "stage": "grader", "timings": {"queued": 0.0, "workflow": 0.4, "grader": 0.01}}

>>> body = parse_submit(b'{"rollout_id": "r1", "initial_messages": [], "chat_completions_url": "http://h/v1"}')
>>> body.rollout_id, body.grade
('r1', True)
>>> parse_submit(b'{"rollout_id": "r1", "initial_messages": {}, "chat_completions_url": "http://h/v1"}')
Traceback (most recent call last):
...
osmosis_server.protocol.BadRequest: expected an array of message objects, got an object @ $.initial_messages
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from osmosis_core import ErrorCategory, ExecutionResult, ExecutionStatus

__all__ = [
    "LEASE_HEADER",
    "REFERENCE_CATEGORY",
    "SUBMIT_FIELDS",
    "BadRequest",
    "CancelBody",
    "RolloutStatus",
    "SubmitBody",
    "dumps",
    "parse_cancel",
    "parse_submit",
    "result_document",
    "result_from_line",
    "retry_after_seconds",
]

LEASE_HEADER: Final = "X-Osmosis-Rollout-Lease"
"""The header a result poll carries its polling-lease token in (the reference's name)."""

MAX_ID_BYTES: Final = 512
"""The longest ``rollout_id``, in bytes of UTF-8."""


class RolloutStatus(enum.StrEnum):
    """A rollout's status on the wire: in flight (queued, running, grading) or final."""

    QUEUED = "queued"
    RUNNING = "running"
    GRADING = "grading"
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def final(self) -> bool:
        """True for success, failure and cancelled."""
        return self in _FINAL


_FINAL: Final = frozenset({RolloutStatus.SUCCESS, RolloutStatus.FAILURE, RolloutStatus.CANCELLED})

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
# POST /rollout
# -------------------------------------------------------------------------------------------------


class SubmitBody:
    """A checked ``POST /rollout`` body (see the module docstring for the fields)."""

    __slots__ = (
        "agent_timeout_sec",
        "callback_api_key",
        "callback_url",
        "chat_completions_url",
        "extra_fields",
        "grade",
        "grader_timeout_sec",
        "initial_messages",
        "label",
        "llm_api_key",
        "metadata",
        "model",
        "rollout_id",
        "row",
        "sample_index",
    )

    def __init__(
        self,
        rollout_id: str,
        initial_messages: list[dict[str, Any]],
        chat_completions_url: str,
        *,
        llm_api_key: str | None = None,
        label: Any = None,
        metadata: dict[str, Any] | None = None,
        grade: bool = True,
        agent_timeout_sec: float | None = None,
        grader_timeout_sec: float | None = None,
        extra_fields: dict[str, Any] | None = None,
        callback_url: str | None = None,
        callback_api_key: str | None = None,
        model: str | None = None,
        row: int | None = None,
        sample_index: int | None = None,
    ) -> None:
        self.rollout_id = rollout_id
        self.initial_messages = initial_messages
        self.chat_completions_url = chat_completions_url
        self.llm_api_key = llm_api_key
        self.label = label
        self.metadata = metadata
        self.grade = grade
        self.agent_timeout_sec = agent_timeout_sec
        self.grader_timeout_sec = grader_timeout_sec
        self.extra_fields = extra_fields
        self.callback_url = callback_url
        self.callback_api_key = callback_api_key
        self.model = model
        self.row = row
        self.sample_index = sample_index

    def __repr__(self) -> str:  # no key in a repr
        return f"SubmitBody(rollout_id={self.rollout_id!r}, chat_completions_url={self.chat_completions_url!r})"


def _rollout_id(value: Any) -> str:
    """An id that is one path segment, one header value and one log line: printable, valid UTF-8,
    no separator, at most :data:`MAX_ID_BYTES` bytes."""
    if not isinstance(value, str):
        raise BadRequest(f"expected a string, got {_kind(value)} @ $.rollout_id")
    if not value or value in (".", "..") or "/" in value or "\\" in value:
        raise BadRequest("rollout_id must be a single path segment (no '/' or '\\', not '.' or '..') @ $.rollout_id")
    if _has_surrogate(value):
        raise BadRequest("rollout_id holds a lone surrogate: it is not valid UTF-8 @ $.rollout_id")
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise BadRequest(
            f"rollout_id must be printable: it holds U+{ord(bad):04X} (a control, format or separator character, "
            "which cannot be a header value or part of one log line) @ $.rollout_id"
        )
    size = len(value.encode("utf-8"))
    if size > MAX_ID_BYTES:
        raise BadRequest(f"rollout_id is {size} bytes of UTF-8, more than {MAX_ID_BYTES} @ $.rollout_id")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(value), "an object"
    )


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise BadRequest(f"expected an array of message objects, got {_kind(value)} @ $.initial_messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise BadRequest(f"expected a message object, got {_kind(message)} @ $.initial_messages[{i}]")
    return value


def _url(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"expected a URL string, got {_kind(value)} @ $.{field}")
    if not value.startswith(("http://", "https://")) or len(value) < 8:
        raise BadRequest(f"must be an http:// or https:// URL @ $.{field}")
    return value


def _optional_str(data: Mapping[str, Any], field: str, *, non_empty: bool = False) -> str | None:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"expected a string or null, got {_kind(value)} @ $.{field}")
    if non_empty and not value:
        raise BadRequest(f"must be omitted or a non-empty string @ $.{field}")
    return value


def _optional_object(data: Mapping[str, Any], field: str) -> dict[str, Any] | None:
    value = data.get(field)
    if value is None or isinstance(value, dict):
        return value
    raise BadRequest(f"expected an object or null, got {_kind(value)} @ $.{field}")


def _optional_seconds(data: Mapping[str, Any], field: str) -> float | None:
    value = data.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(f"expected a number of seconds or null, got {_kind(value)} @ $.{field}")
    if not math.isfinite(value) or value <= 0:
        raise BadRequest(f"must be a positive, finite number of seconds (omit it for no limit) @ $.{field}")
    return float(value)


def _optional_index(data: Mapping[str, Any], field: str) -> int | None:
    value = data.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"expected a whole number >= 0 or null, got {value!r} @ $.{field}")
    return value


SUBMIT_FIELDS: Final = (
    "rollout_id",
    "initial_messages",
    "chat_completions_url",
    "llm_api_key",
    "label",
    "metadata",
    "grade",
    "agent_timeout_sec",
    "grader_timeout_sec",
    "extra_fields",
    "callback_url",
    "callback_api_key",
    "model",
    "row",
    "sample_index",
)
"""Every field :func:`parse_submit` reads (the OpenAPI document lists the same)."""


def parse_submit(raw: bytes) -> SubmitBody:
    """Check a ``POST /rollout`` body. Unknown fields are ignored (as the reference does).

    :raises BadRequest: the first problem found, naming its field.
    """
    data = loads(raw)
    if not isinstance(data, dict):
        raise BadRequest(f"expected a JSON object, got {_kind(data)} @ $")
    for field in ("rollout_id", "initial_messages", "chat_completions_url"):
        if field not in data:
            raise BadRequest(f"required field missing @ $.{field}")
    grade = data.get("grade", True)
    if not isinstance(grade, bool):
        raise BadRequest(f"expected true or false, got {_kind(grade)} @ $.grade")
    return SubmitBody(
        _rollout_id(data["rollout_id"]),
        _messages(data["initial_messages"]),
        _url(data["chat_completions_url"], "chat_completions_url"),
        llm_api_key=_optional_str(data, "llm_api_key", non_empty=True),
        label=data.get("label"),
        metadata=_optional_object(data, "metadata"),
        grade=grade,
        agent_timeout_sec=_optional_seconds(data, "agent_timeout_sec"),
        grader_timeout_sec=_optional_seconds(data, "grader_timeout_sec"),
        extra_fields=_optional_object(data, "extra_fields"),
        callback_url=None if data.get("callback_url") is None else _url(data["callback_url"], "callback_url"),
        callback_api_key=_optional_str(data, "callback_api_key", non_empty=True),
        model=_optional_str(data, "model", non_empty=True),
        row=_optional_index(data, "row"),
        sample_index=_optional_index(data, "sample_index"),
    )


# -------------------------------------------------------------------------------------------------
# POST /rollout/cancel
# -------------------------------------------------------------------------------------------------


class CancelBody:
    """A checked ``POST /rollout/cancel`` body: exactly one of ``ids``, ``prefix``, ``all``."""

    __slots__ = ("all", "ids", "prefix")

    def __init__(self, ids: list[str] | None, prefix: str | None, all: bool) -> None:
        self.ids = ids
        self.prefix = prefix
        self.all = all


def parse_cancel(raw: bytes) -> CancelBody:
    """Check a ``POST /rollout/cancel`` body. :raises BadRequest: not exactly one selector, or a bad one."""
    data = loads(raw)
    if not isinstance(data, dict):
        raise BadRequest(f"expected a JSON object, got {_kind(data)} @ $")
    ids = data.get("ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise BadRequest("expected an array of rollout ids @ $.ids")
    prefix = data.get("prefix")
    if prefix is not None and not isinstance(prefix, str):
        raise BadRequest(f"expected a string, got {_kind(prefix)} @ $.prefix")
    if prefix == "":
        raise BadRequest('an empty prefix would select every rollout; send {"all": true} for that @ $.prefix')
    everything = data.get("all", False)
    if not isinstance(everything, bool):
        raise BadRequest(f"expected true or false, got {_kind(everything)} @ $.all")
    if (ids is not None) + (prefix is not None) + everything != 1:
        raise BadRequest("pass exactly one selector: ids, prefix, or all @ $")
    return CancelBody(ids, prefix, everything)


# -------------------------------------------------------------------------------------------------
# results
# -------------------------------------------------------------------------------------------------


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
            "metrics": sample.metrics,
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
    from osmosis_core.plugin import result_from_json

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


def retry_after_seconds(value: str | None, default: float) -> float:
    """The wait a ``Retry-After`` header asks for, in seconds, kept within 0.05 to 60.

    >>> retry_after_seconds("2", 1.0), retry_after_seconds("soon", 1.0), retry_after_seconds(None, 0.5)
    (2.0, 1.0, 0.5)
    """
    try:
        seconds = float(value) if value is not None else default
    except ValueError:
        return default
    return min(max(seconds, 0.05), 60.0) if math.isfinite(seconds) else default
