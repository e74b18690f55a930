"""``WorkerPool``: the local backend spread over worker processes, for agent frameworks that are CPU-bound.

One Python process runs every rollout's framework code (Strands, the OpenAI Agents SDK) on one
core: at a hundred concurrent rollouts that core is the limit, not the model. With ``workers = N``
(``[run] workers`` or ``--workers``) the local backend runs N worker processes, each with its own
event loop and its own :class:`LocalBackend`; this process only hands out requests and relays
results, so the callbacks, the results file and the progress bar stay where they were.

How the processes are made and kept:

* When the pool is built (``osmosis run`` builds it before its event loop starts, with the rollout
  code imported) it forks one **zygote**: a single-threaded copy of this process that forks every
  worker, the first N and any replacement. Workers so inherit the imported rollout code and
  configs (nothing has to be importable by name), and no fork ever happens in a process with
  threads. Only requests and results cross the sockets (pickled).
* A worker runs only what it has room for: this process keeps each worker's share of the
  concurrency and holds the rest back. So when a worker dies (``kill -9``, the OOM killer, a
  rollout that calls ``os._exit``), only the rollouts it was running fail (``infra_error``); the
  rest wait, and the zygote forks a replacement (up to ``max_restarts``, see :class:`WorkerPool`).
  When no worker is left, :meth:`WorkerPool.execute` raises
  :class:`~osmosis_core.errors.BackendUnavailable` for the rollouts still waiting, which
  ``osmosis run`` turns into a clean, resumable stop. A result that cannot be pickled (a sample
  holding a lock or a client) crosses as its JSON form, as the run would write it.
* Workers and the zygote ignore SIGINT and SIGTERM (a terminal's Ctrl-C and ``kill 0`` reach the
  whole process group): this process decides, cancels, and every rollout it started is reported
  ``cancelled`` and stays runnable by ``--resume``.
* Nothing outlives this process: the zygote and every worker watch a *lifeline* pipe whose write
  end only this process holds (:mod:`osmosis_core._engine.lifeline`); when it dies, however it dies, they
  cancel what they run and exit. A worker stuck in synchronous code cannot read the pipe: the
  zygote kills it after a grace period, and a worker dies with its zygote (a parent-death signal).
  Neither keeps the run folder's lock (:mod:`osmosis_core._engine.run_lock`) alive.

It needs asyncio and ``fork`` (Linux). Build it before starting threads.

>>> pool = WorkerPool(MultiplyWorkflow, grader=MultiplyGrader, workers=2, max_concurrent=100)  # doctest: +SKIP
>>> await pool.execute(request, on_workflow_complete, on_grader_complete)                       # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import os
import select
import signal
import socket
import struct
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import anyio
import attrs

from osmosis_core._engine.lifeline import parent_gone, set_parent_death_signal
from osmosis_core._engine.waiters import Waiters
from osmosis_core.backend import BackendSetup, ExecutionBackend, ResultCallback, RunLimits
from osmosis_core.errors import BackendUnavailable, clip
from osmosis_core.http.client import preload
from osmosis_core.lifecycle import RolloutReporter
from osmosis_core.local import LocalBackend
from osmosis_core.records import (
    ErrorCategory,
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
)
from osmosis_core.workflow import AgentWorkflow, AgentWorkflowConfig, Grader, GraderConfig

__all__ = ["WorkerPool"]

_SPAWN = b"S"
_REPORT = struct.Struct("!Bii")  # kind (0 spawned, 1 exited), pid, wait status
_SPAWNED, _EXITED = 0, 1
_STOP_GRACE_SEC = 10.0
"""How long stopping workers may take before they are killed."""
_ORPHAN_GRACE_SEC = 2.0
"""How long a worker whose parent died gives its rollouts to unwind before it exits."""


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _exit_now(code: int) -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


# -- the zygote: forks workers on request, reaps them, reports their deaths ---------------------------


def _zygote_main(ctl: socket.socket, lifeline: int, backend: LocalBackend) -> None:
    _ignore_stop_signals()
    ctl.setblocking(True)
    # a worker's death wakes the select below at once (SIGCHLD -> wakeup fd), so it is reported promptly
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    workers: set[int] = set()
    zygote = os.getpid()
    while True:
        try:
            ready, _, _ = select.select([ctl.fileno(), lifeline, wake_read], [], [], 1.0)
        except InterruptedError:
            ready = []
        if wake_read in ready:
            os.read(wake_read, 512)
        if lifeline in ready and parent_gone(lifeline):
            _end_orphaned(workers)
        if ctl.fileno() in ready:
            try:
                request = ctl.recv(16)
            except OSError:
                request = b""
            if not request:  # the pool closed its end: no more workers to make
                _exit_now(0)
            if request == _SPAWN:
                parent_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                pid = os.fork()
                if pid == 0:
                    try:
                        # the zygote's death (it kills us on its way out, unless it was killed) ends us too
                        set_parent_death_signal(signal.SIGKILL, expected_parent=zygote)
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        os.close(wake_read)
                        os.close(wake_write)
                        ctl.close()
                        parent_end.close()
                        _worker_main(worker_end, lifeline, backend)
                    finally:
                        _exit_now(0)
                workers.add(pid)
                worker_end.close()
                socket.send_fds(ctl, [_REPORT.pack(_SPAWNED, pid, 0)], [parent_end.fileno()])
                parent_end.close()
        for pid in list(workers):
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    workers.discard(pid)
                    with contextlib.suppress(OSError):
                        ctl.send(_REPORT.pack(_EXITED, pid, status))


def _end_orphaned(workers: set[int]) -> None:
    """The run died: give the workers the grace period to unwind, then kill those still there."""
    deadline = time.monotonic() + _ORPHAN_GRACE_SEC + 1.0
    while workers and time.monotonic() < deadline:
        for pid in list(workers):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    workers.discard(pid)
        time.sleep(0.05)
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _exit_now(0)


# -- a worker: runs the requests its socket brings ----------------------------------------------------


def _worker_main(sock: socket.socket, lifeline: int, backend: LocalBackend) -> None:
    _ignore_stop_signals()
    asyncio.events._set_running_loop(None)  # forked from a process that may have had a running loop
    conn = Connection(sock.detach())
    gc.freeze()  # what the worker inherited lives as long as it does: collections need not scan it
    asyncio.run(_serve(conn, lifeline, backend))


async def _serve(conn: Connection, lifeline: int, backend: LocalBackend) -> None:
    from osmosis_core.http.client import aclose_http

    loop = asyncio.get_running_loop()
    tasks: dict[str, asyncio.Task[None]] = {}
    stopped = asyncio.Event()
    orphaned = False
    # Messages are pickled here, in order, and written by one thread: a full socket to a busy parent
    # never blocks this loop, so it keeps reading requests and the two can never wait on each other.
    sender = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="osmosis-worker-send")

    def post(message: tuple[str, Any]) -> None:
        sender.submit(_send_quietly, conn, bytes(ForkingPickler.dumps(message)))

    async def send(result: ExecutionResult) -> None:
        try:
            post(("result", result))
        except Exception as exc:  # a sample holding a lock, a client, ...: sent as its JSON form
            post(("result", _as_json_form(result, exc)))

    def finished(rollout_id: str, task: asyncio.Task[None]) -> None:
        # a done callback, not a `finally`: it runs even for a task cancelled before it started
        if tasks.get(rollout_id) is task:
            del tasks[rollout_id]
        post(("done", rollout_id))

    def readable() -> None:
        try:
            while conn.poll():
                kind, payload = conn.recv()
                if kind == "run":
                    task = loop.create_task(backend.execute(payload, send, send))
                    tasks[payload.rollout_id] = task
                    task.add_done_callback(functools.partial(finished, payload.rollout_id))
                elif kind == "cancel" and payload in tasks:
                    tasks[payload].cancel()
                elif kind == "stop":
                    stopped.set()
        except (EOFError, OSError):
            stopped.set()

    def lifeline_readable() -> None:
        nonlocal orphaned
        if parent_gone(lifeline):
            orphaned = True
            loop.remove_reader(lifeline)
            stopped.set()

    loop.add_reader(conn.fileno(), readable)
    loop.add_reader(lifeline, lifeline_readable)
    await stopped.wait()
    loop.remove_reader(conn.fileno())
    for task in list(tasks.values()):
        task.cancel()
    if tasks:
        await asyncio.wait(list(tasks.values()), timeout=_ORPHAN_GRACE_SEC if orphaned else None)
    if orphaned:  # nobody reads our results any more: unwind briefly, then go
        _exit_now(0)
    await aclose_http()
    sender.shutdown(wait=True)


def _as_json_form(result: ExecutionResult, exc: Exception) -> ExecutionResult:
    """``result`` as its results.jsonl line would hold it (what cannot be JSON as its repr, as
    the run writes it without workers), or a ``validation_error`` when even that fails."""
    from osmosis_core._engine.results import json_ready
    from osmosis_core.wire import result_from_json, result_to_json

    try:
        return result_from_json(json_ready(result_to_json(result)))
    except Exception:
        message = f"the {result.stage} result cannot be sent from the worker process: {type(exc).__name__}: {exc}"
        info = ErrorInfo(ErrorCategory.VALIDATION_ERROR, clip(message, (), 1000))
        return ExecutionResult(
            result.rollout_id, result.stage, ExecutionStatus.FAILURE, error=info, timings=result.timings
        )


def _send_quietly(conn: Connection, data: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.send_bytes(data)


# -- the pool, in the parent -------------------------------------------------------------------------


@attrs.define(eq=False)
class _Worker:
    pid: int
    conn: Connection
    alive: bool = True
    running: int = 0
    """Rollouts in their workflow stage here (what the worker's share bounds)."""
    rollouts: int = 0
    """Rollouts here in any stage."""


@attrs.define(eq=False)
class _Pending:
    worker: _Worker
    grades: bool
    """A successful workflow is followed by a grader stage."""
    queue: asyncio.Queue[ExecutionResult | None] = attrs.Factory(asyncio.Queue)
    stage: ExecutionStage = ExecutionStage.WORKFLOW
    holds_slot: bool = True
    ended: bool = False
    """Its last result is in (a worker that dies before saying "done" changes nothing)."""


class WorkerPool(ExecutionBackend):
    """:class:`LocalBackend` in ``workers`` processes; same results, same callbacks.

    :param max_concurrent: rollouts at once over all workers (split evenly between them, as is the
        grader limit); overrides ``limits.concurrency``.
    :param limits: the run's limits (:class:`~osmosis_core.plugin.RunLimits`), for all workers together.
    :param max_restarts: how many dead workers are replaced over the pool's life (default
        ``4 * workers``); past it the pool shrinks, and stops when no worker is left.

    The other arguments are :class:`LocalBackend`'s.
    """

    def __init__(
        self,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader[Any]] | str | None = None,
        grader_config: GraderConfig | str | None = None,
        *,
        workers: int,
        max_concurrent: int | None = None,
        max_restarts: int | None = None,
        require_labels: bool = False,
        limits: RunLimits | None = None,
    ) -> None:
        setup = BackendSetup.resolve(
            workflow,
            workflow_config,
            grader,
            grader_config,
            require_labels=require_labels,
            limits=limits,
            max_concurrent=max_concurrent,
        )
        self._start(setup, workers, max_restarts)

    @classmethod
    def _of(cls, setup: BackendSetup) -> WorkerPool:
        """The pool of a run's setup (``setup.workers`` processes), its classes taken as resolved."""
        pool = cls.__new__(cls)
        pool._start(setup, setup.workers, None)
        return pool

    def _start(self, setup: BackendSetup, workers: int, max_restarts: int | None) -> None:
        if workers < 2:
            raise ValueError(f"a worker pool needs 2 or more workers, got {workers}")
        if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
            raise RuntimeError("workers > 1 needs a platform that can fork (Linux)")
        resolved = setup.limits.resolve(setup.workflow_config, setup.grader_config)
        self._limit = resolved.concurrency or 0
        share = resolved.split(workers)  # each worker keeps its share of both limits
        self._share = share.concurrency or 1
        backend = self._local = LocalBackend._of(attrs.evolve(setup, limits=share))
        self._size = workers
        self._restarts_left = 4 * workers if max_restarts is None else max_restarts
        self._restarts = 0
        self._workers: list[_Worker] = []
        self._pending: dict[str, _Pending] = {}
        self._waiters = Waiters()
        self._spawning = 0
        self._exits: dict[int, int] = {}
        self._attached: asyncio.AbstractEventLoop | None = None
        self._closed = False
        preload()  # every worker forks with the HTTP client imported
        lifeline_read, self._lifeline = os.pipe()
        self._ctl, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                os.close(self._lifeline)
                self._ctl.close()
                _zygote_main(zygote_end, lifeline_read, backend)
            finally:
                _exit_now(0)
        self._zygote = pid
        os.close(lifeline_read)
        zygote_end.close()
        for _ in range(workers):
            self._ctl.send(_SPAWN)
            self._adopt(*self._receive_spawned())

    # -- the zygote's reports ------------------------------------------------------------------------

    def _receive_spawned(self) -> tuple[int, int]:
        """Block until the zygote reports a new worker; its pid and the fd of our end of its socket."""
        while True:
            kind, pid, status, fd = self._receive()
            if kind == _SPAWNED and fd is not None:
                return pid, fd
            self._exits[pid] = status

    def _receive(self) -> tuple[int, int, int, int | None]:
        data, fds, _flags, _addr = socket.recv_fds(self._ctl, _REPORT.size, 1)
        if not data:
            raise BackendUnavailable("the worker pool's zygote process is gone; no worker can be started")
        kind, pid, status = _REPORT.unpack(data)
        return kind, pid, status, fds[0] if fds else None

    def _adopt(self, pid: int, fd: int) -> None:
        worker = _Worker(pid, Connection(fd))
        self._workers.append(worker)
        if self._attached is not None:
            self._attached.add_reader(fd, self._readable, worker)
            self._waiters.wake()

    def _ctl_readable(self) -> None:
        try:
            # the blocking socket may have been read already in this turn of the loop (a lost
            # worker's wait for its exit status reads the reports it finds): never wait here
            if not select.select([self._ctl], [], [], 0)[0]:
                return
            kind, pid, status, fd = self._receive()
        except (BackendUnavailable, OSError):
            assert self._attached is not None
            self._attached.remove_reader(self._ctl.fileno())
            self._spawning = 0
            self._waiters.wake(everyone=True)
            return
        if kind == _SPAWNED and fd is not None:
            self._spawning -= 1
            self._adopt(pid, fd)
        else:
            self._exits[pid] = status

    # -- the loop side ---------------------------------------------------------------------------------

    @property
    def max_concurrency(self) -> int:
        return self._limit

    def _live(self) -> list[_Worker]:
        return [w for w in self._workers if w.alive]

    def health(self) -> dict[str, Any]:
        live = self._live()
        return {
            "status": "ok" if len(live) == self._size else ("degraded" if live else "failed"),
            "max_concurrency": self._limit,
            "restarts": self._restarts,
            "waiting": len(self._waiters),
            "workers": [{"pid": w.pid, "alive": w.alive, "rollouts": w.rollouts} for w in self._workers],
        }

    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._attached is loop:
            return
        self._detach()  # a new loop takes over (one at a time)
        for worker in self._live():
            loop.add_reader(worker.conn.fileno(), self._readable, worker)
        loop.add_reader(self._ctl.fileno(), self._ctl_readable)
        self._attached = loop

    def _detach(self) -> None:
        """Stop watching the live workers' sockets and the zygote's on the loop that watched them."""
        old, self._attached = self._attached, None
        if old is None or old.is_closed():
            return
        for worker in self._live():
            old.remove_reader(worker.conn.fileno())
        with contextlib.suppress(ValueError, OSError):  # the control socket may be closed already
            old.remove_reader(self._ctl.fileno())

    def _readable(self, worker: _Worker) -> None:
        try:
            while worker.conn.poll():
                kind, payload = worker.conn.recv()
                if kind == "result":
                    pending = self._pending.get(payload.rollout_id)
                    if pending is not None:
                        if payload.stage is ExecutionStage.WORKFLOW:
                            pending.stage = ExecutionStage.GRADER
                            self._release(pending)
                        pending.ended = payload.stage is ExecutionStage.GRADER or not (payload.ok and pending.grades)
                        pending.queue.put_nowait(payload)
                elif kind == "done":
                    pending = self._pending.get(payload)
                    if pending is not None:
                        self._release(pending)
                        pending.queue.put_nowait(None)
        except (EOFError, OSError):
            self._worker_lost(worker)
        except Exception as exc:  # a message this process cannot unpickle: nothing from this worker is trusted
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
            self._worker_lost(worker, f"sent a result this process cannot read ({type(exc).__name__}: {exc})")

    def _release(self, pending: _Pending) -> None:
        if pending.holds_slot:
            pending.holds_slot = False
            pending.worker.running -= 1
            self._waiters.wake()

    def _exit_text(self, pid: int) -> str:
        status = self._exits.get(pid)
        if status is None:
            return "ended"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            with contextlib.suppress(ValueError):
                return f"was killed by {signal.Signals(sig).name}"
            return f"was killed by signal {sig}"
        return f"exited with status {os.WEXITSTATUS(status)}"

    def _worker_lost(self, worker: _Worker, why: str | None = None) -> None:
        if not worker.alive:
            return
        worker.alive = False
        if self._attached is not None:
            self._attached.remove_reader(worker.conn.fileno())
        with contextlib.suppress(OSError):
            worker.conn.close()
        deadline = time.monotonic() + 0.25  # the zygote reports the exit status within a moment
        while worker.pid not in self._exits and time.monotonic() < deadline:
            try:
                ready, _, _ = select.select([self._ctl], [], [], max(0.0, deadline - time.monotonic()))
            except OSError:
                break
            if not ready:
                break
            self._ctl_readable()
        how = why or self._exit_text(worker.pid)
        for rollout_id, pending in list(self._pending.items()):
            if pending.worker is worker:
                self._release(pending)
                if not pending.ended:
                    message = (
                        f"worker process {worker.pid} {how} while running the rollout (in its {pending.stage} stage)"
                    )
                    error = ErrorInfo(ErrorCategory.INFRA_ERROR, message)
                    pending.queue.put_nowait(
                        ExecutionResult(rollout_id, pending.stage, ExecutionStatus.FAILURE, error=error)
                    )
                pending.queue.put_nowait(None)
        if not self._closed and self._restarts_left > 0:
            self._restarts_left -= 1
            self._restarts += 1
            self._spawning += 1
            try:
                self._ctl.send(_SPAWN)
            except OSError:
                self._spawning -= 1
        self._waiters.wake(everyone=True)  # waiters re-check: a slot elsewhere, a replacement coming, or none left

    def _pick(self) -> _Worker | None:
        """The least-busy live worker with room for one more rollout, if any (the first of equals)."""
        room = (worker for worker in self._live() if worker.running < self._share)
        return min(room, key=lambda worker: worker.running, default=None)

    async def _slot(self) -> _Worker:
        while True:
            worker = self._pick()
            if worker is not None:
                return worker
            if self._closed or (self._spawning <= 0 and not self._live()):
                gone = ", ".join(f"{w.pid} {self._exit_text(w.pid)}" for w in self._workers[-self._size :])
                raise BackendUnavailable(
                    f"every worker process is gone and none can be replaced ({self._restarts} restarts; "
                    f"last workers: {gone}); the rollouts not started stay to be run"
                )
            await self._waiters.wait()

    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback,
        on_grader_complete: ResultCallback | None = None,
    ) -> None:
        self._attach()
        report = RolloutReporter(
            request, on_workflow_complete, on_grader_complete, grades=self._local.setup.grades(request)
        )
        async with report:
            worker = await self._slot()
            pending = self._pending[request.rollout_id] = _Pending(worker, report.grades)
            worker.running += 1
            worker.rollouts += 1

            async def relay() -> None:
                """Hand each stage's result to its callback until the worker says the rollout is done."""
                while (result := await pending.queue.get()) is not None:
                    await report.report(result)

            try:
                worker.conn.send(("run", request))
                await relay()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    if worker.alive:
                        with contextlib.suppress(OSError):
                            worker.conn.send(("cancel", request.rollout_id))
                        with anyio.move_on_after(_STOP_GRACE_SEC):
                            await relay()  # the worker reports the cancelled stage (if it had started), then done
                raise  # (the rollout reports the cancellation, unless the worker did)
            except OSError:  # the worker died before it could take the request
                self._worker_lost(worker)
                await relay()
            finally:
                self._release(pending)
                worker.rollouts -= 1
                self._pending.pop(request.rollout_id, None)

    async def aclose(self) -> None:
        """Stop the workers (their in-flight rollouts are cancelled), then the zygote; wait for them."""
        if self._closed:
            return
        self._closed = True
        self._waiters.wake(everyone=True)
        self._detach()
        for worker in self._live():
            with contextlib.suppress(OSError):
                worker.conn.send(("stop", None))
        deadline = time.monotonic() + _STOP_GRACE_SEC
        while time.monotonic() < deadline and any(_running(w.pid) for w in self._workers):
            await anyio.sleep(0.02)  # polled, not joined in a thread: later forks stay single-threaded
        for worker in self._workers:
            if _running(worker.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
            worker.alive = False
            with contextlib.suppress(OSError):
                worker.conn.close()
        self._ctl.close()  # the zygote exits at end-of-file
        os.close(self._lifeline)
        deadline = time.monotonic() + _STOP_GRACE_SEC
        while time.monotonic() < deadline and os.waitpid(self._zygote, os.WNOHANG) == (0, 0):
            await anyio.sleep(0.02)
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(self._zygote, os.WNOHANG) == (0, 0):
                os.kill(self._zygote, signal.SIGKILL)
                os.waitpid(self._zygote, 0)

    @property
    def worker_pids(self) -> list[int]:
        """The pids of the live workers."""
        return [w.pid for w in self._live()]

    @property
    def zygote_pid(self) -> int:
        """The pid of the process that forks the workers."""
        return self._zygote


def _running(pid: int) -> bool:
    """True while ``pid`` is a live (not zombie) process: workers are the zygote's children, not ours."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in (b"Z", b"X")
