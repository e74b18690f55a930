"""The API of a frontend: a command that runs a config's rollout, or reads run folders, the way
``osmosis run`` does (``osmosis serve`` and ``osmosis report`` are built on it).

Running: :func:`load_run` loads a config's rollout once and builds its backend as ``osmosis run``
builds it; :class:`RunFiles` is a run folder's lock and its ``results.jsonl`` / ``traces.jsonl``,
written in ``osmosis run``'s line format with every secret redacted. Reading: ``scan_results``,
``latest_records``, ``summary_fields`` (a line's :class:`LineOutcome`), ``ResultStats``,
``Summary`` and friends count a folder's results as ``osmosis run``'s summary does;
``nonfinite_paths`` and ``finite_json`` find and spell the NaN and infinite numbers an older or
hand-written file may hold. A command takes ``osmosis run``'s config flags
with :func:`config_options`. A long-running command that another process starts stops with it
through ``signal_when_parent_gone`` (its standard input as the lifeline), as ``osmosis serve
--watch-stdin`` does.

A frontend that runs one prompt through a config's rollout and keeps its result, as a server
does (``url``: an OpenAI-compatible endpoint, e.g. ``osmosis_core.testing.ScriptedPolicyServer``)::

    from pathlib import Path

    import anyio

    from osmosis_core import ExecutionRequest, PolicyEndpoint
    from osmosis_core.frontend import RunFiles, load_run, resolve_config
    from osmosis_core.http import http_scope

    config = resolve_config(Path("configs/eval/multiply-plain.toml"), {"policy_url": url})
    run = load_run(config)
    with RunFiles(config.root / "runs" / "once") as files:
        backend = run.build_backend(files.path)
        policy = PolicyEndpoint(config.policy.base_url, config.policy.model)
        request = ExecutionRequest("r-0", [{"role": "user", "content": "What is 6 times 7?"}], policy, label="42")
        finished = []

        async def keep(result):  # called with the workflow's result, then the grader's
            finished.append(result)

        async def main():
            async with http_scope():  # the loop's owner closes its HTTP clients
                try:
                    await backend.execute(request, keep, keep)
                finally:
                    await backend.aclose()  # a backend's workers, actors, sandboxes go with it

        anyio.run(main)
        files.write_result(0, 0, finished[-1])
    run.tell_progress(files.path, final=True)  # osmosis_run_progress hooks: report.html, dashboards

``tests/test_frontend.py`` runs this example.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from osmosis_core import _reexport

if TYPE_CHECKING:
    from osmosis_core._engine.config import RunConfig as RunConfig
    from osmosis_core._engine.config import config_from_dict as config_from_dict
    from osmosis_core._engine.config import policy_endpoint as policy_endpoint
    from osmosis_core._engine.dataset import DatasetRow as DatasetRow
    from osmosis_core._engine.dataset import fingerprint as fingerprint
    from osmosis_core._engine.dataset import read_dataset as read_dataset
    from osmosis_core._engine.lifeline import signal_when_parent_gone as signal_when_parent_gone
    from osmosis_core._engine.loader import LoadedRollout as LoadedRollout
    from osmosis_core._engine.loader import load_rollout as load_rollout
    from osmosis_core._engine.registry import PluginRegistry
    from osmosis_core._engine.results import LineOutcome as LineOutcome
    from osmosis_core._engine.results import ResultStats as ResultStats
    from osmosis_core._engine.results import ResultWriter
    from osmosis_core._engine.results import Summary as Summary
    from osmosis_core._engine.results import latest_records as latest_records
    from osmosis_core._engine.results import percentile as percentile
    from osmosis_core._engine.results import scan_results as scan_results
    from osmosis_core._engine.results import summary_fields as summary_fields
    from osmosis_core._engine.traces import make_trace_gateway as make_trace_gateway
    from osmosis_core.backend import ExecutionBackend
    from osmosis_core.cli.common import config_options as config_options
    from osmosis_core.cli.common import make_console as make_console
    from osmosis_core.cli.common import resolve_config as resolve_config
    from osmosis_core.records import ExecutionResult
    from osmosis_core.traces import TRACES as TRACES
    from osmosis_core.traces import trace_from_line as trace_from_line
    from osmosis_core.traces import traces_enabled as traces_enabled
    from osmosis_core.wire import NONFINITE as NONFINITE
    from osmosis_core.wire import finite_json as finite_json
    from osmosis_core.wire import nonfinite_paths as nonfinite_paths
    from osmosis_core.wire import result_line as result_line

# imported on first use, so a command module that imports this one keeps `osmosis --help` fast
_lazy_getattr, _dir, _lazy = _reexport.attach(
    "osmosis_core",
    submod_attrs={
        "_engine.config": ["RunConfig", "config_from_dict", "policy_endpoint"],
        "_engine.dataset": ["DatasetRow", "fingerprint", "read_dataset"],
        "_engine.lifeline": ["signal_when_parent_gone"],
        "_engine.loader": ["LoadedRollout", "load_rollout"],
        "_engine.results": [
            "LineOutcome",
            "ResultStats",
            "Summary",
            "latest_records",
            "percentile",
            "scan_results",
            "summary_fields",
        ],
        "cli.common": ["config_options", "make_console", "resolve_config"],
        "_engine.traces": ["make_trace_gateway"],
        "traces": ["TRACES", "trace_from_line", "traces_enabled"],
        "wire": ["NONFINITE", "finite_json", "nonfinite_paths", "result_line"],
    },
    into=__name__,
)
__all__ = sorted([*_lazy, "LoadedRun", "RunFiles", "load_run"])


def __getattr__(name: str) -> Any:
    if name == "http_scope":  # moved to the HTTP helpers' module (CHANGELOG 0.2.0)
        from osmosis_core.deprecation import warn_deprecated
        from osmosis_core.http import http_scope

        warn_deprecated("osmosis_core.frontend.http_scope", "osmosis_core.http.http_scope", "0.2.0")
        return http_scope
    return _lazy_getattr(name)


def __dir__() -> list[str]:
    return sorted({*__all__, *globals()})


class LoadedRun:
    """A config's rollout, loaded once, and what a frontend does with it (see :func:`load_run`)."""

    def __init__(self, config: RunConfig, rollout: LoadedRollout, registry: PluginRegistry) -> None:
        self.config = config
        self.rollout = rollout
        self.registry = registry

    def build_backend(self, run_dir: Path | None) -> ExecutionBackend:
        """The configured backend (``[run] backend`` and its ``[backend.<name>]`` table), built as
        ``osmosis run`` builds it; ``run_dir`` is where it may keep files of its own.

        :raises ConfigError: no backend of that name, or a bad table.
        """
        from osmosis_core._engine.runner import build_backend

        return build_backend(self.config, self.rollout, self.registry, run_dir)

    def tell_progress(self, run_dir: Path, *, final: bool) -> None:
        """Tell the ``osmosis_run_progress`` hooks (reports, dashboards) how ``run_dir``'s results
        stand, as a server does (each row counts once); a hook that raises is logged, never raised."""
        from osmosis_core._engine.results import folder_progress

        self.registry.tell_progress(folder_progress(run_dir, final=final, config=self.config))


