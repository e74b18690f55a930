"""What every grader here shares: the answer-reading config, the grader base, config problem paths.

A grader reads the final assistant message, extracts the answer (:mod:`osmosis_graders.extract`),
compares it with the row's label, and records in the sample's metrics what it extracted and why
it scored what it did, under its name (``metrics_prefix``, by default the registered name)::

    {"exact-match.extracted": "1,000", "exact-match.extractor": "hash", "exact-match.score": 1.0}
    {"math.extracted": null, "math.extractor": null, "math.score": 0.0,
     "math.reason": "no answer found (tried boxed, answer-line, hash)"}

Write your own on the same base by implementing :meth:`AnswerGrader.judge`::

    import attrs
    from osmosis_graders import AnswerConfig, AnswerGrader, Verdict

    @attrs.define(kw_only=True)
    class LengthConfig(AnswerConfig):
        max_words: int = 50

    class ShortAnswer(AnswerGrader[LengthConfig]):
        name = "short-answer"
        config_type = LengthConfig

        async def judge(self, answer, labels, ctx):
            words = len(answer.text.split())
            return Verdict(1.0 if words <= self.config.max_words else 0.0, reason=f"{words} words")
"""

from __future__ import annotations

import abc
import contextlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs

from osmosis_core import Grader, GraderConfig, GraderContext
from osmosis_graders.extract import ALIASES, EXTRACTORS, Extraction, answer_start_before, extract_answer, final_text

__all__ = [
    "AnswerConfig",
    "AnswerGrader",
    "ExtractorChain",
    "Verdict",
    "check_extractors",
    "config_path",
    "config_problem",
    "extractor_chain",
    "label_text",
    "positive_int",
    "record_metrics",
]

_PATH: ContextVar[str] = ContextVar("osmosis_graders_config_path", default="$.rollout.grader_config")


def config_path() -> str:
    """The key path of the grader config being built (``$.rollout.grader_config``, or a part's in ``weighted``)."""
    return _PATH.get()


@contextlib.contextmanager
def at_config_path(path: str) -> Iterator[None]:
    """Build the configs inside the block as if they were read from ``path`` (what ``weighted`` does for its parts)."""
    token = _PATH.set(path)
    try:
        yield
    finally:
        _PATH.reset(token)


def config_problem(key: str, message: str) -> ValueError:
    """A config error naming its full key path: ``message @ $.rollout.grader_config.key``.

    Raised from a config's validators, so ``osmosis validate`` reports it like any config error.
    """
    return ValueError(f"{message} @ {_PATH.get()}.{key}")


def extractor_chain(value: str | Sequence[str]) -> Any:
    """An extractor name or a list of them, as a tuple (aliases resolved); :func:`check_extractors` checks it."""
    if isinstance(value, str):
        return (ALIASES.get(value, value),)
    if isinstance(value, Sequence):
        return tuple(ALIASES.get(n, n) if isinstance(n, str) else n for n in value)
    return value


