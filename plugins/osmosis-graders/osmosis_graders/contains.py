"""``contains``: the label occurs in the answer (after normalisation).

Both sides are normalised like ``exact-match`` (case, whitespace, LaTeX wrappers, numbers written
one way), so ``"The total is 1,000 apples."`` contains ``1000``. A list label needs any one of
them (``match = "any"``, the default) or all of them (``match = "all"``, e.g. required keywords).

In a run config::

    [rollout]
    grader = "contains"

    [rollout.grader_config]
    match = "all"

From code::

    from osmosis_graders import ContainsConfig, ContainsGrader
    grader = ContainsGrader(ContainsConfig(normalize=False))   # a plain substring test
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from osmosis_core import GraderConfig, GraderContext
from osmosis_graders.base import AnswerConfig, AnswerGrader, Verdict, config_problem
from osmosis_graders.extract import Extraction
from osmosis_graders.normalize import normalize_answer

__all__ = ["ContainsConfig", "ContainsGrader"]


def _match(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value not in ("any", "all"):
        raise config_problem(attribute.name, f"must be 'any' or 'all', got {value!r}")


@attrs.define(kw_only=True)
class ContainsConfig(AnswerConfig):
    """Settings of ``contains`` (and the :class:`~osmosis_graders.base.AnswerConfig` keys).

    :ivar match: with a list label: ``any`` one of them, or ``all`` of them.
    :ivar normalize: normalise both sides first (default); false: a plain substring test.
    :ivar case_sensitive: compare letter case too (with ``normalize``).
    """

    match: str = attrs.field(default="any", validator=_match)
    normalize: bool = True
    case_sensitive: bool = False


class ContainsGrader(AnswerGrader[ContainsConfig]):
    """1.0 when the answer contains the label (any / all of them, for a list)."""

    name: ClassVar[str] = "contains"
    config_type: ClassVar[type[GraderConfig]] = ContainsConfig

    def _form(self, text: str) -> str:
        if not self.config.normalize:
            return text
        return normalize_answer(text, case_sensitive=self.config.case_sensitive, punctuation="keep")

    async def judge(self, answer: Extraction, labels: list[str], ctx: GraderContext[ContainsConfig]) -> Verdict:
        haystack = self._form(answer.text)
        found = [label for label in labels if self._form(label) and self._form(label) in haystack]
        wanted = len(labels) if self.config.match == "all" else 1
        if len(found) >= wanted:
            return Verdict(1.0)
        missing = [label for label in labels if label not in found]
        return Verdict(0.0, reason="not contained", metrics={"missing": missing[:10]})
