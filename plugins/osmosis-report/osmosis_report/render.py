"""One self-contained HTML file from one or more run folders.

The page holds everything it needs: the stylesheet and the script inline (allowed by a
Content-Security-Policy that names the script's hash and forbids every request), the plots as
inline SVG, the rows and rollouts as JSON, and the trajectories gzip-compressed in chunks that the
page unpacks (``DecompressionStream``) when one is opened. Rollout content reaches the page only
as JSON data and is put on screen as text, never as markup.

Past ``max_bytes`` the page keeps every row's and rollout's summary and the trajectories of a
stated sample: every failed rollout first, then a seeded random sample of the others.
"""

from __future__ import annotations

import base64
import datetime as _dt
import gzip
import hashlib
import json
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
import jinja2
import markupsafe

from osmosis_core.frontend import NONFINITE, percentile
from osmosis_report import charts
from osmosis_report.compare import Comparison, Mismatch, compare, row_passes
from osmosis_report.load import RolloutRecord, RunData, load_run
from osmosis_report.stats import Interval, mean_interval, pass_at_k_curve
from osmosis_report.steps import MAX_POINTS, StepFigures, bucketed, step_figures
from osmosis_report.units import duration_unit, format_duration, format_durations

__all__ = ["DEFAULT_MAX_BYTES", "Built", "build_report", "render_runs", "run_figures"]

DEFAULT_MAX_BYTES = 24 * 1024 * 1024
"""The page's size limit by default (trajectories are sampled past it)."""
CHUNK = 200
"""The most trajectories per compressed chunk (the page unpacks one chunk to show one of them); a
small run has smaller chunks (a fiftieth of its rollouts, at least 16), so its sample can be finer."""
SEED = 0

Progress = Callable[[str, int, int], None]
"""``(phase, done, total)``."""

STATUS = {"success": 0, "failure": 1, "cancelled": 2}


@attrs.frozen
class Built:
    """What :func:`build_report` wrote."""

    path: Path
    bytes: int
    seconds: float
    rollouts: int
    embedded: int
    runs: list[RunData]
    comparison: Comparison | None


def _fmt_num(value: float | None, spec: str = ".3f") -> str:
    return "\u2013" if value is None else format(value, spec)


def run_figures(run: RunData) -> dict[str, Any]:
    """The header figures of one run (the page's and the terminal's summary)."""
    s = run.summary
    rows = list(run.rows.values())
    rewarded = any(row.rewards() for row in rows)  # (as the summary: no mean before a first reward)
    interval = mean_interval([row.scores() for row in rows]) if rewarded else None
    graded_interval = mean_interval([row.rewards() for row in rows])
    curve = pass_at_k_curve([row.counts() for row in rows if row.counts()[0]])
    rollouts = run.rollouts
    latencies = [r.latency for r in rollouts if r.status != "cancelled"]
    stages: Counter[tuple[str, str]] = Counter(
        (r.category or "unknown", r.stage or "?") for r in rollouts if not r.ok and r.status != "cancelled"
    )
    times = [r.finished_at for r in rollouts if r.finished_at is not None]
    config = run.config
    started = run.meta.get("started")
    if not isinstance(started, str):
        stamp = (run.path / "run.json").stat().st_mtime if (run.path / "run.json").exists() else None
        started = _dt.datetime.fromtimestamp(stamp).astimezone().isoformat(timespec="seconds") if stamp else None
    wall = s.wall_sec or (max(times) - min(times) if len(times) > 1 else 0.0)
    never = sum(1 for row in rows if row.counts()[0] and row.counts()[1] == 0)
    steps = step_figures(run)
    versioned = [step for step in steps if step.version is not None]
    return {
        "name": run.name,
        "path": str(run.path),
        "kind": run.kind,
        "config": run.meta.get("config"),
        "model": config.get("policy", {}).get("model"),
        "base_url": config.get("policy", {}).get("base_url"),
        "backend": config.get("run", {}).get("backend") or run.meta.get("backend"),
        "dataset": run.meta.get("dataset"),
        "started": started,
        "wall_sec": wall,
        "rate": (s.finished / wall) if wall else None,
        "summary": s,
        "interval": interval,
        "interval_graded": graded_interval,
        "graded": sum(len(row.scores()) for row in rows),
        "rewarded": sum(len(row.rewards()) for row in rows),
        "pass_at_k": curve,
        "never_solved": never,
        "latency": {q: percentile(latencies, q / 100) for q in (50, 95, 99)},
        "errors_by_stage": sorted(stages.items()),
        "partial": run.partial,
        "live": run.live,
        "stub": s.stub_policy,
        "damaged": run.damaged,
        "nonfinite": run.nonfinite,
        "prompt_source": run.prompt_source,
        "cancelled": run.cancelled,
        "traces": run.traces,
        "threshold": run.pass_threshold,
        "steps": steps,
        "versions": len(versioned),
        "first_step": versioned[0] if versioned else None,
        "last_step": versioned[-1] if versioned else None,
        "off_policy": sum(step.off_policy for step in steps),
        "off_policy_calls": sum(step.off_policy_calls for step in steps),
        "call_versions": any(r.call_versions for r in rollouts),
    }