def check_extractors(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    """Each name is a known extractor (an attrs validator, so the problem names its key)."""
    if not isinstance(value, tuple) or not all(isinstance(n, str) for n in value):
        raise config_problem(attribute.name, f"expected an extractor name or a list of them, got {value!r}")
    for name in value:
        if name not in EXTRACTORS:
            raise config_problem(attribute.name, f"unknown extractor {name!r} (known: {', '.join(EXTRACTORS)})")


if TYPE_CHECKING:
    ExtractorChain = tuple[str, ...]
else:
    # The config reader gives a field typed Any its TOML value as it is; the converter accepts a name
    # or a list (a field typed tuple[str, ...] would turn "boxed" into ("b", "o", "x", "e", "d")).
    ExtractorChain = Any


def positive_int(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise config_problem(attribute.name, f"must be a whole number >= 1, got {value!r}")


def _prefix(instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not value.strip():
        raise config_problem(attribute.name, "must not be empty (leave it out to use the grader's name)")


@attrs.define(kw_only=True)
class AnswerConfig(GraderConfig):
    """Settings every answer-reading grader shares (``[rollout.grader_config]`` keys).

    :ivar extract: the extractor, or a list tried in order (see :mod:`osmosis_graders.extract`).
    :ivar json_field: for the ``json`` extractor: the field to read (``answer``, ``result.0.value``).
    :ivar tag: for the ``tag`` extractor: ``answer`` reads ``<answer>...</answer>``.
    :ivar label_extract: extractors applied to the label too (``["hash"]`` for GSM8K's raw
        solutions, ``["boxed"]`` for MATH's); empty: the label is the answer.
    :ivar metrics_prefix: the prefix of the metrics this grader records (default: its name).
    :ivar max_chars: only the last ``max_chars`` characters of a reply are read.
    """

    extract: ExtractorChain = attrs.field(default=("final",), converter=extractor_chain, validator=check_extractors)
    json_field: str | None = None
    tag: str = "answer"
    label_extract: ExtractorChain = attrs.field(default=(), converter=extractor_chain, validator=check_extractors)
    metrics_prefix: str | None = attrs.field(default=None, validator=_prefix)
    max_chars: int = attrs.field(default=100_000, validator=positive_int)


@attrs.frozen
class Verdict:
    """A comparison's outcome: the score, why (a few words, for the metrics), and extra metrics."""

    score: float
    reason: str | None = None
    metrics: Mapping[str, Any] = attrs.field(factory=dict)


_SHOWN: Final = 300
"""Characters of an extracted answer kept in the metrics."""


def shown(text: str | None) -> str | None:
    """``text`` cut to what a metrics line shows."""
    if text is None or len(text) <= _SHOWN:
        return text
    return text[: _SHOWN - 1] + "…"


def label_text(label: Any) -> str:
    """A label as text: strings as they are, numbers as written, anything else as JSON.

    >>> label_text(72), label_text(0.5), label_text({"a": 1})
    ('72', '0.5', '{"a": 1}')
    """
    if isinstance(label, str):
        return label
    if isinstance(label, bool):
        return "true" if label else "false"
    if isinstance(label, (int, float)):
        return repr(label)
    return json.dumps(label, ensure_ascii=False, sort_keys=True)


def record_metrics(metrics: dict[str, Any], prefix: str, answer: Extraction | None, verdict: Verdict) -> None:
    """Write ``prefix.extracted``, ``prefix.extractor``, ``prefix.score``, ``prefix.reason`` and the verdict's own."""
    metrics[f"{prefix}.extracted"] = shown(answer.text) if answer is not None else None
    metrics[f"{prefix}.extractor"] = answer.extractor if answer is not None else None
    metrics[f"{prefix}.score"] = verdict.score
    if verdict.reason is not None:
        metrics[f"{prefix}.reason"] = verdict.reason
    for key, value in verdict.metrics.items():
        metrics[f"{prefix}.{key}"] = value


class AnswerGrader[C: AnswerConfig](Grader[C]):
    """A grader that extracts the answer from the final message and compares it with the label.

    Implement :meth:`judge`. Nothing extracted scores 0.0 with the reason in the metrics; a label
    that cannot be read (``label_extract`` finds nothing) fails the grading (``validation_error``):
    a broken row is not the policy's fault.
    """

    name: ClassVar[str] = "answer"
    """The registered name, and the default metrics prefix."""
    alternatives: ClassVar[bool] = True
    """A list label is a list of accepted answers (any one scores)."""
    config_type: ClassVar[type[GraderConfig]] = AnswerConfig

    @property
    def prefix(self) -> str:
        """The prefix of this grader's metrics."""
        return self.config.metrics_prefix or self.name

    def labels(self, label: Any) -> list[str]:
        """The accepted answers the label gives, each passed through ``label_extract``.

        :raises ValueError: ``label_extract`` finds no answer in a label.
        """
        values = label if isinstance(label, list) and self.alternatives else [label]
        texts = []
        for value in values:
            text = label_text(value)
            if self.config.label_extract:
                found = extract_answer(
                    text, self.config.label_extract, json_path=self.config.json_field, tag=self.config.tag
                )
                if found is None:
                    tried = ", ".join(self.config.label_extract)
                    raise ValueError(f"{self.name}: no answer in the label {shown(text)!r} (label_extract: {tried})")
                text = found.text
            texts.append(text)
        return texts

    def extract(self, text: str) -> Extraction | None:
        """The answer in ``text`` by the configured extractors."""
        config = self.config
        return extract_answer(text[-config.max_chars :], config.extract, json_path=config.json_field, tag=config.tag)

    async def grade(self, ctx: GraderContext[C]) -> float:
        """Extract, compare, record; return the score."""
        text = final_text(ctx.sample)
        answer = self.extract(text)
        if answer is None:
            verdict = self._nothing_found(text)
        else:
            verdict = await self.judge(answer, self.labels(ctx.label), ctx)
        if not math.isfinite(verdict.score):
            raise ValueError(f"{self.name}: the score {verdict.score!r} is not a finite number")
        record_metrics(ctx.sample.metrics, self.prefix, answer, verdict)
        return verdict.score

    def _nothing_found(self, text: str) -> Verdict:
        """Why no answer was found: an empty reply, an answer larger than the part read, or none at all."""
        config = self.config
        tried = ", ".join(config.extract)
        if not text.strip():
            return Verdict(0.0, reason="empty reply")
        cut = len(text) - config.max_chars
        if cut <= 0:
            return Verdict(0.0, reason=f"no answer found (tried {tried})")
        limit = {"limit": "max_chars"}
        start = answer_start_before(text, cut, config.extract, tag=config.tag)
        if start is not None:
            marker, at = start
            return Verdict(
                0.0,
                reason=f"answer too large to parse ({len(text) - at:,} chars > limit {config.max_chars:,}, max_chars): "
                f"its {marker} starts before the part read",
                metrics=limit,
            )
        return Verdict(
            0.0,
            reason=f"no answer found in the last {config.max_chars:,} chars read (the reply has {len(text):,} "
            f"> limit {config.max_chars:,}, max_chars; tried {tried})",
            metrics=limit,
        )

    @abc.abstractmethod
    async def judge(self, answer: Extraction, labels: list[str], ctx: GraderContext[C]) -> Verdict:
        """Score the extracted ``answer`` against the accepted ``labels``."""
