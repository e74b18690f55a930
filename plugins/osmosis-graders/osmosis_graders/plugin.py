"""The osmosis plugin of osmosis-graders (entry point ``graders``): the graders by name, and a template.

It stays light: it imports only ``osmosis_core.plugin``; a grader's module (and math-verify,
jsonschema, aiohttp) is imported when a run config names it.
"""

from __future__ import annotations

from pathlib import Path

from osmosis_core.plugin import GraderSpec, TemplateSpec, hookimpl
from osmosis_core.templates import MULTIPLY_DATASET, multiply_template

__all__ = ["GRADERS", "TEMPLATE_NAME", "TEMPLATE_ROOT", "osmosis_register_graders", "osmosis_register_templates"]

GRADERS: tuple[tuple[str, str, str], ...] = (
    ("exact-match", "osmosis_graders.exact:ExactMatchGrader", "1.0 when the normalised answer equals the label."),
    (
        "numeric",
        "osmosis_graders.numeric:NumericGrader",
        "1.0 when the answer is a number within a tolerance of the label.",
    ),
    (
        "regex",
        "osmosis_graders.regex:RegexGrader",
        "1.0 when the answer matches a regular expression (a format reward).",
    ),
    ("math", "osmosis_graders.math_equiv:MathGrader", "1.0 when the answer is equivalent to the label by math-verify."),
    ("json-match", "osmosis_graders.json_match:JsonMatchGrader", "Schema-valid JSON whose fields equal the label's."),
    ("contains", "osmosis_graders.contains:ContainsGrader", "1.0 when the answer contains the label."),
    ("llm-judge", "osmosis_graders.judge:LLMJudgeGrader", "An LLM judge's rubric score, scaled to [0, 1]."),
    ("weighted", "osmosis_graders.weighted:WeightedGrader", "A weighted sum of other graders, each part recorded."),
)
"""(name, class path, one line) of every grader this plugin registers."""

TEMPLATE_NAME = "multiply-graders"
TEMPLATE_ROOT = Path(__file__).resolve().parent / "template"
"""The template's own files: its run configs and the rollout's pyproject.toml."""
MULTIPLY_ROLLOUT = MULTIPLY_DATASET.parent.parent
"""The core's multiply-plain rollout folder (its dataset lives in its data/): the agent is reused, not copied."""


@hookimpl
def osmosis_register_graders() -> list[GraderSpec]:
    return [GraderSpec(name, path, description=line) for name, path, line in GRADERS]


@hookimpl
def osmosis_register_templates() -> list[TemplateSpec]:
    return [
        multiply_template(
            TEMPLATE_NAME,
            TEMPLATE_ROOT,
            "The multiply agent graded by name: weighted = 0.1 format (regex) + 0.9 exact-match.",
            extra_files={f"rollouts/{TEMPLATE_NAME}/main.py": MULTIPLY_ROLLOUT / "main.py"},
        )
    ]
