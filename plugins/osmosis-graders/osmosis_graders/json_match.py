"""``json-match``: the answer is JSON, valid against a schema, and its fields equal the label's.

For structured output and tool-use rewards. The answer is the JSON in the final message (the
whole reply, a fenced ```` ```json ```` block, or the last ``{...}``); the label is a JSON value
(a table in the dataset row, or a JSON string). Then:

1. with ``schema`` (a JSON Schema, checked when the config is read): an invalid answer scores 0.0
   and the first violation goes to the metrics (``json-match.reason``);
2. the fields are compared: ``fields`` (dotted paths, ``args.city``), else every top-level key of
   a label object, else the whole value. Strings compare normalised (``exact-match`` rules),
   numbers within ``abs_tol`` (``1`` equals ``1.0``; ``true`` never equals ``1``), objects key by
   key, lists in order (``unordered_lists = true``: as multisets). Keys the label does not name
   are ignored (let the schema forbid them: ``additionalProperties = false``).
3. ``scoring = "all"``: 1.0 when every field matches; ``"fraction"``: the share that match.

In a run config::

    [rollout]
    grader = "json-match"

    [rollout.grader_config]
    fields = ["name", "arguments.city"]
    scoring = "fraction"

    [rollout.grader_config.schema]
    type = "object"
    required = ["name", "arguments"]

From code::

    from osmosis_graders import JsonMatchConfig, JsonMatchGrader
    grader = JsonMatchGrader(JsonMatchConfig(schema={"type": "object", "required": ["answer"]}))
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from osmosis_core import GraderConfig, GraderContext
from osmosis_graders.base import (
    AnswerConfig,
    AnswerGrader,
    ExtractorChain,
    Verdict,
    check_extractors,
    config_problem,
    extractor_chain,
    shown,
)
from osmosis_graders.extract import Extraction, find_json, json_field
from osmosis_graders.normalize import normalize_answer

__all__ = ["JsonMatchConfig", "JsonMatchGrader", "json_equal"]


def _paths(value: str | Sequence[str]) -> Any:
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, Sequence) else value


def _check_paths(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(p, str) for p in value):
        raise config_problem(attribute.name, f"expected a field path or a list of them, got {value!r}")


if TYPE_CHECKING:
    FieldPaths = tuple[str, ...]
else:
    FieldPaths = Any  # a name or a list: see ExtractorChain


def _scoring(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in ("all", "fraction"):
        raise config_problem(attribute.name, f"must be 'all' or 'fraction', got {value!r}")


def _tolerance(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise config_problem(attribute.name, f"must be a finite number >= 0, got {value!r}")


def _schema(instance: object, attribute: attrs.Attribute[Any], value: dict[str, Any] | None) -> None:
    if value is None:
        return
    jsonschema = importlib.import_module("jsonschema")  # imported when a config names a schema
    try:
        jsonschema.validators.validator_for(value).check_schema(value)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise config_problem(
            attribute.name, f"not a valid JSON Schema: {exc.message}" + (f" (at {where})" if where else "")
        ) from None


@attrs.define(kw_only=True)
class JsonMatchConfig(AnswerConfig):
    """Settings of ``json-match`` (and the :class:`~osmosis_graders.base.AnswerConfig` keys).

    :ivar extract: default ``"json"`` (with ``json_field``: compare that part of the answer).
    :ivar schema: a JSON Schema the answer must satisfy (any draft ``jsonschema`` knows).
    :ivar fields: dotted paths to compare; empty: the label object's keys, or the whole value.
    :ivar scoring: ``all`` (1.0 or 0.0) or ``fraction`` (the share of fields that match).
    :ivar normalize_strings: compare strings normalised (default) or exactly.
    :ivar abs_tol: how far apart two numbers may be.
    :ivar unordered_lists: compare lists as multisets.
    """

    extract: ExtractorChain = attrs.field(default=("json",), converter=extractor_chain, validator=check_extractors)
    schema: dict[str, Any] | None = attrs.field(default=None, validator=_schema)
    fields: FieldPaths = attrs.field(factory=tuple, converter=_paths, validator=_check_paths)
    scoring: str = attrs.field(default="all", validator=_scoring)
    normalize_strings: bool = True
    abs_tol: float = attrs.field(default=1e-9, validator=_tolerance)
    unordered_lists: bool = False


def json_equal(
    a: Any, b: Any, *, normalize_strings: bool = True, abs_tol: float = 1e-9, unordered: bool = False
) -> bool:
    """Deep equality of two JSON values by the rules in the module docstring.

    >>> json_equal({"n": 1, "s": "Paris."}, {"s": "paris", "n": 1.0})
    True
    >>> json_equal(True, 1)
    False
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=0.0, abs_tol=abs_tol)
    if isinstance(a, str) and isinstance(b, str):
        return normalize_answer(a) == normalize_answer(b) if normalize_strings else a == b
    same = {"normalize_strings": normalize_strings, "abs_tol": abs_tol, "unordered": unordered}
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k], **same) for k in a)  # type: ignore[arg-type]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return False
        if not unordered:
            return all(json_equal(x, y, **same) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
        left = list(b)
        for x in a:
            for i, y in enumerate(left):
                if json_equal(x, y, **same):  # type: ignore[arg-type]
                    del left[i]
                    break
            else:
                return False
        return True
    return a is None and b is None


class JsonMatchGrader(AnswerGrader[JsonMatchConfig]):
    """Schema-valid JSON whose fields equal the label's (see the module docstring)."""

    name: ClassVar[str] = "json-match"
    alternatives: ClassVar[bool] = False
    config_type: ClassVar[type[GraderConfig]] = JsonMatchConfig

    def _label(self, label: Any) -> Any:
        if not isinstance(label, str):
            return label
        text = self.labels(label)[0]
        try:
            return json.loads(text)
        except ValueError:
            raise ValueError(f"json-match: the label {shown(text)!r} is not JSON") from None

    async def judge(self, answer: Extraction, labels: list[str], ctx: GraderContext[JsonMatchConfig]) -> Verdict:
        config = self.config
        value = answer.value
        if answer.extractor != "json":
            found, value = find_json(answer.text)
            if not found:
                return Verdict(0.0, reason="the answer is not JSON")
        if config.schema is not None:
            jsonschema = importlib.import_module("jsonschema")
            validator = jsonschema.validators.validator_for(config.schema)(config.schema)
            error = jsonschema.exceptions.best_match(validator.iter_errors(value))
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "the top level"
                return Verdict(0.0, reason=f"schema: {shown(error.message)} (at {where})")
        wanted = self._label(ctx.label)
        paths = config.fields or (tuple(sorted(wanted)) if isinstance(wanted, dict) else ("",))
        if not paths:  # an empty label object: the schema was the test
            return Verdict(1.0, metrics={"matched": 0, "fields": 0})
        mismatched = []
        for path in paths:
            try:
                expected = json_field(wanted, path)
            except KeyError:
                raise ValueError(f"json-match: the label has no field {path!r}") from None
            try:
                got = json_field(value, path)
            except KeyError:
                mismatched.append(path or "$")
                continue
            if not json_equal(
                got,
                expected,
                normalize_strings=config.normalize_strings,
                abs_tol=config.abs_tol,
                unordered=config.unordered_lists,
            ):
                mismatched.append(path or "$")
        matched = len(paths) - len(mismatched)
        score = matched / len(paths) if config.scoring == "fraction" else float(not mismatched)
        metrics = {"matched": matched, "fields": len(paths)}
        if mismatched:
            return Verdict(score, reason="fields differ: " + ", ".join(mismatched[:10]), metrics=metrics)
        return Verdict(score, metrics=metrics)
