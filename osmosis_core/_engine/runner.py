"""Driving a backend over a dataset: the engine behind ``osmosis run``.

:func:`prepare_run` checks everything that can be checked before a rollout starts (config,
dataset, backend, rollout import, run folder); :func:`execute_run` then feeds every missing
(row, sample) pair to the backend with a bounded number in flight, writes each result the moment
it is known, and stops cleanly on Ctrl-C or SIGTERM, keeping every finished result.

One rollout, from ``osmosis run configs/eval/x.toml`` to its line in ``results.jsonl``, file by file
(paths below ``osmosis_core/``):

1. ``cli/run_cmd.py``: the command reads its flags; ``cli/common.py`` (``resolve_config``) reads
   the config with ``_engine/config.py`` (``load_config``: a :class:`RunConfig`, every problem named
   with its key path) and applies the flags over it.
2. ``_engine/runner.py`` (here), :func:`prepare_run`: ``_engine/dataset.py`` reads the rows
   (``read_dataset``); ``_engine/loader.py`` imports the rollout's entrypoint (``load_rollout``: the
   workflow and grader classes, each checked by ``backend.py``'s ``resolve_object``, and their
   configs); ``_engine/run_lock.py`` locks the run folder; on ``--resume``, ``_engine/results.py``
   (``latest_records``) reads each pair's latest line as a :class:`LineOutcome` (through
   ``wire.py``'s converter) and says which pairs are done; ``build_backend`` puts the classes, configs,
   limits and paths in one ``backend.py`` :class:`BackendSetup` (resolved once; its ``grades``
   is the grading rule) and calls the backend's factory from ``_engine/registry.py``
   (``local``: ``_engine/builtin.py``'s ``local_backend``, a ``local.py`` :class:`LocalBackend`, or
   ``_engine/workers.py``'s pool of them with ``[run] workers``). With traces,
   ``_engine/traces.py`` (``make_trace_gateway``) makes the gateway a plugin provides.
3. :func:`execute_run` starts that gateway (``_Execution.run``); ``_Execution.rollout``: the pair
   becomes a ``records.py`` :class:`ExecutionRequest` (with its own policy route when traced), and
   ``lifecycle.py``'s :func:`run_one` runs it on the backend and returns its one final result (the
   caller's side of the seam: what goes wrong around the backend becomes a failure there, not here).
4. The backend's side, ``local.py`` ``LocalBackend.execute``: ``lifecycle.py``'s
   :class:`RolloutReporter` reports each stage once; ``run_workflow`` runs the author's
   ``workflow.py`` :class:`AgentWorkflow` in a ``context.py`` :class:`RolloutContext`, whose model
   calls (``policy.py`` ``chat_completion``, ``sampling.py``'s settings applied) go out through
   ``http/client.py``; ``run_grader`` runs the :class:`Grader` on the sample; each result goes
   back through the callbacks into ``lifecycle.py``'s :class:`RolloutReports`.
5. ``_Execution.record``: ``wire.py``'s ``result_line`` turns the final result into the line,
   ``_engine/results.py``'s ``ResultWriter`` redacts every secret (``errors.py``) and appends it to
   ``results.jsonl`` (the trace line to ``traces.jsonl`` first), ``ResultStats`` counts the
   result's :class:`LineOutcome` and ``cli/display.py`` shows the progress. At the end,
   ``summary.json`` and the plugins' ``osmosis_run_progress`` hooks.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import anyio
import attrs

from osmosis_core import __version__
from osmosis_core._engine.config import RunConfig, policy_endpoint, structure_table
from osmosis_core._engine.dataset import DatasetRow, fingerprint, read_dataset
from osmosis_core._engine.loader import LoadedRollout, load_rollout
from osmosis_core._engine.registry import PluginRegistry, get_registry
from osmosis_core._engine.results import LineOutcome, ResultStats, ResultWriter, RunProgress, Summary, latest_records
from osmosis_core._engine.run_lock import RunLock
from osmosis_core._engine.spelling import did_you_mean
from osmosis_core._engine.traces import RunTraces, make_trace_gateway
from osmosis_core.backend import BackendSetup, BackendSpec, ExecutionBackend, RunLimits
from osmosis_core.errors import ConfigError, OsmosisError, PluginError, error_info
from osmosis_core.lifecycle import RolloutReports, run_one
from osmosis_core.records import (
    ErrorCategory,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    PolicyEndpoint,
)
from osmosis_core.traces import TRACES, traces_enabled
from osmosis_core.wire import finite_json, nonfinite_paths, result_line
from osmosis_core.workflow import ConcurrencyConfig

__all__ = ["Reporter", "RunOutcome", "RunPlan", "execute_run", "prepare_run"]

log = logging.getLogger("osmosis.run")

RUN_META = "run.json"
RESULTS = "results.jsonl"
SUMMARY = "summary.json"
RESOLVED_CONFIG = "config.toml"
PROGRESS_EVERY_SEC = 60.0
"""How often a long run tells the ``osmosis_run_progress`` hooks how it is going."""


class Reporter(Protocol):
    """Receives progress; the CLI's is a rich progress bar."""

    def start(self, total: int, already_done: ResultStats) -> None: ...

    def advance(self, line: dict[str, Any], stats: ResultStats) -> None: ...

    def stop(self) -> None: ...


