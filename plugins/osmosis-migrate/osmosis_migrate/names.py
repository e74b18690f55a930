"""Where every public name of osmosis-ai 0.3.x (``osmosis_ai.rollout``) went in osmosis.

One table per family of the reference's modules: the rollout core, its two agent integrations, its
Harbor backend, its server and its client. A name maps to an osmosis module and name, or to a
:class:`NotOffered` reason that ``osmosis migrate`` reports (file:line and why) instead of dropping it.

>>> resolve_name("osmosis_ai.rollout", "AgentWorkflowOutput")
Target(module='osmosis_core', name='RolloutSample', distribution='osmosis-core')
>>> resolve_name("osmosis_ai.rollout.integrations.agents.strands", "OsmosisStrandsAgent").module
'osmosis_strands'
>>> print(resolve_name("osmosis_ai.rollout", "ExecutionOutcome").why)  # doctest: +ELLIPSIS
a backend reports each stage through ...
"""

from __future__ import annotations

import attrs

__all__ = [
    "ATTRIBUTE_WHY",
    "CORE_DISTRIBUTION",
    "DISTRIBUTIONS",
    "ENUM_MEMBERS",
    "ENUM_MEMBER_WHY",
    "ENV_VAR_WHY",
    "EXTRA_DISTRIBUTIONS",
    "EXTRA_NOT_OFFERED",
    "MODULE_PATHS",
    "PLACEHOLDER_MODELS",
    "NotOffered",
    "Target",
    "documented_names",
    "is_reference_module",
    "module_target",
    "resolve_name",
]

CORE_DISTRIBUTION = "osmosis-core"

DISTRIBUTIONS = {
    "osmosis_core": "osmosis-core",
    "osmosis_strands": "osmosis-strands",
    "osmosis_openai_agents": "osmosis-openai-agents",
    "osmosis_harbor": "osmosis-harbor",
    "osmosis_server": "osmosis-server",
    "osmosis_trainer": "osmosis-trainer",
}
"""Import package -> the distribution that provides it."""

EXTRA_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "server": ("osmosis-server",),
    "strands": ("osmosis-strands",),
    "openai-agents": ("osmosis-openai-agents",),
    "openai_agents": ("osmosis-openai-agents",),
    "harbor": ("osmosis-harbor",),
    "eval": (),
    "rubric": ("osmosis-graders",),
    "full": ("osmosis-server", "osmosis-strands", "osmosis-openai-agents", "osmosis-harbor", "osmosis-graders"),
}
"""An osmosis-ai extra -> the osmosis distributions that carry what it installed."""

EXTRA_NOT_OFFERED = {
    "rubric": "LLM-as-judge is osmosis-graders' llm-judge grader (LLMJudgeGrader), with its own API",
    "parquet": "osmosis reads JSONL datasets only: convert Parquet files to JSONL",
    "full": "its parquet part is not in osmosis (Parquet datasets); its rubric part is osmosis-graders",
    "eval": "`osmosis run` (the counterpart of `osmosis eval run`) is in osmosis-core; Parquet datasets are not read",
}
"""Extras (or their parts) with nothing to install in osmosis, and why."""


@attrs.frozen
class Target:
    """Where a reference name lives in osmosis."""

    module: str
    name: str
    distribution: str


@attrs.frozen
class NotOffered:
    """A reference name osmosis does not offer, and why (with what to do instead)."""

    why: str


_CORE_RENAMES: dict[str, str] = {
    "AgentWorkflow": "AgentWorkflow",
    "AgentWorkflowConfig": "AgentWorkflowConfig",
    "AgentWorkflowContext": "AgentWorkflowContext",
    "AgentWorkflowOutput": "RolloutSample",
    "ConcurrencyConfig": "ConcurrencyConfig",
    "ExecutionBackend": "ExecutionBackend",
    "ExecutionRequest": "ExecutionRequest",
    "ExecutionResult": "ExecutionResult",
    "Grader": "Grader",
    "GraderConfig": "GraderConfig",
    "GraderContext": "GraderContext",
    "LocalBackend": "LocalBackend",
    "MessageDict": "Message",
    "ResultCallback": "ResultCallback",
    "RolloutContext": "RolloutContext",
    "RolloutErrorCategory": "ErrorCategory",
    "RolloutSample": "RolloutSample",
    "RolloutStatus": "ExecutionStatus",
    "SampleSource": "SampleSource",
    "get_rollout_context": "get_rollout_context",
}

