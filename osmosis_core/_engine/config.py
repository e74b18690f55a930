"""The TOML run config of ``osmosis run``, read with attrs + cattrs; every problem names its key path.

The keys, with a complete example, are in the README ("The run config"; ``configs/eval/multiply-plain.toml``).
Relative paths are resolved against the workspace root: the folder holding ``configs/`` when the
file sits in ``configs/<kind>/``, else the config file's own folder.
"""

from __future__ import annotations

import math
import os
import tomllib
from pathlib import Path
from typing import Any

import attrs
import cattrs
from cattrs.errors import BaseValidationError, CattrsError, ForbiddenExtraKeysError

from osmosis_core._engine.spelling import closest, did_you_mean
from osmosis_core.errors import ConfigError
from osmosis_core.records import DEFAULT_MAX_RESPONSE_BYTES, PolicyEndpoint
from osmosis_core.wire import register_strict_scalars, structure_problems

__all__ = [
    "DatasetSection",
    "PolicySection",
    "RolloutSection",
    "RunConfig",
    "RunSection",
    "load_config",
    "structure_table",
    "workspace_root",
]


@attrs.define(kw_only=True)
class RolloutSection:
    """``[rollout]``: where the rollout's code is and which classes to run."""

    path: str | None = None
    entrypoint: str | None = None
    workflow: str | None = None
    grader: str | None = None
    workflow_config: dict[str, Any] = attrs.field(factory=dict)
    grader_config: dict[str, Any] = attrs.field(factory=dict)


@attrs.define(kw_only=True)
class DatasetSection:
    """``[dataset]``: the JSONL rows to run."""

    path: str | None = None
    limit: int | None = None


@attrs.define(kw_only=True)
class PolicySection:
    """``[policy]``: the OpenAI-compatible endpoint of the model under training or evaluation."""

    base_url: str | None = None
    model: str = "default"
    api_key_env: str | None = None
    headers: dict[str, str] = attrs.field(factory=dict)
    max_response_mb: float = DEFAULT_MAX_RESPONSE_BYTES / (1024 * 1024)
    """The largest response body read from the endpoint, in MiB; a larger one fails the call (``policy_error``)."""

    @property
    def max_response_bytes(self) -> int:
        """``max_response_mb`` in bytes."""
        return int(self.max_response_mb * 1024 * 1024)


@attrs.define(kw_only=True)
class RunSection:
    """``[run]``: how to run the dataset."""

    backend: str = "local"
    concurrency: int | None = None
    workers: int = 1
    n_samples: int = 1
    agent_timeout_sec: float | None = 600.0
    grader_timeout_sec: float | None = 120.0
    pass_threshold: float = 1.0
    max_failure_rate: float | None = None
    """Above this share of failed rollouts the run exits with status 1 (it always does when every one failed)."""
    require_labels: bool = False
    """Fail a row without a label (``validation_error``) instead of running it ungraded."""
    output: str | None = None


@attrs.define(kw_only=True)
class RunConfig:
    """A whole run config. ``backend`` maps a backend name to its raw table."""

    rollout: RolloutSection = attrs.field(factory=RolloutSection)
    dataset: DatasetSection = attrs.field(factory=DatasetSection)
    policy: PolicySection = attrs.field(factory=PolicySection)
    run: RunSection = attrs.field(factory=RunSection)
    backend: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    server: dict[str, Any] = attrs.field(factory=dict)
    """``[server]``: the settings of ``osmosis serve`` (read by the osmosis-server plugin, which checks them)."""
    report: dict[str, Any] = attrs.field(factory=dict)
    """``[report]``: the settings of the run folder's ``report.html`` (read by the osmosis-report plugin)."""
    traces: dict[str, Any] = attrs.field(factory=dict)
    """``[traces]``: record every model call through a policy gateway and write ``traces.jsonl`` (present
    and not ``enabled = false`` turns it on; the osmosis-gateway plugin reads and checks the rest)."""
    source: Path | None = attrs.field(default=None, eq=False)
    """The file it was read from (None when built in code)."""
    root: Path = attrs.field(factory=Path.cwd, eq=False)
    """The folder relative paths resolve against."""

    def resolve(self, path: str | None) -> Path | None:
        """A config path made absolute against :attr:`root`."""
        if path is None:
            return None
        p = Path(os.path.expanduser(path))
        return p if p.is_absolute() else self.root / p

    @property
    def name(self) -> str:
        """A short name for run folders: the config file's stem, else the rollout folder's name."""
        if self.source is not None:
            return self.source.stem
        if self.rollout.path:
            return Path(self.rollout.path).name
        return "run"

    def to_dict(self) -> dict[str, Any]:
        """A JSON/TOML-ready dict (it never holds a key: only the variable's name)."""
        data: dict[str, Any] = _drop_none(_converter.unstructure(self))
        return {key: value for key, value in data.items() if key not in ("source", "root")}


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    return value


_converter = cattrs.Converter(forbid_extra_keys=True)
register_strict_scalars(_converter)


def _list_like(type_: Any) -> bool:
    origin = getattr(type_, "__origin__", None)
    args: tuple[Any, ...] = getattr(type_, "__args__", ())
    return origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis)


def _refusing_strings(type_: Any) -> Any:
    """A list (or ``tuple[X, ...]``) field given a string: an error, not a list of its characters."""
    from cattrs.cols import homogenous_tuple_structure_factory, list_structure_factory

    factory = list_structure_factory if type_.__origin__ is list else homogenous_tuple_structure_factory
    base = factory(type_, _converter)

    def structure(value: Any, type_: Any) -> Any:
        if isinstance(value, (str, bytes)):
            raise ValueError(f"expected a list, got the string {value!r}")
        return base(value, type_)

    return structure