class _Silent:
    def start(self, total: int, already_done: ResultStats) -> None:
        pass

    def advance(self, line: dict[str, Any], stats: ResultStats) -> None:
        pass

    def stop(self) -> None:
        pass


@attrs.define
class RunPlan:
    """A checked run, ready to execute."""

    config: RunConfig
    rollout: LoadedRollout
    rows: list[DatasetRow]
    pending: list[tuple[int, int]]
    """(row index, sample index) pairs still to run."""
    stats: ResultStats
    """Totals of the results already in the run folder (a resumed run)."""
    run_dir: Path
    policy: PolicyEndpoint
    backend: ExecutionBackend
    in_flight: int
    stub_policy: bool = False
    lock: RunLock | None = None
    """The run folder's lock, held until :func:`execute_run` ends."""
    retried: int = 0
    """Pairs run again because their latest record failed (``--retry-failed``)."""
    registry: PluginRegistry | None = None
    """Whose ``osmosis_run_progress`` hooks hear how the run goes (None: the process-wide registry)."""
    gateway: Any = None
    """The policy gateway recording each call (:class:`~osmosis_core.traces.TraceGateway`), with traces on."""

    @property
    def total(self) -> int:
        """Rollouts in the whole run (rows x samples)."""
        return len(self.rows) * self.config.run.n_samples


@attrs.frozen
class RunOutcome:
    """How a run ended."""

    summary: Summary
    run_dir: Path
    interrupted: bool
    stopped: str | None = None
    """Why the run stopped before its end on its own (the backend became unusable); resumable."""
    failing: str | None = None
    """Why the run counts as failed (every rollout failed, or more than ``[run] max_failure_rate``)."""
    written: tuple[tuple[str, Path], ...] = ()
    """``(plugin name, path)`` of the files the progress hooks wrote at the end (``report.html``)."""


def _latest_run(root: Path, name: str) -> Path | None:
    """The newest ``runs/<name>-<YYYYmmdd-HHMMSS>[-NN]`` folder (not another config's that shares a prefix)."""
    pattern = re.compile(rf"{re.escape(name)}-\d{{8}}-\d{{6}}(-\d\d)?")
    runs = sorted(p for p in (root / "runs").glob(f"{name}-*") if pattern.fullmatch(p.name))
    runs = [p for p in runs if (p / RUN_META).is_file()]
    return runs[-1] if runs else None


def _run_dir(config: RunConfig, *, resume: bool) -> Path:
    if config.run.output:
        out = config.resolve(config.run.output)
        assert out is not None
        return out
    if resume:
        latest = _latest_run(config.root, config.name)
        if latest is None:
            raise OsmosisError(
                f"--resume: no earlier run of {config.name!r} under {config.root / 'runs'}; "
                "name the run folder with --output"
            )
        return latest
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = config.root / "runs" / f"{config.name}-{stamp}"
    for n in range(2, 100):  # two runs started in the same second get their own folders
        if not run_dir.exists():
            break
        run_dir = config.root / "runs" / f"{config.name}-{stamp}-{n:02d}"
    return run_dir


