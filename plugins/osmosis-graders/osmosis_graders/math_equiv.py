"""``math``: the answer is mathematically equivalent to the label, by HuggingFace's math-verify.

``\\frac{1}{2}`` equals ``0.5`` and ``1/2``; ``\\{1,2\\}`` equals ``\\{2,1\\}``; ``[0,1)`` is an
interval; ``(x+1)^2`` equals ``x^2+2x+1``; ``x=3`` answers ``3``. The answer is extracted first
(default: the last ``\\boxed{}``, else an ``Answer:`` line, else a GSM8K ``####``).

How it stays cheap and safe on the rollout's event loop:

1. **Fast path, on the loop** (microseconds): identical answers after light LaTeX clean-up
   (spacing, ``$``, ``\\left``, ``\\dfrac``) score 1.0; when both sides are plain numbers
   (integers, decimals, ``1,000``, ``a/b``, ``\\frac{a}{b}``, ``−3``) they are compared exactly,
   or rounded to ``float_rounding`` places when one is written with a decimal point, as
   math-verify compares numbers. Most GSM8K- and MATH-style answers end here.
2. **The CAS, off the loop**: everything else goes to math-verify in a worker process
   (:mod:`osmosis_graders.cas_pool`) with a hard limit of ``cas_timeout_sec`` per comparison: a
   hostile expression (``9^{9^{9^{9}}}``) costs one worker (killed and replaced), scores 0.0, and
   says so in the metrics (``math.reason``). An answer longer than ``max_answer_chars`` or with
   braces nested deeper than ``max_brace_depth`` (math-verify's parse time grows exponentially with
   bare ``{{{...}}}``) never reaches it: it scores 0.0 with that limit as the reason (``math.limit``).

The metrics of a comparison the CAS decided say where its time went: ``math.cas_wait_sec``
(waiting for a free worker, or a new one's start-up) and ``math.cas_compute_sec``. A grading the
grader timeout ends while it waits for a worker says so, in ``math.reason`` and in the timeout's
message, apart from one that ends while the CAS computes.

In a run config::

    [rollout]
    grader = "math"

    [rollout.grader_config]
    extract = "boxed"
    label_extract = "boxed"        # MATH's labels are whole solutions: take their \\boxed{} too
    cas_timeout_sec = 5

From code::

    from osmosis_graders import MathConfig, MathGrader
    grader = MathGrader(MathConfig(cas_timeout_sec=2))
    reward = await grader.grade(ctx)

A label math-verify cannot read fails the grading (``validation_error``, the dataset's fault); an
answer it cannot read scores 0.0.
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any, ClassVar, Final

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
    positive_int,
    shown,
)
from osmosis_graders.cas_pool import CasResult, CasTiming, cas_check, cas_pool
from osmosis_graders.extract import Extraction
from osmosis_graders.normalize import clean_latex, numbers_equal, parse_number

__all__ = ["MathConfig", "MathGrader", "brace_depth", "fast_equivalent"]


def _seconds(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (math.isfinite(value) and 0 < value <= 600):
        raise config_problem(attribute.name, f"must be a number of seconds in (0, 600], got {value!r}")


def _workers(instance: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value < 1):
        raise config_problem(attribute.name, f"must be a whole number >= 1, got {value!r}")


def _places(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not 0 <= value <= 100:
        raise config_problem(attribute.name, f"must be a whole number in [0, 100], got {value!r}")


@attrs.define(kw_only=True)
class MathConfig(AnswerConfig):
    """Settings of ``math`` (and the :class:`~osmosis_graders.base.AnswerConfig` keys).

    :ivar extract: default ``["boxed", "answer-line", "hash"]``.
    :ivar cas_timeout_sec: the hard limit of one CAS comparison (default 5 s).
    :ivar cas_workers: CAS processes for this event loop (default: the cores, at most 4).
    :ivar float_rounding: decimal places numbers are rounded to when one is a decimal (math-verify's).
    :ivar numeric_precision: significant digits of math-verify's numeric checks.
    :ivar strict: math-verify's strict mode (variables matter; a set is not a tuple).
    :ivar allow_set_relation_comp: let ``1 < x < 2`` equal ``(1, 2)`` (math-verify's switch).
    :ivar fast_path: decide plain numbers and identical answers on the loop (turn off to send all to the CAS).
    :ivar max_answer_chars: a longer extracted answer scores 0.0 without reaching the CAS.
    :ivar max_brace_depth: an answer with braces nested deeper scores 0.0 without reaching the CAS.
    """

    extract: ExtractorChain = attrs.field(
        default=("boxed", "answer-line", "hash"), converter=extractor_chain, validator=check_extractors
    )
    cas_timeout_sec: float = attrs.field(default=5.0, validator=_seconds)
    cas_workers: int | None = attrs.field(default=None, validator=_workers)
    float_rounding: int = attrs.field(default=6, validator=_places)
    numeric_precision: int = attrs.field(default=15, validator=_places)
    strict: bool = True
    allow_set_relation_comp: bool = False
    fast_path: bool = True
    max_answer_chars: int = attrs.field(default=1000, validator=positive_int)
    max_brace_depth: int = attrs.field(default=32, validator=positive_int)


_NO_SPACE: Final = re.compile(r"\s+")
_ANY_BRACE: Final = re.compile(r"[{}]")


def brace_depth(text: str) -> int:
    """How deep braces nest in ``text`` (escaped ``\\{`` too: a set nests like a group).

    >>> brace_depth("\\\\frac{1}{\\\\sqrt{2}}"), brace_depth("{{{1}}}"), brace_depth("x")
    (2, 3, 0)
    """
    depth = deepest = 0
    for match in _ANY_BRACE.finditer(text):
        if match.group(0) == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif depth:
            depth -= 1
    return deepest


def _math_form(text: str) -> str:
    """Light clean-up that never changes a value: delimiters, spacing, ``\\dfrac``, a trailing period."""
    return _NO_SPACE.sub("", clean_latex(text)).rstrip(".")


def fast_equivalent(answer: str, label: str, *, float_rounding: int = 6) -> bool | None:
    """True or False when the answer is decided without the CAS, None when only the CAS can tell.

    >>> fast_equivalent("\\\\frac{1}{2}", "0.5"), fast_equivalent("-3", "−3."), fast_equivalent("1,000", "999")
    (True, True, False)
    >>> fast_equivalent("\\\\sqrt{2}/2", "\\\\frac{1}{\\\\sqrt{2}}") is None
    True
    """
    a, b = _math_form(answer), _math_form(label)
    if a and a == b:
        return True
    x, y = parse_number(answer), parse_number(label)
    if x is None or y is None or x.percent or y.percent:
        return None
    return numbers_equal(x, y, float_rounding=float_rounding)


class MathGrader(AnswerGrader[MathConfig]):
    """1.0 when the answer is equivalent to the label (any of them, for a list), by math-verify."""

    name: ClassVar[str] = "math"
    config_type: ClassVar[type[GraderConfig]] = MathConfig

    @staticmethod
    async def warm_up(workers: int | None = None) -> None:
        """Start the CAS worker processes now, so the first gradings do not wait for sympy to import."""
        await cas_pool().warm_up(workers)

    async def judge(self, answer: Extraction, labels: list[str], ctx: GraderContext[MathConfig]) -> Verdict:
        config = self.config
        if len(answer.text) > config.max_answer_chars:
            return Verdict(
                0.0,
                reason=f"answer too large to parse ({len(answer.text):,} chars > limit {config.max_answer_chars:,}, "
                "max_answer_chars)",
                metrics={"limit": "max_answer_chars"},
            )
        undecided = []
        for label in labels:
            decided = (
                fast_equivalent(answer.text, label, float_rounding=config.float_rounding) if config.fast_path else None
            )
            if decided:
                return Verdict(1.0, metrics={"path": "fast"})
            if decided is None:
                undecided.append(label)
        if not undecided:
            return Verdict(0.0, reason="not equal", metrics={"path": "fast"})
        depth = brace_depth(answer.text)
        if depth > config.max_brace_depth:
            return Verdict(
                0.0,
                reason=f"braces nested deeper than {config.max_brace_depth} ({depth} levels, max_brace_depth): "
                "not sent to the CAS",
                metrics={"limit": "max_brace_depth"},
            )
        reasons = []
        waited = computed = 0.0
        for label in undecided:
            timing = CasTiming()
            try:
                result = await cas_check(
                    label,
                    answer.text,
                    limit=config.cas_timeout_sec,
                    workers=config.cas_workers,
                    timing=timing,
                    float_rounding=config.float_rounding,
                    numeric_precision=config.numeric_precision,
                    strict=config.strict,
                    allow_set_relation_comp=config.allow_set_relation_comp,
                )
            except asyncio.CancelledError:  # the grader's timeout (or the run's end): say where it was
                metrics = ctx.sample.metrics
                metrics[f"{self.prefix}.reason"] = timing.describe()
                metrics[f"{self.prefix}.path"] = "cas"
                metrics[f"{self.prefix}.cas_wait_sec"] = round(waited + timing.wait_sec, 3)
                metrics[f"{self.prefix}.cas_compute_sec"] = round(computed + timing.compute_sec, 3)
                raise
            waited += result.wait_sec
            computed += result.compute_sec
            cas = {"path": "cas", "cas_wait_sec": round(waited, 3), "cas_compute_sec": round(computed, 3)}
            if result.outcome == "equal":
                return Verdict(1.0, metrics=cas)
            if result.outcome == "unparsed" and result.detail and "label" in result.detail:
                raise ValueError(f"math: math-verify cannot read the label {shown(label)!r}")
            reasons.append(_reason(result, config.cas_timeout_sec))
        return Verdict(0.0, reason="; ".join(dict.fromkeys(reasons)), metrics=cas)


def _reason(result: CasResult, limit: float) -> str:
    outcome, detail = result.outcome, result.detail
    if outcome == "different":
        return "not equivalent"
    if outcome == "timeout":
        return (
            f"computing: the CAS ran past its {limit:g} s per-comparison limit "
            f"(after {result.wait_sec:.1f} s waiting for a worker)"
        )
    if outcome == "unparsed":
        return detail or "math-verify cannot read the answer"
    return f"CAS {outcome}: {detail}" if detail else f"CAS {outcome}"