_PLUGIN_AUTHORS = frozenset({"ExecutionBackend", "ResultCallback"})
"""The names of :data:`_CORE_RENAMES` a backend author uses: ``osmosis_core.plugin``'s, not ``osmosis_core``'s."""

_WIRE = (
    "a body of the reference server's HTTP protocol; osmosis has no model class for it (osmosis-server is "
    "wire-compatible with POST /rollout and GET /rollout/{id}/result: send and read the JSON)"
)
_LEGACY = (
    "an osmosis-ai 0.2 API (RolloutAgentLoop era), gone in 0.3 too: rewrite the agent as an AgentWorkflow "
    "and the reward as a Grader"
)

_CORE_NOT_OFFERED: dict[str, str] = {
    "BaseConfig": "osmosis has no shared config base: subclass AgentWorkflowConfig or GraderConfig (attrs classes)",
    "ExecutionOutcome": (
        "a backend reports each stage through the on_workflow_complete / on_grader_complete callbacks of "
        "ExecutionBackend.execute instead of returning an outcome"
    ),
    "RolloutInitRequest": _WIRE,
    "RolloutInitResponse": _WIRE,
    "RolloutResultResponse": _WIRE,
    "RolloutProgress": "rollouts report no progress in osmosis (the run's progress bar counts finished rollouts)",
    "RolloutAgentLoop": _LEGACY,
    "RolloutRequest": _LEGACY,
    "RolloutResult": _LEGACY,
    "RolloutServer": _LEGACY,
    "OpenAIFunctionToolSchema": _LEGACY,
    "OpenAIFunctionSchema": _LEGACY,
    "OpenAIFunctionParametersSchema": _LEGACY,
    "OpenAIFunctionPropertySchema": _LEGACY,
    "create_app": _LEGACY + " (the 0.3 server is osmosis_server.create_app)",
}

_STRANDS: dict[str, str | NotOffered] = {
    "OsmosisStrandsAgent": "OsmosisStrandsAgent",
    "OsmosisRolloutModel": "OsmosisRolloutModel",
    "StrandsAgentSampleSource": NotOffered("OsmosisStrandsAgent registers its own history as the sample"),
}

_OPENAI_AGENTS: dict[str, str | NotOffered] = {
    "OsmosisAgent": "OsmosisAgent",
    "OsmosisRolloutModel": "OsmosisRolloutModel",
    "OsmosisMemorySession": NotOffered(
        "OsmosisRolloutModel (the model of OsmosisAgent) registers the sample itself: drop session=..."
    ),
    "OsmosisLitellmModel": NotOffered(
        "osmosis calls the policy through openai's client, not LiteLLM: use OsmosisRolloutModel"
    ),
}

_HARBOR: dict[str, str | NotOffered] = {
    "HarborBackend": "HarborBackend",
    "TaskMode": NotOffered(
        'the task mode is a string: HarborBackendConfig(mode="template" | "dataset"), [backend.harbor] mode'
    ),
}

_SERVER: dict[str, str | NotOffered] = {
    "create_rollout_server": "create_app",
}

_CLIENT: dict[str, str | NotOffered] = {
    "RolloutClient": "RolloutClient",
    "RolloutHandle": NotOffered(
        "not offered by that name: osmosis_trainer.RolloutClient is the counterpart of the client"
    ),
}

_TOP_LEVEL_WHY = (
    "osmosis-ai's top-level package holds its rubric helpers and platform client; osmosis has no platform, and "
    "LLM-as-judge scoring is a grader: osmosis-graders' llm-judge (LLMJudgeGrader)"
)

