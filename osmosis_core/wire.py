"""The JSON forms of the records: one cattrs converter for every file and wire format.

``results.jsonl`` lines, the files that cross a Harbor trial's boundary, and the rollout server's
results are all written and read by :data:`converter`, so a record means the same everywhere and
nothing invalid gets in quietly: reading back a result whose reward is not a finite number, whose
status has no error, or whose category is unknown fails with a message naming the field.

Every format is strict JSON. A metric that is NaN or infinite (``0/0`` of a precision with no
predictions) is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (protobuf's
JSON spelling; ``float()`` reads each back), so it neither fails its rollout nor breaks a reader;
a non-finite number anywhere else in a sample is an error that :func:`nonfinite_paths` names.

Also here, for a plugin that reads or checks these formats: :func:`structure_problems` (the one
formatter of structuring errors) and ``chat_completion_problem`` (what makes a JSON body not a chat
completion; documented in :mod:`osmosis_core.policy`).

>>> from osmosis_core import ExecutionResult, ExecutionStage, ExecutionStatus, RolloutSample
>>> r = ExecutionResult("r1", ExecutionStage.WORKFLOW, ExecutionStatus.SUCCESS,
...                     sample=RolloutSample(messages=[{"role": "user", "content": "hi"}], reward=1))
>>> result_from_json(result_to_json(r)) == r
True
>>> result_from_json({**result_to_json(r), "sample": {"messages": [], "reward": "1.0"}})
Traceback (most recent call last):
...
ValueError: not a result: expected a number, got '1.0' @ $.sample.reward
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from typing import Any

import attrs
import cattrs
import cattrs.gen
from cattrs.errors import BaseValidationError, ClassValidationError, ForbiddenExtraKeysError

from osmosis_core.policy import chat_completion_problem
from osmosis_core.records import (
    ErrorCategory,
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    Message,
    PolicyEndpoint,
    RolloutSample,
)

__all__ = [
    "NONFINITE",
    "chat_completion_problem",
    "converter",
    "finite_json",
    "grader_metrics",
    "nonfinite_paths",
    "policy_from_json",
    "policy_to_json",
    "result_from_json",
    "result_line",
    "result_to_json",
    "sample_from_json",
    "sample_to_json",
    "structure_problems",
]


def register_strict_scalars(conv: cattrs.Converter) -> None:
    """Structure hooks that refuse coercions: no ``"8"`` for an int, no ``1.5`` or ``True`` for a whole number."""

    def strict(kind: type[Any], wanted: str) -> Any:
        def hook(value: Any, _type: Any) -> Any:
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                return float(value)
            if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                raise ValueError(f"expected {wanted}, got {value!r}")
            return value

        return hook

    for kind, wanted in ((int, "a whole number"), (float, "a number"), (str, "a string"), (bool, "true or false")):
        conv.register_structure_hook(kind, strict(kind, wanted))


for _record in (ErrorInfo, RolloutSample, ExecutionResult, ExecutionRequest, PolicyEndpoint):
    attrs.resolve_types(_record)  # the records' annotations are strings (postponed): give cattrs the types

converter = cattrs.Converter()
"""The converter of every record format (unknown keys are ignored, for newer writers)."""
register_strict_scalars(converter)


def _enum(value: Any, type_: type[enum.Enum]) -> enum.Enum:
    try:
        return type_(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in type_)
        raise ValueError(f"expected one of {choices}, got {value!r}") from None


for _kind in (ErrorCategory, ExecutionStage, ExecutionStatus):  # str enums: the str hooks would take them
    converter.register_structure_hook(_kind, _enum)
    converter.register_unstructure_hook(_kind, lambda member: member.value)


NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How a non-finite metric is written (strict JSON has no such number), and the value each spelling stands for."""