_converter.register_structure_hook_factory(_list_like, _refusing_strings)


def _unknown_keys(exc: ForbiddenExtraKeysError) -> str:
    keys = ", ".join(sorted(exc.extra_fields))
    if "api_key" in exc.extra_fields:
        return f"unknown key(s): {keys} (put the key in an environment variable and name it with api_key_env)"
    return f"unknown key(s): {keys}{_typo_hint(sorted(exc.extra_fields), exc.cl)}"


def _typo_hint(keys: list[str], type_: Any) -> str:
    """Which known key each unknown one is most likely a typo of (``concurency``: ``concurrency``)."""
    known = [f.name for f in attrs.fields(type_) if f.init] if attrs.has(type_) else []
    if len(keys) == 1:
        return did_you_mean(keys[0], known)
    pairs = [f"{key} -> {match}" for key in keys if (match := closest(key, known)) is not None]
    return f" (did you mean: {', '.join(pairs)}?)" if pairs else ""


def structure_table[T](data: Any, type_: type[T], path: str, source: str) -> T:
    """Read a table into an attrs class, rejecting unknown keys; errors become a :class:`ConfigError`.

    Backends and workflows use it for their own tables (``[backend.harbor]`` and so on).
    """
    try:
        return _converter.structure(data, type_)
    except (BaseValidationError, CattrsError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(source, structure_problems(exc, path, mapping="table", unknown=_unknown_keys)) from None


def workspace_root(config_file: Path) -> Path:
    """The folder a config's relative paths resolve against (see the module docstring)."""
    folder = config_file.resolve().parent
    if folder.parent.name == "configs":
        return folder.parent.parent
    if folder.name == "configs":
        return folder.parent
    return folder


def load_config(path: Path | str) -> RunConfig:
    """Read and check a run config file.

    :raises ConfigError: the file is missing, is not valid TOML (with its line), or has bad keys.
    """
    path = Path(path)
    source = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(source, [f"no such file: {path}"]) from None
    except OSError as exc:
        raise ConfigError(source, [f"cannot read: {exc}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{source}:{line}", [f"not UTF-8 text (byte {raw[exc.start]:#04x}); save the file as UTF-8"]
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise ConfigError(source, ["not valid TOML: nested too deeply"]) from None
    return config_from_dict(data, source=path)


def config_from_dict(data: dict[str, Any], *, source: Path | None = None, root: Path | None = None) -> RunConfig:
    """Build a :class:`RunConfig` from a parsed TOML document, checking every key."""
    label = str(source) if source is not None else "<config>"
    config = structure_table(data, RunConfig, "$", label)
    config.source = source
    config.root = root if root is not None else (workspace_root(source) if source else Path.cwd())
    if problems := check_config(config):
        raise ConfigError(label, problems)
    return config


def check_config(config: RunConfig) -> list[str]:
    """Semantic checks beyond types; each problem as ``message @ $.path``."""
    problems: list[str] = []
    run = config.run
    for key in ("concurrency", "workers", "n_samples"):
        if (count := getattr(run, key)) is not None and count < 1:
            problems.append(f"must be >= 1, got {count} @ $.run.{key}")
    for key in ("agent_timeout_sec", "grader_timeout_sec"):
        value = getattr(run, key)
        if value is not None and (not math.isfinite(value) or value <= 0):
            problems.append(f"must be a positive number of seconds, got {value} @ $.run.{key}")
    if run.max_failure_rate is not None and not 0.0 <= run.max_failure_rate <= 1.0:
        problems.append(f"must be between 0 and 1, got {run.max_failure_rate} @ $.run.max_failure_rate")
    if not (math.isfinite(config.policy.max_response_mb) and config.policy.max_response_mb > 0):
        problems.append(f"must be a positive number, got {config.policy.max_response_mb} @ $.policy.max_response_mb")
    if not math.isfinite(run.pass_threshold):
        problems.append(f"must be a finite number @ $.run.pass_threshold (got {run.pass_threshold})")
    if config.dataset.limit is not None and config.dataset.limit < 0:
        problems.append(f"must be >= 0, got {config.dataset.limit} @ $.dataset.limit")
    base_url = config.policy.base_url
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        problems.append(f"must start with http:// or https://, got {base_url!r} @ $.policy.base_url")
    if not config.rollout.path and not config.rollout.workflow:
        problems.append("set rollout.path (a folder with main.py) or rollout.workflow (an import path) @ $.rollout")
    for name, table in config.backend.items():
        if not isinstance(table, dict):
            problems.append(f"must be a table @ $.backend.{name}")
    for table_name in ("server", "report", "traces"):
        if not isinstance(getattr(config, table_name), dict):
            problems.append(f"must be a table @ $.{table_name}")
    return problems


def api_key_from_env(config: RunConfig) -> str | None:
    """The API key, read from the variable ``policy.api_key_env`` names.

    :raises ConfigError: the variable is named but not set.
    """
    var = config.policy.api_key_env
    if not var:
        return None
    value = os.environ.get(var)
    if not value:
        raise ConfigError(
            str(config.source or "<config>"),
            [f"the environment variable {var} is not set @ $.policy.api_key_env"],
        )
    return value


def policy_endpoint(config: RunConfig, base_url: str | None = None) -> PolicyEndpoint:
    """The config's ``[policy]`` as a :class:`~osmosis_core.PolicyEndpoint` (its key read from the
    variable ``api_key_env`` names), at ``base_url`` when given.

    :raises ConfigError: the key's variable is named but not set.
    """
    return PolicyEndpoint(
        config.policy.base_url or "" if base_url is None else base_url,
        config.policy.model,
        api_key_from_env(config),
        dict(config.policy.headers),
        max_response_bytes=config.policy.max_response_bytes,
    )