def _run_charts(run: RunData, figures: dict[str, Any], index: int) -> list[charts.Chart]:
    rollouts = [r for r in run.rollouts if r.status != "cancelled"]
    rewards = [r.reward for r in rollouts if r.ok and r.reward is not None]
    failed_graded = [0.0 for r in rollouts if not r.ok and r.graded] if rewards else []  # (no grader: no zeros)
    slug = f"r{index}"
    out = _step_charts(figures, slug)
    out += [
        charts.histogram(
            "Reward distribution",
            [("rewarded", "s0", rewards), ("failed (counted as 0)", "fail", failed_graded)],
            x_label="reward",
            rules=[("mean", figures["interval"].value)] if figures["interval"] else (),
            note="" if rewards else "no rewarded rollout",
            slug=f"{slug}-reward",
        ),
        charts.lines(
            "pass@k",
            [("pass@k", "s0", [(k, v) for k, v, _ in figures["pass_at_k"]])],
            x_label="k (samples)",
            y_label="pass@k",
            tip="pass@{x} = {y}: the chance that at least one of {x} samples of a row passes",
            note="" if figures["pass_at_k"] else "nothing graded",
            slug=f"{slug}-passk",
        ),
    ]
    ok = [r.latency for r in rollouts if r.ok]
    failed = [r.latency for r in rollouts if not r.ok]
    lat = figures["latency"]
    top = max([*ok, *failed], default=0.0)
    unit, size = duration_unit(top)
    out.append(
        charts.histogram(
            "Latency (workflow + grader)",
            [("succeeded", "ok", [v / size for v in ok]), ("failed", "fail", [v / size for v in failed])],
            x_label="latency",
            unit=unit,
            lo=0.0,
            hi=top / size * 1.02 if top else None,
            rules=[(f"p{q}", v / size) for q, v in lat.items() if v is not None],
            slug=f"{slug}-latency",
        )
    )
    stages = sorted({stage for (_, stage), _ in figures["errors_by_stage"]})
    categories = sorted({cat for (cat, _), _ in figures["errors_by_stage"]})
    counts = dict(figures["errors_by_stage"])
    out.append(
        charts.bars(
            "Errors by category and stage",
            [(cat, [counts.get((cat, st), 0) for st in stages]) for cat in categories],
            [(f"{st} stage", f"st-{st}") for st in stages],
            counted="failed rollouts",
            tip="{group} in the {stack}: {n} {counted}",
            empty="no errors",
            slug=f"{slug}-errors",
        )
    )
    times_ok = [r.finished_at for r in rollouts if r.ok and r.finished_at is not None]
    times_failed = [r.finished_at for r in rollouts if not r.ok and r.finished_at is not None]
    out.append(
        charts.timeline(
            "Rollouts over time",
            times_ok,
            times_failed,
            note="" if times_ok or times_failed else "no timestamps (results written before osmosis recorded them)",
            slug=f"{slug}-time",
        )
    )
    out.extend(_metric_charts(rollouts, slug))
    return out