def build_backend(
    config: RunConfig, rollout: LoadedRollout, registry: PluginRegistry, run_dir: Path | None
) -> ExecutionBackend:
    """The configured backend, with its ``[backend.<name>]`` table read into its config type."""
    source = str(config.source or "<config>")
    name = config.run.backend
    try:
        spec = registry.backend(name)
    except PluginError as exc:
        raise ConfigError(source, [f"{exc} @ $.run.backend"]) from None
    names = [b.name for b in registry.backends()]
    unknown = sorted(set(config.backend) - set(names))
    if unknown:
        raise ConfigError(
            source, [f"no backend is called {n!r}{did_you_mean(n, names)} @ $.backend.{n}" for n in unknown]
        )
    backend_config = backend_config_of(spec, config.backend.get(name, {}), source)
    setup = BackendSetup(
        workflow_class=rollout.workflow_class,
        workflow_config=rollout.workflow_config,  # the author's, as written: the run's limits travel apart
        grader_class=rollout.grader_class,
        grader_config=rollout.grader_config,
        backend_config=backend_config,
        rollout_dir=rollout.rollout_dir,
        run_dir=run_dir,
        config_root=config.root,
        dataset_path=config.resolve(config.dataset.path),
        workers=config.run.workers,
        require_labels=config.run.require_labels,
        limits=RunLimits(concurrency=config.run.concurrency),
    )
    return _make_backend(spec, setup, registry)


def backend_config_of(spec: BackendSpec, table: dict[str, Any], source: str) -> Any:
    """A backend's ``[backend.<name>]`` table read into its spec's config type (None when it takes none)."""
    config_type = spec.resolve_config_type()
    if config_type is None:
        if table:
            raise ConfigError(source, [f"the {spec.name!r} backend takes no settings @ $.backend.{spec.name}"])
        return None
    return structure_table(table, config_type, f"$.backend.{spec.name}", source)


def _make_backend(spec: Any, setup: BackendSetup, registry: PluginRegistry) -> ExecutionBackend:
    """Call a backend spec's factory with ``setup``; a factory that cannot be imported or called so is
    reported naming the plugin and the factory (not as the user's mistake)."""
    import inspect

    plugin = registry.provider_of("backend", spec.name)
    who = f"backend {spec.name!r} of plugin {plugin.name!r} ({plugin.provider})" if plugin else f"backend {spec.name!r}"
    shown = spec.factory if isinstance(spec.factory, str) else getattr(spec.factory, "__qualname__", repr(spec.factory))
    try:
        factory = spec.resolve_factory()
    except Exception as exc:
        raise PluginError(f"{who}: cannot import its factory {shown!r}: {type(exc).__name__}: {exc}") from None
    try:
        inspect.signature(factory).bind(setup)
    except TypeError as exc:
        raise PluginError(f"{who}: its factory {shown!r} cannot be called with a BackendSetup ({exc})") from None
    except ValueError:  # no signature to check (a builtin): call it and see
        pass
    backend = factory(setup)
    if not isinstance(backend, ExecutionBackend):
        raise PluginError(f"{who}: its factory {shown!r} returned {type(backend).__name__}, not an ExecutionBackend")
    return backend