# reference module (and its submodules) -> (osmosis module, table); the longest prefix wins
_FAMILIES: dict[str, tuple[str, dict[str, str | NotOffered] | None]] = {
    "osmosis_ai.rollout": ("osmosis_core", None),
    "osmosis_ai.rollout.integrations.agents.strands": ("osmosis_strands", _STRANDS),
    "osmosis_ai.rollout.integrations.agents.openai_agents": ("osmosis_openai_agents", _OPENAI_AGENTS),
    "osmosis_ai.rollout.backend.harbor": ("osmosis_harbor", _HARBOR),
    "osmosis_ai.rollout.server": ("osmosis_server", _SERVER),
    "osmosis_ai.rollout.client": ("osmosis_trainer", _CLIENT),  # the trainer's side (osmosis-trainer)
}


MODULE_PATHS = frozenset(
    {
        *_FAMILIES,
        "osmosis_ai.rollout.agent_workflow",
        "osmosis_ai.rollout.grader",
        "osmosis_ai.rollout.context",
        "osmosis_ai.rollout.types",
        "osmosis_ai.rollout.types.config",
        "osmosis_ai.rollout.types.output",
        "osmosis_ai.rollout.types.sample",
        "osmosis_ai.rollout.types.protocol",
        "osmosis_ai.rollout.backend",
        "osmosis_ai.rollout.backend.base",
        "osmosis_ai.rollout.backend.local",
        "osmosis_ai.rollout.server.app",
    }
)
"""Reference modules a user may import as modules (``from osmosis_ai.rollout import server``)."""


def is_reference_module(module: str) -> bool:
    """True for ``osmosis_ai`` and its submodules."""
    return module == "osmosis_ai" or module.startswith("osmosis_ai.")


def documented_names() -> list[tuple[str, str]]:
    """Every public name of osmosis-ai 0.3.x's rollout SDK a user touches, as ``(module, name)``.

    >>> ("osmosis_ai.rollout", "AgentWorkflowOutput") in documented_names()
    True
    """
    core = sorted(
        {*_CORE_RENAMES, *(n for n, why in _CORE_NOT_OFFERED.items() if why not in (_LEGACY,))} - {"ResultCallback"}
    )
    names = [("osmosis_ai.rollout", n) for n in core if n != "create_app"]
    for module, (_target, table) in _FAMILIES.items():
        if table is not None:
            names.extend((module, n) for n in table)
    return names


def _family(module: str) -> tuple[str, str, dict[str, str | NotOffered] | None] | None:
    best: str | None = None
    for prefix in _FAMILIES:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best)):
            best = prefix
    if best is None:
        return None
    target, table = _FAMILIES[best]
    return best, target, table


def module_target(module: str) -> str | NotOffered:
    """The osmosis module a whole reference module became (for ``import osmosis_ai.rollout as r``).

    >>> module_target("osmosis_ai.rollout.backend.harbor")
    'osmosis_harbor'
    """
    family = _family(module)
    if family is None:
        return NotOffered(
            _TOP_LEVEL_WHY if module == "osmosis_ai" else f"{module} is not part of osmosis-ai's rollout SDK"
        )
    return family[1]


def resolve_name(module: str, name: str) -> Target | NotOffered:
    """Where ``from <module> import <name>`` of osmosis-ai goes in osmosis."""
    family = _family(module)
    if family is None:
        if module == "osmosis_ai":
            return NotOffered(_TOP_LEVEL_WHY)
        return NotOffered(f"{module} is osmosis-ai's own machinery (platform, CLI, evaluation), not offered by osmosis")
    prefix, target, table = family
    if table is None:  # the rollout core and its submodules
        if name in _CORE_RENAMES:
            home = "osmosis_core.plugin" if name in _PLUGIN_AUTHORS else "osmosis_core"
            return Target(home, _CORE_RENAMES[name], CORE_DISTRIBUTION)
        if name in _CORE_NOT_OFFERED:
            return NotOffered(_CORE_NOT_OFFERED[name])
        if any(name in table for table in (_STRANDS, _OPENAI_AGENTS, _HARBOR, _SERVER, _CLIENT)):
            return NotOffered(f"{name} is not exported by {module} in osmosis-ai either; import it from its own module")
        if module != prefix:
            return NotOffered(f"{name} is internal to osmosis-ai ({module}); osmosis has no counterpart")
        return NotOffered(f"{name} is not a public name of osmosis-ai 0.3.x's osmosis_ai.rollout")
    entry = table.get(name)
    if entry is None:
        return NotOffered(f"{name} is not a public name of {prefix} in osmosis-ai 0.3.x")
    if isinstance(entry, NotOffered):
        return entry
    return Target(target, entry, DISTRIBUTIONS[target])