def _step_charts(figures: dict[str, Any], slug: str) -> list[charts.Chart]:
    """Mean reward and pass rate by training step, and the rollouts of each step (none without versions)."""
    steps: list[StepFigures] = figures["steps"]
    spans = bucketed(steps)
    if not spans:
        return []
    names = [span.label for span in spans]
    versioned = figures["versions"]
    merged = f"; every {math.ceil(versioned / MAX_POINTS)} steps drawn as one" if len(spans) < versioned else ""
    notes = {
        float(i): f"{span.graded} graded of {span.rollouts} rollouts, {span.failed} failed"
        for i, span in enumerate(spans)
    }
    means = [(float(i), mean) for i, span in enumerate(spans) if (mean := span.mean_reward) is not None]
    passes = [(float(i), rate) for i, span in enumerate(spans) if (rate := span.pass_rate) is not None]
    unversioned = next((step.rollouts for step in steps if step.version is None), 0)
    left_out = f"; {unversioned} rollouts without a policy version left out (see the table)" if unversioned else ""
    reward = charts.lines(
        "Reward by training step",
        [("mean reward", "s0", means), ("pass rate", "s2 dashed", passes)],  # (dashed: 0/1 rewards draw one line)
        x_label="policy version (training step)",
        y_label="mean reward / pass rate",
        tip="{x}: {series} {y} ({note})",
        x_names=names,
        notes=notes,
        note=(
            f"Every graded rollout of each step, a failure counting as reward 0 and not passing{merged}{left_out}."
            if means
            else "no rewards"
        ),
        slug=f"{slug}-steps",
    )
    off, calls = figures["off_policy"], figures["off_policy_calls"]
    off_note = (
        f"; {off} off-policy rollout{'s' if off != 1 else ''} ({calls} call{'s' if calls != 1 else ''}), see the table"
        if off
        else ""
    )
    counts = charts.bars(
        "Rollouts by training step",
        [(name, [span.rollouts - span.failed, span.failed]) for name, span in zip(names, spans, strict=True)],
        [("succeeded", "ok"), ("failed", "fail")],
        counted="rollouts",
        tip="{group}: {n} {counted} {stack}",
        x_label="policy version (training step)",
        thin=True,
        note=f"Finished rollouts per policy version (cancelled ones not counted){merged}{off_note}.",
        slug=f"{slug}-step-counts",
    )
    return [reward, counts]


def _scores(run: RunData, rewarded: bool) -> list[float]:
    """Every graded rollout's reward, a failure as 0 (none when no rollout has a reward: no grader)."""
    return [v for row in run.rows.values() for v in row.scores()] if rewarded else []


def _metric_charts(rollouts: Sequence[RolloutRecord], slug: str) -> list[charts.Chart]:
    """A histogram per numeric metric and the commonest values of each short text metric (``reason``)."""
    numbers: dict[str, list[float]] = {}
    odd: Counter[str] = Counter()
    """NaN or infinite values per numeric metric (left out of its histogram, and said so)."""
    texts: dict[str, Counter[str]] = {}
    for r in rollouts:
        for key, value in r.metrics.items():
            if isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)):
                numbers.setdefault(key, []).append(float(value))
            elif isinstance(value, float) or (isinstance(value, str) and value in NONFINITE):
                odd[key] += 1
            elif isinstance(value, str):
                texts.setdefault(key, Counter())[value[:40]] += 1
    out = []
    for key in sorted({*numbers, *odd})[:6]:
        note = f"{odd[key]} NaN or infinite value{'s' if odd[key] != 1 else ''} left out" if odd[key] else ""
        chart = charts.histogram(
            f"metric: {key}", [(key, "s1", numbers.get(key, []))], x_label=key, note=note, slug=f"{slug}-m-{key}"
        )
        out.append(chart)
    for key in sorted(texts)[:4]:
        common = texts[key].most_common(8)
        if len(texts[key]) > 60 and key != "reason":
            continue  # an extracted answer: one value per row, nothing to count
        rest = sum(texts[key].values()) - sum(n for _, n in common)
        note = f"{len(texts[key])} distinct values; the 8 commonest shown ({rest} others)" if rest else ""
        out.append(
            charts.bars(
                f"metric: {key}",
                [(v, [n]) for v, n in common],
                [(key, "s1")],
                tip="{stack} = {group}: {n} {counted}",
                note=note,
                slug=f"{slug}-t-{key}",
            )
        )
    return out


