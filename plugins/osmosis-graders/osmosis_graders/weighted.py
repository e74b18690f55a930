"""``weighted``: a weighted sum of other graders, each part named and recorded.

Each part names a registered grader (``exact-match``, another plugin's, ``pkg.mod:Class``), a
weight and that grader's own config table, checked when the config is read: a bad part config is
reported with its full key path (``@ $.rollout.grader_config.parts[1].config.abs_tol``). The
parts run concurrently on the same sample; the reward is ``sum(weight * score)`` (divided by the
sum of the weights with ``normalize = true``), rounded to 12 decimals so weights that add up to 1
give a full score of exactly 1.0. The metrics hold each part's score as
``weighted.<part>`` and the part's own metrics under the part's name. A part that fails fails the
grading with its own error (a judge's ``policy_error`` stays one); ``weighted.failed`` names it.

A format reward plus correctness, as R1-style recipes weigh them::

    [rollout]
    grader = "weighted"

    [[rollout.grader_config.parts]]
    name = "format"
    grader = "regex"
    weight = 0.1
    config = { pattern = '(?m)^####\\s*-?[\\d,.]+\\s*$' }

    [[rollout.grader_config.parts]]
    grader = "exact-match"
    weight = 0.9
    config = { extract = "hash" }

From code::

    from osmosis_graders import WeightedConfig, WeightedGrader, WeightedPart
    grader = WeightedGrader(WeightedConfig(parts=[
        WeightedPart(grader="regex", weight=0.1, name="format", config={"pattern": "####"}),
        WeightedPart(grader="math", weight=0.9),
    ]))
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from osmosis_core import ConfigError, Grader, GraderConfig, GraderContext, RolloutSample
from osmosis_core.plugin import apply_config_table, get_registry, resolve_object
from osmosis_graders.base import AnswerConfig, at_config_path, config_path, config_problem

__all__ = ["ResolvedPart", "WeightedConfig", "WeightedGrader", "WeightedPart"]


def _table(value: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a table of the grader's settings, got {value!r}")
    return dict(value)


@attrs.define(kw_only=True)
class WeightedPart:
    """One part: a grader by registered name (or ``pkg.mod:Class``), its weight, its config table.

    :ivar name: the part's name in the metrics (default: the grader's name); unique within the parts.
    """

    grader: str
    weight: float = 1.0
    config: dict[str, Any] = attrs.field(factory=dict, converter=_table)
    name: str | None = None


@attrs.frozen
class ResolvedPart:
    """A part ready to run: its name, weight, grader class and built config."""

    name: str
    weight: float
    grader_class: type[Grader[Any]]
    config: GraderConfig


_PROBLEM_PATH = re.compile(r" @ \$[^ ]*")


def _tidy(problem: str) -> str:
    """A nested problem keeps its most precise path (the first ``@ $...``), once."""
    paths = _PROBLEM_PATH.findall(problem)
    if len(paths) <= 1:
        return problem
    return _PROBLEM_PATH.sub("", problem) + str(paths[0])


def _parts(value: Sequence[WeightedPart | Mapping[str, Any]]) -> list[WeightedPart]:
    """Parts from code (:class:`WeightedPart`) or a TOML array of tables, checked with key paths."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise config_problem("parts", f"expected an array of tables ([[rollout.grader_config.parts]]), got {value!r}")
    parts = []
    for i, item in enumerate(value):
        if isinstance(item, WeightedPart):
            parts.append(item)
            continue
        if not isinstance(item, Mapping):
            raise config_problem(f"parts[{i}]", f"expected a table (grader, weight, config), got {item!r}")
        unknown = sorted(set(item) - {"grader", "weight", "config", "name"})
        if unknown:
            raise config_problem(
                f"parts[{i}]", f"unknown key(s) {', '.join(unknown)} (a part has grader, weight, config, name)"
            )
        if not isinstance(item.get("grader"), str) or not item["grader"].strip():
            raise config_problem(f"parts[{i}].grader", "required: a registered grader's name")
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise config_problem(f"parts[{i}].weight", f"expected a number, got {weight!r}")
        config = item.get("config", {})
        if not isinstance(config, Mapping):
            raise config_problem(f"parts[{i}].config", f"expected a table, got {config!r}")
        name = item.get("name")
        if name is not None and not isinstance(name, str):
            raise config_problem(f"parts[{i}].name", f"expected a string, got {name!r}")
        parts.append(WeightedPart(grader=item["grader"], weight=float(weight), config=dict(config), name=name))
    return parts


if TYPE_CHECKING:
    PartList = list[WeightedPart]
else:
    PartList = Any  # read by _parts, which reports each problem with its key path


def _resolve(spec: str) -> type[Grader[Any]]:
    if ":" in spec:
        grader: type[Grader[Any]] = resolve_object(spec, Grader, what="grader")
        return grader
    return get_registry().grader(spec).resolve()


