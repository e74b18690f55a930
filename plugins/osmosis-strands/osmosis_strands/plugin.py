"""The osmosis plugin of osmosis-strands (entry point ``strands``): the starter template.

It stays light: nothing here imports Strands, so ``osmosis --help`` and ``osmosis plugins`` stay fast.
"""

from __future__ import annotations

from pathlib import Path

from osmosis_core.plugin import TemplateSpec, hookimpl
from osmosis_core.templates import multiply_template

__all__ = ["TEMPLATE_NAME", "TEMPLATE_ROOT", "osmosis_register_templates"]

TEMPLATE_NAME = "multiply-local-strands"
TEMPLATE_ROOT = Path(__file__).resolve().parent / "template"
"""The template's files, shipped inside the package."""


@hookimpl
def osmosis_register_templates() -> list[TemplateSpec]:
    return [
        multiply_template(
            TEMPLATE_NAME,
            TEMPLATE_ROOT,
            "A tool-calling multiply agent on Strands Agents (OsmosisStrandsAgent), run locally.",
        )
    ]