def _rollout_json(r: RolloutRecord, t0: float | None) -> dict[str, Any]:
    item: dict[str, Any] = {"w": r.row, "s": r.sample, "st": STATUS.get(r.status, 1), "id": r.rollout_id}
    if r.reward is not None:
        item["rw"] = round(r.reward, 6)
    if r.passed is not None:
        item["p"] = int(r.passed)
    if r.category:
        item["c"] = r.category
        item["g"] = r.stage
    if r.message:
        item["m"] = r.message
    item["l"] = round(r.latency, 3)
    if r.timings:
        item["t"] = {k: round(v, 3) for k, v in r.timings.items()}
    if r.metrics:
        item["x"] = r.metrics
    if r.grader_metrics is not None:
        item["gm"] = r.grader_metrics
    if r.attempts > 1:
        item["a"] = r.attempts
    if r.finished_at is not None and t0 is not None:
        item["f"] = round(r.finished_at - t0, 2)
    if r.version is not None:
        item["v"] = r.version
    if r.off_policy:
        item["cv"] = list(r.call_versions)
    if r.tokens is not None:
        item["k"] = [
            r.tokens.calls,
            r.tokens.prompt,
            r.tokens.generated,
            int(r.tokens.complete),
            r.tokens.per_call[:50],
        ]
    return item