@attrs.define(kw_only=True)
class WeightedConfig(GraderConfig):
    """Settings of ``weighted``.

    :ivar parts: the parts (an array of tables ``[[rollout.grader_config.parts]]``, or :class:`WeightedPart` s).
    :ivar normalize: divide by the sum of the weights.
    :ivar metrics_prefix: the prefix of the per-part scores (default ``weighted``).
    """

    parts: PartList = attrs.field(factory=list, converter=_parts)
    normalize: bool = False
    metrics_prefix: str | None = None
    resolved: list[ResolvedPart] = attrs.field(init=False, factory=list, repr=False, eq=False)
    """The parts with their grader classes and built configs (filled in when the config is made)."""

    def __attrs_post_init__(self) -> None:
        base = config_path()
        problems: list[str] = []
        names: dict[str, int] = {}
        for i, part in enumerate(self.parts):
            where = f"{base}.parts[{i}]"
            if not math.isfinite(part.weight):
                problems.append(f"must be a finite number, got {part.weight!r} @ {where}.weight")
                continue
            try:
                grader_class = _resolve(part.grader)
            except Exception as exc:  # unknown name, import failure: the registry's own message
                problems.append(f"{_tidy(str(exc)).split(' @ ')[0]} @ {where}.grader")
                continue
            name = part.name or getattr(grader_class, "name", None) or part.grader
            if not isinstance(name, str) or not name:
                name = part.grader
            if name in names:
                problems.append(
                    f"the part name {name!r} is taken by parts[{names[name]}]; "
                    f"give each part a distinct name @ {where}.name"
                )
                continue
            names[name] = i
            default = grader_class.config_type()
            table = dict(part.config)
            if isinstance(default, (AnswerConfig, WeightedConfig)) and "metrics_prefix" not in table:
                table["metrics_prefix"] = name  # the part's metrics go under its name
            known = (
                {f.alias or f.name for f in attrs.fields(type(default)) if f.init} if attrs.has(type(default)) else None
            )
            unknown = [k for k in table if known is not None and k not in known]
            if unknown:
                kind = type(default).__name__
                problems.extend(f"unknown key {k!r} ({kind} has no such field) @ {where}.config.{k}" for k in unknown)
                continue
            with at_config_path(f"{where}.config"):
                try:
                    config = apply_config_table(default, table, f"{where}.config", "<config>")
                except ConfigError as exc:
                    problems.extend(_tidy(p) for p in exc.problems)
                    continue
                except (ValueError, TypeError) as exc:
                    problems.append(_tidy(f"{exc} @ {where}.config"))
                    continue
            self.resolved.append(ResolvedPart(name, part.weight, grader_class, config))
        if problems:
            raise ValueError("; ".join(problems))
        if self.normalize and self.parts and sum(p.weight for p in self.parts) == 0:
            raise config_problem("normalize", "the weights sum to 0, so they cannot be normalised")


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _shadow(sample: RolloutSample) -> RolloutSample:
    """The sample as a part sees it: the same messages and metrics, its own reward."""
    return RolloutSample(
        messages=sample.messages,
        system_prompt=sample.system_prompt,
        chat_messages=sample.chat_messages,
        metrics=sample.metrics,
    )


class WeightedGrader(Grader[WeightedConfig]):
    """``sum(weight * score)`` over the configured parts (see the module docstring)."""

    name: ClassVar[str] = "weighted"
    config_type: ClassVar[type[GraderConfig]] = WeightedConfig

    async def grade(self, ctx: GraderContext[WeightedConfig]) -> float:
        """Run the parts concurrently; record and return the weighted sum."""
        config = self.config
        if not config.resolved:
            raise ValueError(
                "weighted has no parts: add [[rollout.grader_config.parts]] tables (grader, weight, config)"
            )
        prefix = config.metrics_prefix or self.name
        metrics = ctx.sample.metrics

        async def run(part: ResolvedPart) -> float:
            grader = part.grader_class(part.config)
            shadow = _shadow(ctx.sample)
            part_ctx = GraderContext(shadow, ctx.label, ctx.prompt, ctx.metadata, grader.config)
            try:
                score = await grader.grade(part_ctx)
            except Exception:
                metrics[f"{prefix}.failed"] = part.name
                raise
            if score is None:
                score = shadow.reward
            if score is None:
                metrics[f"{prefix}.failed"] = part.name
                raise ValueError(f"weighted: the part {part.name!r} returned no score and set none")
            return float(score)

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(run(part)) for part in config.resolved]
        except BaseExceptionGroup as group:  # a part's own error, not the group (its category must show)
            raise _first(group) from None
        terms = []
        for part, task in zip(config.resolved, tasks, strict=True):
            score = task.result()
            metrics[f"{prefix}.{part.name}"] = score
            terms.append(part.weight * score)
        total = math.fsum(terms)
        if config.normalize:
            total /= math.fsum(part.weight for part in config.resolved)
        # 0.7 + 0.2 + 0.1 is 0.9999999999999999 in floats: a full score must pass a pass_threshold of 1.0
        return round(total, 12)
