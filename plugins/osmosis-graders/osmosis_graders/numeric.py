"""``numeric``: the answer is a number within a tolerance of the label.

The answer is read with :func:`~osmosis_graders.normalize.parse_number` (``-1,234.5``, ``−3``,
``$18``, ``1e-3``, ``3/4``, ``\\frac{1}{2}``, ``50%`` as 50); when the extracted text is not one
number, the first number in it is taken (``#### 72 dollars`` -> 72). It scores 1.0 when
``|answer - label| <= max(abs_tol, rel_tol * |label|)``. A label that is not a number fails the
grading (``validation_error``): that is the dataset's fault, not the policy's.

In a run config::

    [rollout]
    grader = "numeric"

    [rollout.grader_config]
    extract = ["hash", "last-number"]    # GSM8K, strict then flexible
    abs_tol = 1e-6
    rel_tol = 0.0

From code::

    from osmosis_graders import NumericConfig, NumericGrader
    grader = NumericGrader(NumericConfig(rel_tol=0.01))      # within 1 %
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, ClassVar

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
from osmosis_graders.extract import Extraction, first_number
from osmosis_graders.normalize import Number, canonical_number, parse_number

__all__ = ["NumericConfig", "NumericGrader", "read_number"]


def _tolerance(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise config_problem(attribute.name, f"must be a finite number >= 0, got {value!r}")


@attrs.define(kw_only=True)
class NumericConfig(AnswerConfig):
    """Settings of ``numeric`` (and the :class:`~osmosis_graders.base.AnswerConfig` keys).

    :ivar extract: default ``["hash", "boxed", "answer-line", "last-number"]``.
    :ivar abs_tol: absolute tolerance (default 1e-6).
    :ivar rel_tol: tolerance relative to the label (default 0).
    """

    extract: ExtractorChain = attrs.field(
        default=("hash", "boxed", "answer-line", "last-number"), converter=extractor_chain, validator=check_extractors
    )
    abs_tol: float = attrs.field(default=1e-6, validator=_tolerance)
    rel_tol: float = attrs.field(default=0.0, validator=_tolerance)


def read_number(text: str) -> Number | None:
    """The number ``text`` is, else the first number in it, else None.

    >>> read_number("72 dollars").value
    Fraction(72, 1)
    """
    number = parse_number(text)
    if number is not None:
        return number
    token = first_number(text)
    return parse_number(token) if token is not None else None


class NumericGrader(AnswerGrader[NumericConfig]):
    """1.0 when the answer is within the tolerance of the label (any of them, for a list)."""

    name: ClassVar[str] = "numeric"
    config_type: ClassVar[type[GraderConfig]] = NumericConfig

    async def judge(self, answer: Extraction, labels: list[str], ctx: GraderContext[NumericConfig]) -> Verdict:
        mine = read_number(answer.text)
        if mine is None:
            return Verdict(0.0, reason="the answer is not a number")
        for label in labels:
            wanted = read_number(label)
            if wanted is None:
                raise ValueError(f"numeric: the label {shown(label)!r} is not a number")
            if _close(mine.value, wanted.value, self.config.abs_tol, self.config.rel_tol):
                return Verdict(1.0, metrics={"value": canonical_number(mine.value)})
        return Verdict(0.0, reason="outside the tolerance", metrics={"value": canonical_number(mine.value)})


def _close(a: Fraction, b: Fraction, abs_tol: float, rel_tol: float) -> bool:
    """``|a - b| <= max(abs_tol, rel_tol * |b|)``, exactly (no float rounding of the values)."""
    return abs(a - b) <= max(Fraction(abs_tol), Fraction(rel_tol) * abs(b))