def prepare_run(
    config: RunConfig,
    *,
    resume: bool = False,
    retry_failed: frozenset[ErrorCategory] | None = None,
    registry: PluginRegistry | None = None,
    policy_override: PolicyEndpoint | None = None,
) -> RunPlan:
    """Check the whole run before any rollout starts, and work out what is left to run.

    :param resume: finish the run in the folder (``--resume``): run the (row, sample) pairs it has
        no record of, or whose latest record is ``cancelled``.
    :param retry_failed: also run again the pairs whose latest record failed with one of these
        categories (``--retry-failed``; implies ``resume``). Earlier records stay in the file; the
        summary counts each pair once, by its latest record.
    :param policy_override: the endpoint to use instead of ``[policy]`` (``--stub-policy``).
    :raises OsmosisError: with a message naming the file and line, or the config key, at fault.
    """
    registry = registry or get_registry()
    source = str(config.source or "<config>")
    resume = resume or retry_failed is not None
    stub = policy_override is not None
    if not stub and not config.policy.base_url:
        raise ConfigError(
            source,
            ["no policy endpoint: set policy.base_url (or --policy-url), or use --stub-policy @ $.policy.base_url"],
        )
    policy = policy_override if policy_override is not None else policy_endpoint(config)
    gateway = None
    if traces_enabled(config.traces):  # (the plugin checks the [traces] table before anything is written)
        gateway = make_trace_gateway(policy, config.traces, source=source, registry=registry)
    dataset_path = config.resolve(config.dataset.path)
    if dataset_path is None:
        raise ConfigError(source, ["no dataset: set dataset.path (or --dataset) @ $.dataset.path"])
    rows = read_dataset(dataset_path, limit=config.dataset.limit)
    rollout = load_rollout(config, registry)
    run_dir = _run_dir(config, resume=resume)
    meta = {
        "osmosis_core": __version__,
        "config": str(config.source) if config.source else None,
        "dataset": str(dataset_path),
        "dataset_sha256": fingerprint(dataset_path),
        "rows": len(rows),
        "n_samples": config.run.n_samples,
        "stub_policy": stub,
        "started": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    created = not run_dir.exists()
    lock = RunLock(run_dir).acquire()
    try:
        stats = ResultStats(pass_threshold=config.run.pass_threshold, secrets=policy.secrets())
        done: set[tuple[int, int]] = set()
        retried = 0
        results = run_dir / RESULTS
        if resume:
            if not (run_dir / RUN_META).is_file():
                raise OsmosisError(f"--resume: {run_dir} holds no run ({RUN_META} is missing)")
            before = json.loads((run_dir / RUN_META).read_text(encoding="utf-8"))
            for key in ("dataset_sha256", "rows", "n_samples"):
                if before.get(key) != meta[key]:
                    raise OsmosisError(
                        f"--resume: {key} changed since {run_dir} was started ({before.get(key)} -> {meta[key]}); "
                        "start a new run instead"
                    )
            again = retry_failed or frozenset()
            for pair, outcome in latest_records(results).items():
                if outcome.status is ExecutionStatus.CANCELLED:
                    continue
                if outcome.status is not ExecutionStatus.SUCCESS and outcome.error and outcome.error.category in again:
                    retried += 1
                    continue
                done.add(pair)
                stats.add(outcome)
        elif results.exists() and results.stat().st_size > 0:
            raise OsmosisError(f"{run_dir} already holds results; finish it with --resume or choose another --output")
        pending = [(row.index, s) for row in rows for s in range(config.run.n_samples) if (row.index, s) not in done]
        if not resume:  # a resumed run keeps the record of how it was started
            (run_dir / RUN_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            _write_resolved_config(config, run_dir / RESOLVED_CONFIG, policy, stub=stub)
        # last: once the backend exists (it may hold worker processes), nothing here can fail any more
        backend = build_backend(config, rollout, registry, run_dir)
    except BaseException:
        lock.release()
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    limit = backend.max_concurrency or config.run.concurrency or ConcurrencyConfig().limit
    return RunPlan(
        config=config,
        rollout=rollout,
        rows=rows,
        pending=pending,
        stats=stats,
        run_dir=run_dir,
        policy=policy,
        backend=backend,
        in_flight=2 * limit,
        stub_policy=stub,
        lock=lock,
        retried=retried,
        registry=registry,
        gateway=gateway,
    )


def _write_resolved_config(config: RunConfig, path: Path, policy: PolicyEndpoint, *, stub: bool) -> None:
    import tomlkit

    data = config.to_dict()
    data["policy"]["base_url"] = policy.base_url
    data["policy"]["model"] = policy.model
    data["policy"]["headers"] = {name: "***" for name in data["policy"].get("headers", {})}  # names only
    doc = tomlkit.document()
    doc.add(tomlkit.comment("The resolved config of this run (flags applied). It holds no key and no header value."))
    if stub:
        doc.add(tomlkit.comment("--stub-policy: the policy was the scripted calculator server, not a model."))
    for key, value in data.items():
        doc[key] = value
    path.write_text(tomlkit.dumps(doc), encoding="utf-8")


async def execute_run(
    plan: RunPlan,
    reporter: Reporter | None = None,
    *,
    handle_signals: bool = True,
    exit_on_second_signal: bool = False,
    progress_every: float = PROGRESS_EVERY_SEC,
) -> RunOutcome:
    """Run every pending pair of ``plan``; return the summary. Ctrl-C / SIGTERM stop it cleanly.

    A rollout's result is written the moment it is known. A rollout cancelled by the run (Ctrl-C,
    SIGTERM) is not written, so ``--resume`` runs it again. When the backend becomes unusable
    (:class:`~osmosis_core.errors.BackendUnavailable`), the run stops the same way and says so.
    ``summary.json`` is written before the backend winds down.

    With ``handle_signals`` a first Ctrl-C / SIGTERM, from the start of the run to the end of its
    wind-down, cancels the rollouts in flight and waits for them; once every rollout has its result
    it cancels nothing (the run is complete and says so). From that signal on (or from the end of the
    wind-down, when none came) the handlers found are back, so a second signal has its usual effect
    (``KeyboardInterrupt``, or SIGTERM's default). With ``exit_on_second_signal`` (what ``osmosis
    run`` passes) the process keeps the run's handlers instead and the caller puts its own back when
    it is done: a second signal writes the summary and exits 130 at once, even while a rollout blocks
    the event loop, and a first one after the run (while ``osmosis run`` prints its summary) changes
    nothing. What runs in processes the run started
    (workers, the stand-in server, bubblewrap sandboxes, a local Ray cluster) dies with it; a
    backend's resources elsewhere (a Harbor docker or cloud environment) are not stopped then.

    The plugins' ``osmosis_run_progress`` hooks hear of the run every ``progress_every`` seconds
    while results come in, and once at its end (interrupted or not), in a worker thread: never on
    the rollouts' path, and a hook that raises is logged once and does not fail the run.
    """
    execution = _Execution(plan, reporter or _Silent(), exit_on_second_signal, progress_every)
    return await execution.run(handle_signals=handle_signals)


class _Execution:
    """One :func:`execute_run`: its state, and one method per part of the run."""

    def __init__(self, plan: RunPlan, reporter: Reporter, exit_on_second_signal: bool, progress_every: float) -> None:
        self.plan = plan
        self.reporter = reporter
        self.exit_on_second_signal = exit_on_second_signal
        self.progress_every = progress_every
        self.stats = plan.stats
        self.rows = {row.index: row for row in plan.rows}
        self.token = secrets.token_hex(3)
        self.secrets = plan.policy.secrets()
        self.writer = ResultWriter(plan.run_dir / RESULTS, secrets=self.secrets)
        self.traces = RunTraces(plan.gateway, plan.run_dir / TRACES, self.secrets) if plan.gateway is not None else None
        self.registry = plan.registry or get_registry()
        self.pending: Iterator[tuple[int, int]] = iter(plan.pending)
        self.interrupted = False
        self.stopped: str | None = None
        """Why the backend became unusable (the run stopped, resumable)."""
        self.ended = False
        """Every pending pair was run, or the run stopped through its own signal handling."""
        self.summary: Summary | None = None
        self.started = time.perf_counter()
        self.written: tuple[tuple[str, Path], ...] = ()
        """The files the progress hooks wrote at the end (their plugin's name, the path)."""
        self.told_nonfinite: set[tuple[str, str]] = set()
        """(metric path, stage) of the NaN or infinite metrics already said."""
        self.left = len(plan.pending)
        """Pending pairs without a recorded result yet (0: the rollouts are over, nothing to cancel)."""
        self.signalled = False
        """A first SIGINT / SIGTERM came (during the rollouts or after them)."""

    # the rollouts

    def record(
        self, row: int, sample_index: int, result: ExecutionResult, workflow_metrics: dict[str, Any] | None = None
    ) -> None:
        """Write one rollout's final result; a sample that is not JSON fails the rollout, not the run.

        ``workflow_metrics`` (the workflow result's, copied when it was reported) tell the grader's
        metrics from the workflow's. A NaN or infinite metric is written as a string (see
        :mod:`osmosis_core.wire`) and said once per metric, naming the stage that set it; one
        anywhere else in the sample fails the rollout at the workflow stage, naming where it is.
        """
        line = result_line(row, sample_index, result, workflow_metrics=workflow_metrics)
        if result.sample is not None and result.sample.metrics:
            self.tell_nonfinite_metrics(row, sample_index, result, line.get("grader_metrics"))
        try:
            self.writer.write(line)
        except (TypeError, ValueError) as exc:
            info = error_info(exc, category=ErrorCategory.VALIDATION_ERROR)
            stage, message = result.stage, f"the sample cannot be written as JSON: {info.message}"
            found = nonfinite_paths(line.get("sample"), "sample")
            if found:  # the messages are the workflow's
                where, value = found[0]
                stage = ExecutionStage.WORKFLOW
                message = (
                    f"the workflow's sample cannot be written as JSON: {where} is {value!r} "
                    f"(results.jsonl is strict JSON; {len(found)} such value{'s' if len(found) > 1 else ''})"
                )
            result = ExecutionResult(
                result.rollout_id, stage, ExecutionStatus.FAILURE, error=attrs.evolve(info, message=message),
                timings=result.timings,
            )  # fmt: skip
            line = result_line(row, sample_index, result)
            self.writer.write(line)
        self.stats.add(LineOutcome.of(result))
        self.left -= 1
        self.reporter.advance(line, self.stats)

    def tell_nonfinite_metrics(
        self, row: int, sample_index: int, result: ExecutionResult, graders: list[str] | None
    ) -> None:
        """Say (once per metric and stage) that a metric is NaN or infinite, which stage set it, and
        how ``results.jsonl`` holds it."""
        assert result.sample is not None
        for key, item in result.sample.metrics.items():
            for where, value in nonfinite_paths({key: item}, "metrics"):
                if graders is not None:
                    stage = "grader" if str(key) in graders else "workflow"
                else:
                    stage = "workflow" if result.stage is ExecutionStage.WORKFLOW else "workflow or grader"
                if (where, stage) in self.told_nonfinite:
                    continue
                self.told_nonfinite.add((where, stage))
                log.warning(
                    "row %d sample %d: %s, set by the %s, is %r: results.jsonl holds it as the string %r "
                    "(said once per metric)",
                    row,
                    sample_index,
                    where,
                    stage,
                    value,
                    finite_json(value),
                )

    async def rollout(self, row_index: int, sample_index: int, scope: anyio.CancelScope) -> None:
        """Run one (row, sample) pair on the backend and record its final result."""
        plan, run, traces = self.plan, self.plan.config.run, self.traces
        row = self.rows[row_index]
        rollout_id = f"{self.token}-{row_index}-{sample_index}"
        request = ExecutionRequest(
            rollout_id=rollout_id,
            prompt=row.prompt,
            policy=plan.policy if traces is None else traces.open(rollout_id),
            label=row.label,
            metadata=row.metadata,
            agent_timeout_sec=run.agent_timeout_sec,
            grader_timeout_sec=run.grader_timeout_sec,
        )
        reports = RolloutReports(request)
        last = await run_one(plan.backend, request, reports, secrets=self.secrets)
        if reports.unavailable is not None:
            if self.stopped is None:
                self.stopped = reports.unavailable
            scope.cancel()  # the rollout never started: nothing is recorded, the run stops, resumable
            return
        if traces is not None:  # the trace line first: a result in the file always has its trace
            traces.finish(rollout_id, row_index, sample_index, write=last.status is not ExecutionStatus.CANCELLED)
        if last.status is ExecutionStatus.CANCELLED:
            return
        self.record(row_index, sample_index, last, reports.workflow_metrics)

    async def worker(self, scope: anyio.CancelScope) -> None:
        """Take pending pairs one at a time until none is left (``in_flight`` workers share them)."""
        for row_index, sample_index in self.pending:
            await self.rollout(row_index, sample_index, scope)

    # the summary and the progress hooks

    def now(self, wall: float, *, interrupted: bool) -> Summary:
        """The summary of the results so far."""
        plan = self.plan
        return Summary.from_stats(
            self.stats,
            rows=len(plan.rows),
            n_samples=plan.config.run.n_samples,
            wall_sec=wall,
            interrupted=interrupted,
            stub_policy=plan.stub_policy,
        )

    def write_summary(self, wall: float) -> Summary:
        """Write ``summary.json`` (whole or not at all: a kill while writing leaves the old file)."""
        written = self.now(wall, interrupted=self.interrupted or self.stopped is not None or not self.ended)
        path = self.plan.run_dir / SUMMARY
        temporary = path.with_name(f".{SUMMARY}.tmp")
        temporary.write_text(json.dumps(written.to_json(), indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, path)
        return written

    def progress(self, final: bool) -> RunProgress:
        """What the ``osmosis_run_progress`` hooks hear."""
        now = self.now(time.perf_counter() - self.started, interrupted=False)
        summary = self.summary if final and self.summary is not None else now
        return RunProgress(self.plan.run_dir, summary, final, config=self.plan.config)

    async def tell_progress(self) -> None:
        """Every ``progress_every`` seconds in which results came in, in a thread (a hook may take seconds)."""
        told = self.stats.finished
        while True:
            await anyio.sleep(self.progress_every)
            if self.stats.finished != told:
                told = self.stats.finished
                await anyio.to_thread.run_sync(self.registry.tell_progress, self.progress(False))

    # signals

    @property
    def over(self) -> bool:
        """Every pending pair has its result (or the run is winding down): a signal cancels nothing."""
        return self.ended or self.left <= 0 or self.summary is not None

    async def watch_signals(self, scope: anyio.CancelScope) -> None:
        """Wait for the first Ctrl-C / SIGTERM (:meth:`first_signal`; the rules are :func:`execute_run`'s)
        from the start of the run to the end of its wind-down (the backend's close, the progress
        hooks' last call), then, at once, hand the signals over (:meth:`hand_over`), held back meanwhile."""
        found: dict[int, Any] = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
        receiver = anyio.open_signal_receiver(*_STOP_SIGNALS)
        signals = receiver.__enter__()
        try:
            async for _ in signals:
                self.first_signal(scope)
                break
        finally:
            # held back in this thread meanwhile (only a signal another thread takes in the microseconds
            # between the receiver's Python defaults and the handlers below meets those defaults)
            with _signals_blocked():
                receiver.__exit__(None, None, None)  # (it puts back Python's defaults, not what it found)
                self.hand_over(found)

    def hand_over(self, found: dict[int, Any]) -> None:
        """The signals' handlers once the run stops watching them: with ``exit_on_second_signal``,
        :meth:`stop_now` after a first signal, else :meth:`after_the_run`; without, those it found."""
        if self.exit_on_second_signal:
            found = dict.fromkeys(_STOP_SIGNALS, self.stop_now if self.signalled else self.after_the_run)
        for signum, handler in found.items():
            signal.signal(signum, handler)

    def first_signal(self, scope: anyio.CancelScope | None) -> None:
        """A first SIGINT / SIGTERM: cancel the rollouts in flight, or, once they are over, nothing."""
        self.signalled = True
        again = " (again to stop at once)" if self.exit_on_second_signal else ""
        if scope is not None and not self.over:
            self.interrupted = True
            scope.cancel()
            message = f"interrupted: cancelling the rollouts in flight{again}"
        elif scope is not None:
            message = f"stop requested after the last rollout: nothing to cancel, the run is complete{again}"
        else:
            return  # after the run's own wind-down (osmosis run printing its summary): nothing to say
        with contextlib.suppress(OSError):  # a closed stderr must not end the run's wind-down
            print(message, file=sys.stderr)

    def after_the_run(self, signum: int, frame: Any) -> None:
        """A first signal after the run stopped watching (``osmosis run`` printing its summary): the
        run is complete, so it goes on; a second one stops at once (:meth:`stop_now`)."""
        self.first_signal(None)
        for stop in _STOP_SIGNALS:
            signal.signal(stop, self.stop_now)

    def stop_now(self, signum: int, frame: Any) -> None:
        """The second signal (a plain handler: it runs even while a rollout blocks the event loop)."""
        try:
            with contextlib.suppress(Exception):
                self.reporter.stop()
            with contextlib.suppress(Exception):
                self.writer.close()  # every reported line is already written and flushed
            if self.summary is None:
                with contextlib.suppress(Exception):
                    self.write_summary(time.perf_counter() - self.started)
            waited = "the run's wind-down" if self.over else "the rollouts in flight"
            with contextlib.suppress(Exception):
                print(
                    f"interrupted again: stopped without waiting for {waited}; "
                    f"{self.stats.finished} finished results are kept in {self.plan.run_dir}",
                    file=sys.stderr,
                    flush=True,
                )
                sys.stdout.flush()
        finally:
            os._exit(130)

    # the whole run

    async def run(self, *, handle_signals: bool) -> RunOutcome:
        """Run the workers, then wind down: summary first, then the backend, traces, HTTP clients, lock."""
        from osmosis_core.http.client import preload

        plan = self.plan
        listening = self.registry.hears_progress()
        preload()  # the HTTP client's import is start-up, not the first rollouts' time
        self.reporter.start(plan.total, self.stats)
        self.started = time.perf_counter()
        async with anyio.create_task_group() as guard:  # the signal watcher outlives the rollouts' cancellation
            rollouts = anyio.CancelScope()
            if handle_signals:
                guard.start_soon(self.watch_signals, rollouts)
            if listening:
                guard.start_soon(self.tell_progress)
            try:
                if self.traces is not None:
                    await self.traces.start()
                with rollouts:
                    async with anyio.create_task_group() as workers:
                        for _ in range(min(plan.in_flight, len(plan.pending))):
                            workers.start_soon(self.worker, rollouts)
                self.ended = True
            finally:
                wall = time.perf_counter() - self.started
                self.reporter.stop()
                self.writer.close()
                signalled = self.interrupted  # a signal while the backend winds down changes the record no more
                try:
                    self.summary = self.write_summary(wall)  # before the backend's wind-down (its grace period)
                finally:
                    try:
                        await self.close_all()
                        await self.tell_the_end(listening)
                    finally:
                        guard.cancel_scope.cancel()  # (the signals are watched to the end of the wind-down)
        assert self.summary is not None  # (written above, or its error raised)
        failing = None if signalled or self.stopped else _failing(self.summary, plan.config.run.max_failure_rate)
        return RunOutcome(
            self.summary, plan.run_dir, signalled, stopped=self.stopped, failing=failing, written=self.written
        )

    async def close_all(self) -> None:
        from osmosis_core.http.client import aclose_http

        with anyio.CancelScope(shield=True):
            try:
                await self.plan.backend.aclose()
            finally:
                if self.traces is not None:
                    await self.traces.aclose()
                await aclose_http()
                if self.plan.lock is not None:
                    self.plan.lock.release()

    async def tell_the_end(self, listening: bool) -> None:
        if listening:
            with anyio.CancelScope(shield=True):
                written = await anyio.to_thread.run_sync(self.registry.tell_progress, self.progress(True))
                self.written = tuple(written)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held back (not lost) while their handlers change hands, then delivered."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _failing(summary: Summary, max_failure_rate: float | None) -> str | None:
    """Why a finished run counts as failed, or None."""
    if not summary.finished or not summary.failed:
        return None
    errors = ", ".join(f"{k} {v}" for k, v in summary.errors_by_category.items())
    if summary.failed == summary.finished:
        return f"every rollout failed ({summary.failed} of {summary.finished}: {errors})"
    rate = summary.failed / summary.finished
    if max_failure_rate is not None and rate > max_failure_rate:
        return (
            f"{summary.failed} of {summary.finished} rollouts failed ({rate:.1%}, over [run] max_failure_rate "
            f"{max_failure_rate:.1%}: {errors})"
        )
    return None
