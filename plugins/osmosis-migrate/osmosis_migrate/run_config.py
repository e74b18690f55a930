"""Turning an osmosis-ai eval or training config (``[experiment]``, ``[evaluation]``, ``[training]``,
``[sampling]``, ``[secrets]``, ...) into an osmosis run config (``[rollout]``, ``[dataset]``,
``[policy]``, ``[run]``, ``[backend.<name>]``).

Each written key carries a comment naming the setting it came from; every setting with no
counterpart is listed, with why, as a comment at the end of the new file and in the report.

>>> facts = RolloutFacts(name="calc", folder="rollouts/calc", exists=True)
>>> text, notes, unmapped = migrate_run_config(
...     "configs/eval/calc.toml",
...     '[experiment]\\nrollout = "calc"\\nentrypoint = "main.py"\\nmodel_path = "openai/gpt-5-mini"\\n'
...     'dataset = "calc"\\n[evaluation]\\nn = 2\\n',
...     root=Path("/nonexistent"),
...     rollout_facts=lambda name, entrypoint: facts,
... )
>>> "n_samples = 2" in text and 'base_url = "https://api.openai.com/v1"' in text
True
>>> print(unmapped[0])  # doctest: +ELLIPSIS
configs/eval/calc.toml: [experiment] dataset = "calc": a platform dataset name and no data/calc.jsonl ...
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import attrs
import tomlkit

from osmosis_migrate.python_source import BackendCall
from osmosis_migrate.records import Finding

__all__ = ["MIGRATED_MARK", "RolloutFacts", "migrate_run_config"]

MIGRATED_MARK = "migrated from osmosis-ai by `osmosis migrate`"
"""Part of the first line of every config ``osmosis migrate`` writes."""

_PROVIDERS: dict[str, tuple[str, str | None]] = {
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
    "openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "groq": ("https://api.groq.com/openai/v1", "GROQ_API_KEY"),
    "together_ai": ("https://api.together.xyz/v1", "TOGETHERAI_API_KEY"),
    "fireworks_ai": ("https://api.fireworks.ai/inference/v1", "FIREWORKS_AI_API_KEY"),
    "deepseek": ("https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
    "mistral": ("https://api.mistral.ai/v1", "MISTRAL_API_KEY"),
    "xai": ("https://api.x.ai/v1", "XAI_API_KEY"),
    "ollama": ("http://127.0.0.1:11434/v1", None),
    "ollama_chat": ("http://127.0.0.1:11434/v1", None),
}
"""LiteLLM provider prefixes with a fixed OpenAI-compatible endpoint, and the key variable LiteLLM reads."""

_NO_FIXED_URL = frozenset(
    {
        "hosted_vllm",
        "vllm",
        "litellm_proxy",
        "openai_compatible",
        "azure",
        "azure_ai",
        "anthropic",
        "bedrock",
        "vertex_ai",
        "gemini",
        "cohere",
        "huggingface",
        "sagemaker",
        "databricks",
        "watsonx",
    }
)
"""LiteLLM providers whose endpoint osmosis cannot know (or that do not speak OpenAI's API)."""

_TRAINER = "a trainer setting: osmosis runs the rollouts, your trainer reads its own settings"
_WHY = {
    ("experiment", "branch"): "osmosis runs the rollout folder as it is on disk (no platform git sync)",
    ("experiment", "commit_sha"): "osmosis runs the rollout folder as it is on disk (no platform git sync)",
    ("training", "lr"): _TRAINER,
    ("training", "total_epochs"): _TRAINER,
    ("training", "max_prompt_length"): _TRAINER,
    ("training", "max_response_length"): _TRAINER,
}
_SAMPLING = {"rollout_temperature": "temperature", "rollout_top_p": "top_p"}


@attrs.frozen
class RolloutFacts:
    """What the workspace knows about the rollout a config names."""

    name: str
    folder: str
    """``rollouts/<name>``, relative to the workspace."""
    exists: bool
    entrypoint_exists: bool = True
    backend: BackendCall | None = None
    workflow_config_fields: frozenset[str] = frozenset()
    task_dir: str | None = None
    """The Harbor task folder (relative to the workspace) when the backend is Harbor."""


class _Out:
    """The new config's tables, each key with the setting it came from."""

    def __init__(self) -> None:
        self.tables: dict[str, list[tuple[str, Any, str]]] = {}

    def set(self, table: str, key: str, value: Any, source: str) -> None:
        rows = self.tables.setdefault(table, [])
        rows[:] = [r for r in rows if r[0] != key]
        rows.append((key, value, source))

    def has(self, table: str, key: str) -> bool:
        return any(r[0] == key for r in self.tables.get(table, []))

    def render(self) -> str:
        blocks = []
        for table in ("rollout", "rollout.workflow_config", "dataset", "policy", "run", "backend.harbor"):
            rows = self.tables.get(table)
            if not rows:
                continue
            lines = [(f"{key} = {_show(value)}", source) for key, value, source in rows]
            width = max(len(text) for text, _ in lines)
            body = "".join(f"{text.ljust(width)}  # {source}\n" if source else f"{text}\n" for text, source in lines)
            blocks.append(f"[{table}]\n{body}")
        return "\n".join(blocks)


def _show(value: Any) -> str:
    """A TOML rendering of ``value`` on one line (tables inline)."""
    if isinstance(value, dict):
        table = tomlkit.inline_table()
        table.update(value)
        return table.as_string()
    try:
        return str(tomlkit.item(value).as_string())
    except (TypeError, ValueError):
        return repr(value)


def _whole(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _number(value: Any, *, positive: bool = False) -> bool:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (not positive or value > 0)


def migrate_run_config(
    rel: str,
    text: str,
    *,
    root: Path,
    rollout_facts: Callable[[str, str], RolloutFacts],
) -> tuple[str | None, list[Finding], list[Finding]]:
    """The osmosis run config for an osmosis-ai config (None when ``text`` is not one).

    ``rollout_facts(rollout, entrypoint)`` describes the rollout the config names.
    Returns ``(new_text, notes, unmapped)``.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return None, [], [Finding(rel, None, "config", f"not valid TOML ({exc}); fix it and migrate again")]
    experiment = data.get("experiment")
    if not isinstance(experiment, dict):
        return None, [], []
    training = "training" in data or "/training/" in f"/{rel}"
    out = _Out()
    notes: list[Finding] = []
    unmapped: list[Finding] = []

    def lost(table: str, key: str, value: Any, why: str) -> None:
        subject = f"[{table}] {key} = {_show(value)}" if key else f"[{table}]"
        unmapped.append(Finding(rel, None, subject, why))

    rollout_name = experiment.get("rollout")
    entrypoint = experiment.get("entrypoint") or "main.py"
    facts: RolloutFacts | None = None
    if isinstance(rollout_name, str) and rollout_name and isinstance(entrypoint, str):
        facts = rollout_facts(rollout_name, entrypoint)
        out.set("rollout", "path", facts.folder, "[experiment] rollout")
        out.set("rollout", "entrypoint", entrypoint, "[experiment] entrypoint")
        if not facts.exists:
            lost(
                "experiment",
                "rollout",
                rollout_name,
                f"there is no {facts.folder} in this workspace: fix [rollout] path",
            )
        elif not facts.entrypoint_exists:
            lost(
                "experiment",
                "entrypoint",
                entrypoint,
                f"there is no {facts.folder}/{entrypoint}: fix [rollout] entrypoint",
            )
        backend = facts.backend
        if backend is not None:
            call = f"{backend.kind.capitalize()}Backend(...) in {entrypoint}"
            if backend.workflow:
                out.set("rollout", "workflow", backend.workflow, call)
            if backend.grader:
                out.set("rollout", "grader", backend.grader, call)
    else:
        lost("experiment", "rollout", rollout_name, "missing or not a folder name: set [rollout] path")

    backend_call = facts.backend if facts is not None else None
    kind = backend_call.kind if backend_call is not None else "local"
    out.set("run", "backend", kind, _backend_source(backend_call, entrypoint))
    for key, value in experiment.items():
        if key in ("rollout", "entrypoint"):
            continue
        if key == "model_path":
            _policy(rel, value, data, training, out, unmapped)
        elif key == "dataset":
            _dataset(rel, value, root, facts, out, unmapped)
        else:
            lost("experiment", key, value, _WHY.get(("experiment", key), "not a setting osmosis has"))

    _section(rel, data, "evaluation" if not training else "training", out, lost)
    if "evaluation" in data and training:
        _section(rel, data, "evaluation", out, lost)
    if "training" in data and not training:
        _section(rel, data, "training", out, lost)
    _sampling(data.get("sampling"), facts, out, lost)
    _secrets(data, out, lost)
    for key, value in (data.get("env") or {}).items() if isinstance(data.get("env"), dict) else []:
        lost("env", key, value, f"osmosis run sets no environment variables: export {key} before running")
    for table in ("checkpoints", "advanced"):
        section = data.get(table)
        if isinstance(section, dict):
            for key, value in section.items():
                why = _TRAINER if table == "checkpoints" else "a free-form table passed to osmosis-ai's platform"
                lost(table, key, value, why)
    for table, value in data.items():
        if table in ("experiment", "evaluation", "training", "sampling", "secrets", "env", "checkpoints", "advanced"):
            continue
        if isinstance(value, dict):
            for key, inner in value.items():
                lost(table, key, inner, "not part of osmosis-ai 0.3's config schema, nor of osmosis's")
        else:
            lost("", table, value, "not part of osmosis-ai 0.3's config schema, nor of osmosis's")

    backend = facts.backend if facts is not None else None
    if backend is not None and backend.kind == "harbor":
        _harbor(backend, facts, out, lost)
    local = sorted(p.relative_to(root).as_posix() for p in (root / "data").glob("*.jsonl")) if training else []
    return _render(rel, out, unmapped, training, local[0] if local else "data/<rows>.jsonl"), notes, unmapped


def _backend_source(backend: BackendCall | None, entrypoint: str) -> str:
    if backend is None:
        return "the in-process backend"
    return f"the {backend.kind.capitalize()}Backend of {entrypoint}"


def _policy(rel: str, value: Any, data: dict[str, Any], training: bool, out: _Out, unmapped: list[Finding]) -> None:
    subject = f"[experiment] model_path = {_show(value)}"
    if not isinstance(value, str) or not value:
        unmapped.append(Finding(rel, None, subject, "not a model name: set [policy] model"))
        return
    if training:
        out.set("policy", "model", value, "[experiment] model_path (a trainer supplies the endpoint)")
        return
    provider, _, rest = value.partition("/")
    secrets = _secret_names(data)
    if rest and provider in _PROVIDERS:
        base_url, key_var = _PROVIDERS[provider]
        out.set("policy", "base_url", base_url, f"[experiment] model_path: LiteLLM provider {provider}")
        out.set("policy", "model", rest, "[experiment] model_path")
        if key_var is not None:
            chosen = key_var if key_var in secrets or not secrets else _api_key_secret(secrets, key_var)
            out.set(
                "policy", "api_key_env", chosen, "[secrets] required" if chosen in secrets else "LiteLLM's variable"
            )
        return
    if rest and provider in _NO_FIXED_URL:
        out.set("policy", "model", rest, "[experiment] model_path")
        why = (
            f"LiteLLM provider {provider!r}: osmosis needs its OpenAI-compatible URL: "
            "give --policy-url (or [policy] base_url)"
        )
        unmapped.append(Finding(rel, None, subject, why))
        return
    out.set("policy", "model", value, "[experiment] model_path")
    unmapped.append(
        Finding(rel, None, subject, "no endpoint to derive from it: give --policy-url (or set [policy] base_url)")
    )


def _secret_names(data: dict[str, Any]) -> list[str]:
    secrets = data.get("secrets")
    required = secrets.get("required") if isinstance(secrets, dict) else None
    return [s for s in required if isinstance(s, str)] if isinstance(required, list) else []


def _api_key_secret(secrets: list[str], default: str) -> str:
    keys = [s for s in secrets if s.endswith("_API_KEY")]
    return keys[0] if len(keys) == 1 else default


def _dataset(rel: str, value: Any, root: Path, facts: RolloutFacts | None, out: _Out, unmapped: list[Finding]) -> None:
    subject = f"[experiment] dataset = {_show(value)}"
    if not isinstance(value, str) or not value or "/" in value or value.startswith("."):
        unmapped.append(Finding(rel, None, subject, "not a dataset name: give --dataset FILE to osmosis run"))
        return
    candidates = [PurePosixPath("data", f"{value}.jsonl")]
    if facts is not None:
        candidates.append(PurePosixPath(facts.folder, "data", f"{value}.jsonl"))
    for candidate in candidates:
        if (root / candidate).is_file():
            out.set("dataset", "path", str(candidate), f"[experiment] dataset = {_show(value)}")
            return
    others = sorted(p.name for p in (root / "data").glob(f"{value}.*") if p.suffix in (".csv", ".parquet", ".json"))
    if others:
        why = f"data/{others[0]} is not JSONL, the one format osmosis reads: convert it to data/{value}.jsonl"
    else:
        why = (
            f"a platform dataset name and no data/{value}.jsonl in this workspace: download it as JSONL "
            f"(osmosis-ai: osmosis dataset download {value}) to data/{value}.jsonl, "
            "or give --dataset FILE to osmosis run"
        )
    unmapped.append(Finding(rel, None, subject, why))


def _section(rel: str, data: dict[str, Any], table: str, out: _Out, lost: Callable[[str, str, Any, str], None]) -> None:
    section = data.get(table)
    if not isinstance(section, dict):
        return
    for key, value in section.items():
        source = f"[{table}] {key}"
        if key == "limit" and table == "evaluation":
            if _whole(value, 0):
                out.set("dataset", "limit", value, source)
            else:
                lost(table, key, value, "not a whole number >= 0")
        elif key in ("n", "n_samples_per_prompt"):
            if _whole(value, 1):
                out.set("run", "n_samples", value, source)
            else:
                lost(table, key, value, "not a whole number >= 1")
        elif key == "batch_size" and table == "evaluation":
            if _whole(value, 1):
                out.set("run", "concurrency", value, source + " (rollouts in flight)")
            else:
                lost(table, key, value, "not a whole number >= 1")
        elif key == "pass_threshold":
            if _number(value):
                out.set("run", "pass_threshold", value, source)
            else:
                lost(table, key, value, "not a number")
        elif key in ("agent_workflow_timeout_s", "grader_timeout_s"):
            target = "agent_timeout_sec" if key.startswith("agent") else "grader_timeout_sec"
            if _number(value, positive=True):
                out.set("run", target, value, source)
            else:
                lost(table, key, value, "not a positive number of seconds")
        elif key == "rollout_batch_size":
            lost(
                table,
                key,
                value,
                "the prompts per training step of the platform's trainer; osmosis's [run] concurrency caps rollouts "
                "in flight (osmosis-ai ran rollout_batch_size x n_samples_per_prompt at once): set it to what your "
                "endpoint serves",
            )
        else:
            lost(table, key, value, _WHY.get((table, key), "not a setting osmosis has"))


def _sampling(section: Any, facts: RolloutFacts | None, out: _Out, lost: Callable[[str, str, Any, str], None]) -> None:
    if not isinstance(section, dict):
        return
    fields = facts.workflow_config_fields if facts is not None else frozenset()
    for key, value in section.items():
        field = _SAMPLING.get(key)
        if field is not None and field in fields and _number(value):
            out.set("rollout.workflow_config", field, value, f"[sampling] {key} (a field of the workflow's config)")
        elif field is not None:
            lost(
                "sampling",
                key,
                value,
                f"osmosis has no run-wide sampling settings and the workflow's config has no {field} field: pass "
                f"{field}= to the model in code (OsmosisRolloutModel({field}=...)) or add a {field} field",
            )
        else:
            lost("sampling", key, value, "not a setting osmosis has")


def _secrets(data: dict[str, Any], out: _Out, lost: Callable[[str, str, Any, str], None]) -> None:
    section = data.get("secrets")
    if not isinstance(section, dict):
        return
    used = {value for key, value, _ in out.tables.get("policy", []) if key == "api_key_env"}
    for key, value in section.items():
        if key != "required" or not isinstance(value, list):
            lost("secrets", key, value, "not a setting osmosis has")
            continue
        for name in value:
            if name not in used:
                lost(
                    "secrets",
                    "required",
                    name,
                    f"osmosis keeps no secrets: export {name} before osmosis run "
                    "(the rollout reads it from the environment)",
                )


def _harbor(
    backend: BackendCall, facts: RolloutFacts | None, out: _Out, lost: Callable[[str, str, Any, str], None]
) -> None:
    source = "HarborBackend(...)"
    settings = dict(backend.harbor)
    if "mode" in settings:
        out.set("backend.harbor", "mode", settings["mode"], source + " task_mode")
    if facts is not None and facts.task_dir is not None:
        out.set("backend.harbor", "task_dir", facts.task_dir, source + " tasks_dir")
    elif "task_dir" in settings and facts is not None:
        path = PurePosixPath(facts.folder, settings["task_dir"])
        lost(
            "backend.harbor",
            "task_dir",
            str(path),
            "no task.toml there: set [backend.harbor] task_dir to the task folder",
        )
    if "n_concurrent" in settings:
        out.set("backend.harbor", "n_concurrent", settings["n_concurrent"], "TrialQueue(n_concurrent=...)")
    if "keep_successful_trials" in settings:
        out.set(
            "backend.harbor",
            "keep_successful_trials",
            settings["keep_successful_trials"],
            source + " cleanup_successful_trials",
        )


def _render(rel: str, out: _Out, unmapped: list[Finding], training: bool, sample_rows: str) -> str:
    name = PurePosixPath(rel).name
    head = [
        f"# osmosis run config, {MIGRATED_MARK} (the original is {name}.orig).",
        f"#   check: osmosis validate {rel}",
    ]
    if training:
        dataset = next((str(v) for k, v, _ in out.tables.get("dataset", []) if k == "path"), sample_rows)
        head.append(f"#   smoke test: osmosis run {rel} --dataset {dataset} --stub-policy --limit 4")
    else:
        head.append(f"#   run: osmosis run {rel} --stub-policy   (a stand-in model; or --policy-url URL --model NAME)")
    text = "\n".join(head) + "\n\n" + out.render()
    if unmapped:
        lines = "".join(f"#   {u.subject}: {u.why}\n" for u in unmapped)
        text += f"\n# Not carried over (the settings stay in {name}.orig):\n{lines}"
    return text
