"""``exact-match``: the normalised answer equals the label (or one of a list of labels).

Both sides go through :func:`~osmosis_graders.normalize.normalize_answer`: case folded,
whitespace collapsed, LaTeX wrappers dropped, edge punctuation stripped, numbers written one way
(``#### 1,000.`` matches ``1000`` and ``1000.0``; ``$18`` matches ``18``). A fraction stays a
fraction here (``1/2`` is not ``0.5``): use ``numeric`` or ``math`` for values.

In a run config::

    [rollout]
    grader = "exact-match"

    [rollout.grader_config]
    extract = "hash"              # GSM8K: the text after the last ####
    # punctuation = "all"         # SQuAD style: drop all punctuation, and
    # articles = true             # the words a / an / the

From code::

    from osmosis_graders import ExactMatchConfig, ExactMatchGrader
    grader = ExactMatchGrader(ExactMatchConfig(extract=["hash", "last-number"]))
    reward = await grader.grade(ctx)    # in your own Grader.grade
"""

from __future__ import annotations

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
)
from osmosis_graders.extract import Extraction
from osmosis_graders.normalize import PUNCTUATION_MODES, normalize_answer

__all__ = ["ExactMatchConfig", "ExactMatchGrader"]


def _punctuation(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in PUNCTUATION_MODES:
        raise config_problem(attribute.name, f"must be one of {', '.join(PUNCTUATION_MODES)}, got {value!r}")


@attrs.define(kw_only=True)
class ExactMatchConfig(AnswerConfig):
    """Settings of ``exact-match`` (and the :class:`~osmosis_graders.base.AnswerConfig` keys).

    :ivar extract: default ``["hash", "boxed", "answer-line", "final"]``: a GSM8K ``####``, else a
        ``\\boxed{}``, else an ``Answer:`` line, else the whole final message.
    :ivar case_sensitive: compare letter case too.
    :ivar punctuation: ``edges`` (default), ``all`` (SQuAD) or ``keep``.
    :ivar articles: drop a / an / the (SQuAD).
    :ivar numbers: write numbers one way before comparing (``1,000.0`` -> ``1000``).
    """

    extract: ExtractorChain = attrs.field(
        default=("hash", "boxed", "answer-line", "final"), converter=extractor_chain, validator=check_extractors
    )
    case_sensitive: bool = False
    punctuation: str = attrs.field(default="edges", validator=_punctuation)
    articles: bool = False
    numbers: bool = True


class ExactMatchGrader(AnswerGrader[ExactMatchConfig]):
    """1.0 when the normalised answer equals the normalised label (any of them, for a list)."""

    name: ClassVar[str] = "exact-match"
    config_type: ClassVar[type[GraderConfig]] = ExactMatchConfig

    def normalize(self, text: str) -> str:
        """``text`` normalised the way this grader's config says."""
        c = self.config
        return normalize_answer(
            text, case_sensitive=c.case_sensitive, punctuation=c.punctuation, articles=c.articles, numbers=c.numbers
        )

    async def judge(self, answer: Extraction, labels: list[str], ctx: GraderContext[ExactMatchConfig]) -> Verdict:
        mine = self.normalize(answer.text)
        for label in labels:
            if mine == self.normalize(label):
                return Verdict(1.0)
        return Verdict(0.0, reason="not equal", metrics={"normalized": mine[:300]})
