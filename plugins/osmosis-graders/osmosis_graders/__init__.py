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

from osmosis_core.plugin import attach_stub

__version__ = "0.1.0"
__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