def load_run(config: RunConfig, registry: PluginRegistry | None = None) -> LoadedRun:
    """Load ``config``'s rollout (its workflow, grader and configs) with the installed plugins.

    :raises RolloutLoadError: the rollout cannot be imported; :raises ConfigError: a bad config.
    """
    from osmosis_core._engine.loader import load_rollout
    from osmosis_core._engine.registry import get_registry

    registry = registry or get_registry()
    return LoadedRun(config, load_rollout(config, registry), registry)


class RunFiles:
    """A run folder held by one process: its lock, ``results.jsonl`` and (on first trace)
    ``traces.jsonl``, each line flushed at once, no line holding one of ``secrets``.

    :param folder: the run folder (created when missing).
    :param secrets: values no line may hold (keys, tokens, header values); short ones are ignored.
    """

    def __init__(self, folder: Path | str, *, secrets: Iterable[str | None] = ()) -> None:
        from osmosis_core._engine.run_lock import RunLock
        from osmosis_core._engine.runner import RESULTS

        self.path = Path(folder)
        self.results_path = self.path / RESULTS
        self.secrets = tuple(s for s in secrets if s and len(s) >= 4)

        self._lock = RunLock(self.path)
        self._results: ResultWriter | None = None
        self._traces: ResultWriter | None = None

    def lock(self) -> RunFiles:
        """Take the folder's lock (idempotent). :raises OsmosisError: another process holds it."""
        self._lock.acquire()
        return self

    def open(self) -> RunFiles:
        """Take the lock and open ``results.jsonl`` for appending (idempotent)."""
        self.lock()
        if self._results is None:
            from osmosis_core._engine.results import ResultWriter

            try:
                self._results = ResultWriter(self.results_path, self.secrets)
            except BaseException:
                self._lock.release()
                raise
        return self

    @property
    def is_open(self) -> bool:
        """Whether :meth:`open` was called and :meth:`close` was not."""
        return self._results is not None

    def write_result(
        self, row: int, sample_index: int, result: ExecutionResult, secrets: Iterable[str | None] = ()
    ) -> None:
        """Append one rollout's result line (``secrets``: that rollout's own, e.g. its key).

        :raises TypeError, ValueError: the line is not JSON; :raises OSError: it cannot be written.
        """
        from osmosis_core.wire import result_line

        self.write_line(result_line(row, sample_index, result), secrets)

    def write_line(self, line: dict[str, Any], secrets: Iterable[str | None] = ()) -> None:
        """Append a line already in ``results.jsonl``'s format."""
        if self._results is None:
            raise RuntimeError(f"{self.path}: RunFiles.open() first")
        self._results.write(line, secrets)

    def write_trace(
        self,
        row: int,
        sample_index: int,
        rollout_id: str,
        trace: dict[str, Any],
        secrets: Iterable[str | None] = (),
    ) -> None:
        """Append a rollout's trace to ``traces.jsonl`` (``osmosis run --traces``'s form; a NaN as
        ``"NaN"``, and a trace that cannot be JSON as an incomplete line saying so: never an error)."""
        from osmosis_core._engine.results import ResultWriter
        from osmosis_core._engine.traces import write_trace_line
        from osmosis_core.traces import TRACES, trace_line

        if self._traces is None:
            if self._results is None:
                raise RuntimeError(f"{self.path}: RunFiles.open() first")
            self._traces = ResultWriter(self.path / TRACES, self.secrets)
        write_trace_line(self._traces, trace_line(rollout_id, row, sample_index, trace), secrets)

    def close(self) -> None:
        """Flush the files to disk and release the folder (idempotent)."""
        writers = [w for w in (self._traces, self._results) if w is not None]
        self._results = self._traces = None
        try:
            for writer in writers:
                writer.close()
        finally:
            self._lock.release()

    def __enter__(self) -> RunFiles:
        return self.open()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