ENUM_MEMBERS: dict[str, dict[str, str]] = {
    "RolloutErrorCategory": {
        "TIMEOUT": "TIMEOUT",
        "VALIDATION_ERROR": "VALIDATION_ERROR",
        "AGENT_ERROR": "AGENT_ERROR",
    },
    "RolloutStatus": {"SUCCESS": "SUCCESS", "FAILURE": "FAILURE", "CANCELLED": "CANCELLED"},
}
"""Members of the reference's enums that keep their name in osmosis's (ErrorCategory, ExecutionStatus)."""

_IN_FLIGHT = (
    "ExecutionStatus has only the end states SUCCESS, FAILURE, CANCELLED; the server's wire statuses "
    "(queued, running, grading, unknown) are osmosis_server.RolloutStatus"
)

ENUM_MEMBER_WHY: dict[str, str] = {
    "LEASE_EXPIRED": "osmosis's server has no polling leases; an abandoned rollout is cancelled (CANCELLED)",
    "HTTP_ERROR": "osmosis splits it: POLICY_ERROR (the model endpoint failed) or INFRA_ERROR (a sandbox API failed)",
    "INTERNAL_ERROR": "a failure of osmosis's own machinery is INFRA_ERROR",
    "QUEUED": _IN_FLIGHT,
    "RUNNING": _IN_FLIGHT,
    "GRADING": _IN_FLIGHT,
    "UNKNOWN": _IN_FLIGHT,
}

ATTRIBUTE_WHY: dict[str, str] = {
    "artifacts_dir": "contexts have no per-rollout artifacts folder in osmosis: write files under a folder you choose",
    "project_path": "GraderContext has no project_path in osmosis",
    "set_status": "RolloutContext has no status in osmosis",
    "get_preview": "osmosis has no live previews: SampleSource only needs get_sample()",
    "preview_path": "osmosis has no live previews",
    "preview_enabled": "osmosis has no live previews",
    "trajectory_messages": "RolloutSample.chat_messages is osmosis's chat-shaped copy of the history",
    "remove_sample": "osmosis keeps every sample: filter by reward or metrics in your trainer",
    "extra_fields": "put extra values in RolloutSample.metrics (JSON values)",
    "prewarm_lifespan": "osmosis's HarborBackend has no prewarm step: trials are prepared when they start",
    "get_samples": "an osmosis-ai 0.2 grader API: a rollout has one sample, ctx.sample",
    "set_sample_reward": "an osmosis-ai 0.2 grader API: return the reward, or call ctx.set_reward(reward)",
    "chat_completions_url": "osmosis's RolloutContext keeps the endpoint in .policy: .policy.base_url (same meaning)",
}
"""Attributes of the reference's contexts and samples with no osmosis counterpart, reported where used."""

ENV_VAR_WHY: dict[str, str] = {
    "OSMOSIS_CHAT_COMPLETIONS_URL": "osmosis sets no such variable: get_rollout_context().policy.base_url",
    "OSMOSIS_API_KEY": "osmosis sets no such variable: get_rollout_context().policy.api_key",
    "OSMOSIS_ROLLOUT_ID": "osmosis sets no such variable: get_rollout_context().rollout_id",
}

PLACEHOLDER_MODELS = frozenset({"osmosis-rollout", "litellm_proxy/osmosis-rollout", "openai/osmosis-rollout"})
"""Model names the reference's gateway ignored; a real endpoint needs the served model's name."""