def _pack(
    runs: Sequence[RunData], budget: int, progress: Progress | None
) -> tuple[list[list[str]], list[dict[int, tuple[int, int]]], str | None, int]:
    """Compressed chunks of trajectories per run, where each rollout landed, the sampling note, the count."""
    per_run = budget // max(len(runs), 1)
    all_chunks: list[list[str]] = []
    places: list[dict[int, tuple[int, int]]] = []
    total = sum(len(run.rollouts) for run in runs)
    done = embedded = 0
    sampled = False
    for run in runs:
        rollouts = run.rollouts
        failed = [i for i, r in enumerate(rollouts) if not r.ok and r.trajectory is not None]
        rest = [i for i, r in enumerate(rollouts) if r.ok and r.trajectory is not None]
        random.Random(SEED).shuffle(rest)
        order = failed + rest
        chunks: list[str] = []
        where: dict[int, tuple[int, int]] = {}
        used = 0
        size = min(CHUNK, max(16, len(order) // 50))
        for start in range(0, len(order), size):
            part = order[start : start + size]
            raw = ("[" + ",".join(rollouts[i].trajectory or "null" for i in part) + "]").encode()
            blob = base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")
            done += len(part)
            if progress is not None:
                progress("compressing trajectories", done, total)
            if used + len(blob) > per_run:
                sampled = True
                break
            used += len(blob)
            for pos, i in enumerate(part):
                where[i] = (len(chunks), pos)
            chunks.append(blob)
        embedded += len(where)
        all_chunks.append(chunks)
        places.append(where)
    note = None
    if sampled:
        note = (
            f"The trajectories of {embedded:,} of {total:,} rollouts are in this file (every failed rollout first, "
            f"then a random sample of the others, seed {SEED}), to keep it under "
            f"{budget / 2**20:.0f} MB; the others show their summary only. Raise the limit with --max-mb."
        )
    return all_chunks, places, note, embedded


LABEL_SHORT = 200
"""Characters of a label the row table holds; the viewer shows up to :data:`LABEL_LONG`."""
LABEL_LONG = 4000


def _label_text(label: Any) -> str:
    return "" if label is None else label if isinstance(label, str) else json.dumps(label, default=str)


def _rows_json(runs: Sequence[RunData], comparison: Comparison | None) -> list[dict[str, Any]]:
    """One entry per row, with each run's rollouts and figures.

    Comparing, every row any run has gets an entry; a run shows a row's rollouts only when the
    row matches the baseline's (same prompt hash; a row the baseline lacks: the first run's that
    has it); ``u`` lists the runs that have the row but do not match, ``x`` those without it.
    """
    offsets: list[dict[int, list[int]]] = []
    for run in runs:
        by_row: dict[int, list[int]] = {}
        for i, r in enumerate(run.rollouts):
            by_row.setdefault(r.row, []).append(i)
        offsets.append(by_row)
    indices = comparison.rows if comparison is not None else list(runs[0].rows)
    out = []
    for index in indices:
        found = [run.rows.get(index) for run in runs]
        first = next(r for r in found if r is not None)
        rows = [
            row if row is first or (row is not None and row.hash and row.hash == first.hash) else None for row in found
        ]
        label = _label_text(first.label)
        entry: dict[str, Any] = {
            "i": index,
            "p": first.text[:400],
            "l": label[:LABEL_SHORT],
            "h": first.hash,
            "r": [offsets[k].get(index, []) if rows[k] is not None else [] for k in range(len(runs))],
        }
        if first.version is not None:
            entry["v"] = first.version
        if first.source_row is not None:
            entry["o"] = first.source_row
        if len(label) > LABEL_SHORT:
            entry["L"] = label[:LABEL_LONG] + (
                f"\u2026 [clipped: {len(label) - LABEL_LONG:,} more characters]" if len(label) > LABEL_LONG else ""
            )
        unmatched = [k for k in range(len(runs)) if found[k] is not None and rows[k] is None]
        if unmatched:
            entry["u"] = unmatched
        absent = [k for k in range(len(runs)) if found[k] is None]
        if absent:
            entry["x"] = absent
        means, passes = [], []
        for row in rows:
            scores = row.scores() if row is not None else []
            means.append(round(sum(scores) / len(scores), 6) if scores else None)
            n, c = row.counts() if row is not None else (0, 0)
            passes.append([c, n])
        entry["m"] = means
        entry["pc"] = passes
        if comparison is not None:
            base = row_passes(rows[0])
            flips = []
            for row in rows[1:]:
                now = row_passes(row)
                flips.append("down" if base is True and now is False else "up" if base is False and now is True else "")
            entry["fl"] = flips
        out.append(entry)
    return out


def mismatch_groups(mismatches: Sequence[Mismatch]) -> list[tuple[str, Mismatch]]:
    """Runs of consecutive rows not matched for the same reason, as ``("rows 5-39", first)``; a row
    whose prompts differ stands alone (its hashes are shown)."""
    groups: list[tuple[int, int, Mismatch]] = []
    for m in mismatches:
        if groups and m.reason != "different prompts" and groups[-1][2].reason == m.reason:
            first, last, head = groups[-1]
            if last + 1 == m.index:
                groups[-1] = (first, m.index, head)
                continue
        groups.append((m.index, m.index, m))
    return [(f"row {a}" if a == b else f"rows {a}\u2013{b}", m) for a, b, m in groups]


def _script_json(data: Any) -> markupsafe.Markup:
    """JSON that is safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` left raw."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return markupsafe.Markup(text)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("osmosis_report", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["num"] = _fmt_num
    env.filters["pct"] = lambda v: "\u2013" if v is None else f"{v:.1%}"
    env.filters["secs"] = format_duration
    env.filters["durations"] = format_durations
    env.filters["interval"] = lambda i: "\u2013" if i is None else f"{i.value:.3f} [{i.low:.3f}, {i.high:.3f}]"
    env.filters["signed"] = _signed
    env.globals["mismatch_groups"] = mismatch_groups
    return env


def _signed(i: Interval | None) -> str:
    if i is None:
        return "\u2013"
    return f"{i.value:+.3f} [{i.low:+.3f}, {i.high:+.3f}]"


def _asset(name: str) -> str:
    return resources.files("osmosis_report").joinpath("templates", name).read_text(encoding="utf-8")


def render_runs(
    runs: Sequence[RunData],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: Progress | None = None,
    generated: str | None = None,
) -> tuple[str, int, Comparison | None]:
    """The page's HTML for ``runs`` (one: a run's report; more: the first against each other), and
    how many trajectories it embeds."""
    comparison = compare(runs) if len(runs) > 1 else None
    figures = [run_figures(run) for run in runs]
    run_charts = [_run_charts(run, f, i) for i, (run, f) in enumerate(zip(runs, figures, strict=True))]
    compare_charts: list[charts.Chart] = []
    if comparison is not None:
        colours = [f"s{i % 6}" for i in range(len(runs))]
        compare_charts.append(
            charts.lines(
                "pass@k, overlaid",
                [
                    (f"{i + 1}. {f['name']}", colours[i], [(k, v) for k, v, _ in f["pass_at_k"]])
                    for i, f in enumerate(figures)
                ],
                x_label="k (samples)",
                y_label="pass@k",
                tip="{series}: pass@{x} = {y}",
                slug="cmp-passk",
            )
        )
        categories = sorted({c for f in figures for c in f["summary"].errors_by_category})
        compare_charts.append(
            charts.bars(
                "Errors by category, side by side",
                [(c, [f["summary"].errors_by_category.get(c, 0) for f in figures]) for c in categories],
                [(f"{i + 1}. {f['name']}", colours[i]) for i, f in enumerate(figures)],
                grouped=True,
                counted="failed rollouts",
                tip="{group} in {stack}: {n} {counted}",
                empty="no errors in any run",
                slug="cmp-errors",
            )
        )
        compare_charts.append(
            charts.histogram(
                "Reward distribution, side by side",
                [
                    (f"{i + 1}. {run.name}", colours[i], _scores(run, f["interval"] is not None))
                    for i, (run, f) in enumerate(zip(runs, figures, strict=True))
                ],
                x_label="reward",
                stacked=False,
                note="Every graded rollout of each run; a failed rollout counts as 0.",
                slug="cmp-reward",
            )
        )
    t0s = []
    rollouts_json = []
    for run in runs:
        times = [r.finished_at for r in run.rollouts if r.finished_at is not None]
        t0 = min(times) if times else None
        t0s.append(t0)
        rollouts_json.append([_rollout_json(r, t0) for r in run.rollouts])
    rows_json = _rows_json(runs, comparison)
    data: dict[str, Any] = {
        "runs": [{"name": run.name, "threshold": run.pass_threshold} for run in runs],
        "rollouts": rollouts_json,
        "rows": rows_json,
        "categories": sorted({r.category for run in runs for r in run.rollouts if r.category}),
        "steps": list(dict.fromkeys(v for run in runs for v in run.versions)),
    }
    script = _asset("report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    template = _environment().get_template("report.html.j2")
    total = sum(len(run.rollouts) for run in runs)
    context: dict[str, Any] = {
        "runs": runs,
        "figures": figures,
        "run_charts": run_charts,
        "comparison": comparison,
        "compare_charts": compare_charts,
        "style": markupsafe.Markup(_asset("report.css")),
        "script": markupsafe.Markup(script),
        "script_hash": digest,
        "generated": generated or _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "total_rollouts": total,
    }
    # the page without trajectories, measured: what is left of max_bytes is theirs (and their index's)
    bare = template.render(**context, data=_script_json(data), chunks=[], sample_note=None)
    index_bytes = 14 * total
    budget = max(max_bytes - len(bare.encode()) - index_bytes - 600, 0)
    chunks, places, sample_note, embedded = _pack(runs, budget, progress)
    data["places"] = [{str(i): list(p) for i, p in where.items()} for where in places]
    html = template.render(**context, data=_script_json(data), chunks=chunks, sample_note=sample_note)
    return html, embedded, comparison


def build_report(
    run_dirs: Sequence[Path | str],
    output: Path | str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: Progress | None = None,
    runs: Sequence[RunData] | None = None,
) -> Built:
    """Read ``run_dirs`` (unless ``runs`` are given, already read) and write the report to ``output``
    (atomically: a page being replaced is never seen half-written)."""
    started = time.perf_counter()
    if runs is None:
        loaded = []
        for k, folder in enumerate(run_dirs):

            def on_lines(done: int, total: int, k: int = k) -> None:
                if progress is not None:
                    progress(f"reading run {k + 1} of {len(run_dirs)}", done, total)

            loaded.append(load_run(folder, on_lines=on_lines))
        runs = loaded
    html, embedded, comparison = render_runs(runs, max_bytes=max_bytes, progress=progress)
    if progress is not None:
        progress("writing", 0, 1)
    target = Path(output)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(html, encoding="utf-8")
    os.replace(temporary, target)
    if progress is not None:
        progress("writing", 1, 1)
    return Built(
        target,
        target.stat().st_size,
        time.perf_counter() - started,
        sum(len(run.rollouts) for run in runs),
        embedded,
        list(runs),
        comparison,
    )
