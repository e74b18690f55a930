"""Rewards for osmosis rollouts, registered by name: the graders RL post-training recipes use.

Name one in a run config (``[rollout] grader = "math"``, settings in ``[rollout.grader_config]``)
or use it from code::

    from osmosis_core import Grader, GraderContext
    from osmosis_graders import MathConfig, MathGrader

    class MyGrader(Grader):
        async def grade(self, ctx: GraderContext) -> float:
            return await MathGrader(MathConfig(extract="boxed")).grade(ctx)

========================= =========================================================================
``exact-match``           :class:`ExactMatchGrader`: the normalised answer equals the label
``numeric``               :class:`NumericGrader`: a number within ``abs_tol`` / ``rel_tol``
``regex``                 :class:`RegexGrader`: a pattern matches (format rewards)
``math``                  :class:`MathGrader`: equivalent by math-verify (fast path + killable CAS)
``json-match``            :class:`JsonMatchGrader`: schema-valid JSON, compared field by field
``contains``              :class:`ContainsGrader`: the label occurs in the answer
``llm-judge``             :class:`LLMJudgeGrader`: an LLM's rubric score from its own endpoint
``weighted``              :class:`WeightedGrader`: a weighted sum of other graders
========================= =========================================================================

Each records what it extracted and why it scored so in the sample's metrics. Public names are
imported lazily: importing this package does not import math-verify, jsonschema or aiohttp.
"""

from typing import TYPE_CHECKING

import lazy_loader

__version__ = "0.2.0"

if TYPE_CHECKING:
    from osmosis_graders.base import AnswerConfig as AnswerConfig
    from osmosis_graders.base import AnswerGrader as AnswerGrader
    from osmosis_graders.base import Verdict as Verdict
    from osmosis_graders.cas_pool import CasResult as CasResult
    from osmosis_graders.cas_pool import CasTiming as CasTiming
    from osmosis_graders.cas_pool import CasUnavailable as CasUnavailable
    from osmosis_graders.cas_pool import cas_check as cas_check
    from osmosis_graders.contains import ContainsConfig as ContainsConfig
    from osmosis_graders.contains import ContainsGrader as ContainsGrader
    from osmosis_graders.exact import ExactMatchConfig as ExactMatchConfig
    from osmosis_graders.exact import ExactMatchGrader as ExactMatchGrader
    from osmosis_graders.extract import Extraction as Extraction
    from osmosis_graders.extract import extract_answer as extract_answer
    from osmosis_graders.extract import final_text as final_text
    from osmosis_graders.json_match import JsonMatchConfig as JsonMatchConfig
    from osmosis_graders.json_match import JsonMatchGrader as JsonMatchGrader
    from osmosis_graders.judge import JudgeConfig as JudgeConfig
    from osmosis_graders.judge import LLMJudgeGrader as LLMJudgeGrader
    from osmosis_graders.judge import parse_judgement as parse_judgement
    from osmosis_graders.math_equiv import MathConfig as MathConfig
    from osmosis_graders.math_equiv import MathGrader as MathGrader
    from osmosis_graders.math_equiv import fast_equivalent as fast_equivalent
    from osmosis_graders.normalize import Number as Number
    from osmosis_graders.normalize import normalize_answer as normalize_answer
    from osmosis_graders.normalize import parse_number as parse_number
    from osmosis_graders.numeric import NumericConfig as NumericConfig
    from osmosis_graders.numeric import NumericGrader as NumericGrader
    from osmosis_graders.regex import RegexConfig as RegexConfig
    from osmosis_graders.regex import RegexGrader as RegexGrader
    from osmosis_graders.weighted import WeightedConfig as WeightedConfig
    from osmosis_graders.weighted import WeightedGrader as WeightedGrader
    from osmosis_graders.weighted import WeightedPart as WeightedPart

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "base": ["AnswerConfig", "AnswerGrader", "Verdict"],
        "cas_pool": ["CasResult", "CasTiming", "CasUnavailable", "cas_check"],
        "contains": ["ContainsConfig", "ContainsGrader"],
        "exact": ["ExactMatchConfig", "ExactMatchGrader"],
        "extract": ["Extraction", "extract_answer", "final_text"],
        "json_match": ["JsonMatchConfig", "JsonMatchGrader"],
        "judge": ["JudgeConfig", "LLMJudgeGrader", "parse_judgement"],
        "math_equiv": ["MathConfig", "MathGrader", "fast_equivalent"],
        "normalize": ["Number", "normalize_answer", "parse_number"],
        "numeric": ["NumericConfig", "NumericGrader"],
        "regex": ["RegexConfig", "RegexGrader"],
        "weighted": ["WeightedConfig", "WeightedGrader", "WeightedPart"],
    },
)