def _spelling(value: float) -> str:
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def nonfinite_paths(value: Any, path: str = "$") -> list[tuple[str, float]]:
    """``(path, value)`` of every NaN or infinite float in ``value`` (dicts, lists and tuples walked),
    the path written from ``path`` as ``metrics.accuracy`` / ``messages[2].content``.

    >>> nonfinite_paths({"loss": float("nan"), "steps": [1.0, float("inf")]}, "metrics")
    [('metrics.loss', nan), ('metrics.steps[1]', inf)]
    """
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(path, value)]
    found: list[tuple[str, float]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            name = str(key)
            found += nonfinite_paths(item, f"{path}.{name}" if name.isidentifier() else f"{path}[{name!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found += nonfinite_paths(item, f"{path}[{i}]")
    return found


def finite_json(value: Any) -> Any:
    """``value`` with each NaN or infinite float replaced by its :data:`NONFINITE` spelling (the same
    object when it holds none)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _spelling(value)
    if isinstance(value, dict):
        items = {k: finite_json(v) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    if isinstance(value, (list, tuple)):
        out = [finite_json(v) for v in value]
        return value if all(a is b for a, b in zip(out, value, strict=True)) else out
    return value


def _messages(value: Any, _type: Any) -> list[Message]:
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise ValueError(f"expected a list of message objects, got {type(value).__name__}")
    return value


def _mapping(value: Any, _type: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected an object, got {type(value).__name__}")
    return value


def _timings(value: Any, _type: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError(f"expected an object of seconds, got {type(value).__name__}")
    out = {}
    for key, seconds in value.items():
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise ValueError(f"expected seconds, got {seconds!r} for {key!r}")
        out[str(key)] = float(seconds)
    return out


def _plain(value: Any) -> Any:
    return value


def _is(expected: Any) -> Any:
    def check(type_: Any) -> bool:
        return bool(type_ == expected)

    return check


# messages and metrics are the framework's own JSON-ready data: checked when read, passed through (not walked)
for _passed, _check in ((list[Message], _messages), (dict[str, Any], _mapping), (dict[str, float], _timings)):
    converter.register_structure_hook_func(_is(_passed), _check)
    converter.register_unstructure_hook_func(_is(_passed), _plain)

_sample_fields = cattrs.gen.make_dict_unstructure_fn(RolloutSample, converter)


def _sample(sample: RolloutSample) -> dict[str, Any]:
    data: dict[str, Any] = _sample_fields(sample)
    data["metrics"] = finite_json(data["metrics"])
    return data


converter.register_unstructure_hook(RolloutSample, _sample)


def structure_problems(
    exc: BaseException,
    path: str = "$",
    *,
    missing: str = "required key missing",
    mapping: str | None = None,
    unknown: Callable[[ForbiddenExtraKeysError], str] | None = None,
    told: tuple[type[BaseException], ...] = (Exception,),
    expected: Any = None,
) -> list[str]:
    """Every problem cattrs found structuring data, each as ``what @ where`` (``path`` names the root).

    The one formatter of osmosis's structuring errors (the wire, the run config, the rollout
    server's bodies): a missing key says ``missing``; keys a class forbids say ``unknown key(s):
    ...`` (or what ``unknown`` says of them); with ``mapping`` (``"table"``), a value where a mapping
    is wanted says ``expected a <mapping>, got ...``; an error of the kinds ``told`` says its own
    message; anything else ``expected <type>``. Given ``expected`` (the type that was being
    structured), an error cattrs did not wrap (a converter without detailed validation) is one
    problem without a place.

    >>> import attrs
    >>> @attrs.define
    ... class Point:
    ...     x: int
    ...     y: int
    >>> try:
    ...     converter.structure({"x": "a"}, Point)
    ... except Exception as exc:
    ...     structure_problems(exc)
    ["expected a whole number, got 'a' @ $.x", 'required key missing @ $.y']
    """

    def one(error: BaseException, type_: Any) -> str:
        if isinstance(error, ForbiddenExtraKeysError):
            return unknown(error) if unknown is not None else f"unknown key(s): {', '.join(sorted(error.extra_fields))}"
        if isinstance(error, KeyError):
            return missing
        wanted = str(type_)
        if mapping is not None and (
            (isinstance(error, TypeError) and type_ is dict) or "Mapping" in wanted or "dict" in wanted
        ):
            return f"expected a {mapping}, got {error}"
        if isinstance(error, told) and str(error):
            return str(error)
        return f"expected {getattr(type_, '__name__', None) or type_}"

    if expected is not None and not isinstance(exc, BaseValidationError):
        return [one(exc, expected)]
    return list(cattrs.transform_error(exc, path=path, format_exception=one))


def _structure[T](data: Any, type_: type[T], what: str) -> T:
    try:
        return converter.structure(data, type_)
    except (ClassValidationError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(
            f"not {what}: {'; '.join(structure_problems(exc, told=(ValueError,), expected=type_))}"
        ) from None


def sample_to_json(sample: RolloutSample) -> dict[str, Any]:
    """A sample as a JSON-ready dict."""
    data: dict[str, Any] = converter.unstructure(sample)
    return data


def sample_from_json(data: Any) -> RolloutSample:
    """A sample from its JSON form. :raises ValueError: when it is not a valid one (a bad reward included)."""
    return _structure(data, RolloutSample, "a sample")


def result_to_json(result: ExecutionResult) -> dict[str, Any]:
    """A stage result as a JSON-ready dict."""
    data: dict[str, Any] = converter.unstructure(result)
    return data


def result_from_json(data: Any) -> ExecutionResult:
    """A stage result from its JSON form. :raises ValueError: when it is not a valid one."""
    return _structure(data, ExecutionResult, "a result")


def policy_to_json(policy: PolicyEndpoint) -> dict[str, Any]:
    """The endpoint without its secrets: the key and the header *values* are left out (header names
    stay); the trainer's ``sampling`` settings go with it (no secret)."""
    data = {
        "base_url": policy.base_url,
        "model": policy.model,
        "header_names": sorted(policy.headers),
        "max_response_bytes": policy.max_response_bytes,
    }
    if policy.sampling is not None:
        data["sampling"] = dict(policy.sampling)
    return data


def policy_from_json(data: Any, api_key: str | None, headers: dict[str, str] | None = None) -> PolicyEndpoint:
    """The endpoint, with the key and header values the caller got another way (its environment).

    :raises ValueError: not an endpoint, or its ``sampling`` settings are not valid ones.
    """
    if not isinstance(data, dict) or not isinstance(data.get("base_url"), str):
        raise ValueError(f"not a policy endpoint: {str(data)[:200]}")
    limit = data.get("max_response_bytes")
    return PolicyEndpoint(
        data["base_url"],
        str(data.get("model", "default")),
        api_key,
        dict(headers or {}),
        **({"max_response_bytes": int(limit)} if isinstance(limit, int) and not isinstance(limit, bool) else {}),
        sampling=data.get("sampling"),
    )


def grader_metrics(result: ExecutionResult, workflow_metrics: dict[str, Any] | None) -> list[str] | None:
    """The names of the metrics the grader set or changed: those of a grader stage's sample that are
    not in ``workflow_metrics`` (the workflow result's, copied when it was reported) with the same
    value. None when it cannot be told (no workflow metrics known, or not a grader stage's result)."""
    if workflow_metrics is None or result.stage is not ExecutionStage.GRADER or result.sample is None:
        return None
    metrics = result.sample.metrics
    return sorted(str(k) for k, v in metrics.items() if k not in workflow_metrics or not _same(workflow_metrics[k], v))


def _same(a: Any, b: Any) -> bool:
    """Equal, a NaN equal to a NaN (a worker process sends the workflow's and the grader's results
    apart: the same NaN arrives as two objects)."""
    if a is b:
        return True
    try:
        return bool(finite_json(a) == finite_json(b))
    except Exception:  # an object whose comparison raises (an array): counted as changed
        return False


def result_line(
    row: int, sample_index: int, result: ExecutionResult, *, workflow_metrics: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``results.jsonl`` record of one finished rollout (the same form ``osmosis serve`` writes).

    ``finished_at`` is the wall-clock time it was made (Unix seconds): reports plot a run over time
    with it. With ``workflow_metrics`` (the workflow result's metrics, copied when it was reported),
    ``grader_metrics`` lists the metrics the grader set (see :func:`grader_metrics`), so a report
    can show the two apart; a line without it does not say which stage set which.
    """
    sample = result.sample  # each part unstructured once, straight into the line
    line = {
        "row": row,
        "sample_index": sample_index,
        "rollout_id": result.rollout_id,
        "status": result.status.value,
        "stage": result.stage.value,
        "error": None
        if result.error is None
        else {"category": result.error.category.value, "message": result.error.message},
        "reward": None if sample is None else sample.reward,
        "metrics": {} if sample is None else finite_json(sample.metrics),
        "timings": {k: round(v, 6) for k, v in result.timings.items()},
        "finished_at": round(time.time(), 3),
        "sample": None
        if sample is None
        else {
            "messages": sample.messages,
            "system_prompt": sample.system_prompt,
            "chat_messages": sample.chat_messages,
        },
    }
    graders = grader_metrics(result, workflow_metrics)
    if graders is not None:
        line["grader_metrics"] = graders
    return line
