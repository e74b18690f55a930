"""``regex``: the answer matches a regular expression (a format reward, or a label pattern).

The pattern is the config's ``pattern``; ``{{label}}`` in it stands for the label, escaped (so
``####\\s*{{label}}\\s*$`` checks the GSM8K line holds exactly the label). With no ``pattern``
the label itself is the pattern. By default it searches the whole final message
(``extract = "final"``); ``fullmatch = true`` demands the whole extracted text match.

A format reward, as R1-style recipes use (1.0 for ``<think>...</think><answer>...</answer>``)::

    [rollout]
    grader = "regex"

    [rollout.grader_config]
    pattern = '^<think>.*?</think>\\s*<answer>.*?</answer>$'
    fullmatch = true
    dotall = true

From code::

    from osmosis_graders import RegexConfig, RegexGrader
    grader = RegexGrader(RegexConfig(pattern=r"(?m)^####\\s*-?[\\d,.]+\\s*$"))

Only the last ``max_chars`` characters of a reply are searched (a pattern written by the config's
author, run on a bounded text).
"""

from __future__ import annotations

import re
from typing import ClassVar

import attrs

from osmosis_core import GraderConfig, GraderContext
from osmosis_graders.base import AnswerConfig, AnswerGrader, Verdict, config_problem, shown
from osmosis_graders.extract import Extraction

__all__ = ["RegexConfig", "RegexGrader"]

_LABEL = "{{label}}"


@attrs.define(kw_only=True)
class RegexConfig(AnswerConfig):
    """Settings of ``regex`` (and the :class:`~osmosis_graders.base.AnswerConfig` keys).

    :ivar pattern: a Python regular expression; ``{{label}}`` is the escaped label; empty: the label is the pattern.
    :ivar fullmatch: the whole extracted text must match (default: a match anywhere).
    :ivar ignore_case: ``re.IGNORECASE``.
    :ivar multiline: ``re.MULTILINE`` (``^`` and ``$`` at every line).
    :ivar dotall: ``re.DOTALL`` (``.`` matches a newline).
    """

    pattern: str = ""
    fullmatch: bool = False
    ignore_case: bool = False
    multiline: bool = False
    dotall: bool = False

    def __attrs_post_init__(self) -> None:
        try:
            re.compile(self.pattern.replace(_LABEL, "label"), self.flags)
        except re.error as exc:
            raise config_problem("pattern", f"not a valid regular expression: {exc}") from None

    @property
    def flags(self) -> re.RegexFlag:
        """The ``re`` flags the switches ask for."""
        flags = re.RegexFlag(0)
        if self.ignore_case:
            flags |= re.IGNORECASE
        if self.multiline:
            flags |= re.MULTILINE
        if self.dotall:
            flags |= re.DOTALL
        return flags


class RegexGrader(AnswerGrader[RegexConfig]):
    """1.0 when the extracted text matches the pattern (made from each label in turn, for a list)."""

    name: ClassVar[str] = "regex"
    config_type: ClassVar[type[GraderConfig]] = RegexConfig

    def patterns(self, labels: list[str]) -> list[re.Pattern[str]]:
        """The compiled pattern(s): one, or one per label when the pattern uses the label.

        :raises ValueError: a label used as the pattern is not a valid regular expression.
        """
        config = self.config
        if not config.pattern:
            try:
                return [re.compile(label, config.flags) for label in labels]
            except re.error as exc:
                raise ValueError(f"regex: the label is not a valid regular expression: {exc}") from None
        if _LABEL not in config.pattern:
            return [re.compile(config.pattern, config.flags)]
        return [re.compile(config.pattern.replace(_LABEL, re.escape(label)), config.flags) for label in labels]

    async def judge(self, answer: Extraction, labels: list[str], ctx: GraderContext[RegexConfig]) -> Verdict:
        for pattern in self.patterns(labels):
            match = pattern.fullmatch(answer.text) if self.config.fullmatch else pattern.search(answer.text)
            if match is not None:
                return Verdict(1.0, metrics={"matched": shown(match.group(0))})
        return Verdict(0.0, reason="no match")
