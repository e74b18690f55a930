"""``WorkerPool``: the local backend spread over worker processes, for agent frameworks that are CPU-bound.

One Python process runs every rollout's framework code (Strands, the OpenAI Agents SDK) on one
core: at a hundred concurrent rollouts that core is the limit, not the model. With ``workers = N``
(``[run] workers`` or ``--workers``) the local backend forks N worker processes, each running its
own event loop and its own :class:`LocalBackend`; this process only hands out requests and
relays results, so the callbacks, the results file and the progress bar stay where they were.

The workers are forked when the backend is built (``osmosis run`` builds it before its event loop
starts), so they inherit the imported rollout code and configs: nothing has to be importable by
name. Only requests and results cross the pipes (pickled). It needs asyncio and a platform with
``fork`` (Linux).

>>> pool = WorkerPool(MultiplyWorkflow, grader=MultiplyGrader, workers=2, max_concurrent=100)  # doctest: +SKIP
>>> await pool.execute(request, on_workflow_complete, on_grader_complete)                       # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import multiprocessing
import os
import signal
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import anyio
import attrs

from osmosis_core.backend import ExecutionBackend, ResultCallback
from osmosis_core.local import LocalBackend
from osmosis_core.records import (
    ErrorCategory,
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
)
from osmosis_core.workflow import AgentWorkflow, AgentWorkflowConfig, ConcurrencyConfig, Grader, GraderConfig

__all__ = ["WorkerPool"]


def _worker_main(conn: Connection, backend: LocalBackend) -> None:
    """A worker's life: run the requests its pipe brings, send back each stage's result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a run stops
    asyncio.events._set_running_loop(None)  # forked from inside a running loop, perhaps
    asyncio.run(_serve(conn, backend))


async def _serve(conn: Connection, backend: LocalBackend) -> None:
    loop = asyncio.get_running_loop()
    tasks: dict[str, asyncio.Task[None]] = {}
    stopped = asyncio.Event()
    # Messages are pickled here, in order, and written by one thread: a full pipe to a busy parent
    # never blocks this loop, so it keeps reading requests and the two can never wait on each other.
    sender = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="osmosis-worker-send")

    def post(message: tuple[str, Any]) -> None:
        sender.submit(conn.send_bytes, ForkingPickler.dumps(message))

    async def run(request: ExecutionRequest) -> None:
        async def send(result: ExecutionResult) -> None:
            post(("result", result))

        try:
            await backend.execute(request, send, send)
        finally:
            tasks.pop(request.rollout_id, None)
            post(("done", request.rollout_id))

    def readable() -> None:
        try:
            while conn.poll():
                kind, payload = conn.recv()
                if kind == "run":
                    tasks[payload.rollout_id] = loop.create_task(run(payload))
                elif kind == "cancel" and payload in tasks:
                    tasks[payload].cancel()
                elif kind == "stop":
                    stopped.set()
        except (EOFError, OSError):
            stopped.set()

    loop.add_reader(conn.fileno(), readable)
    await stopped.wait()
    loop.remove_reader(conn.fileno())
    for task in list(tasks.values()):
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    from osmosis_core.http import aclose_shared_client

    await aclose_shared_client()
    sender.shutdown(wait=True)


class _Pending:
    __slots__ = ("done", "queue", "worker")

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self.queue: asyncio.Queue[ExecutionResult | None] = asyncio.Queue()
        self.done = False


class WorkerPool(ExecutionBackend):
    """:class:`LocalBackend` in ``workers`` forked processes; same results, same callbacks.

    :param max_concurrent: rollouts at once over all workers (split evenly between them, as is the
        grader config's own limit when it has one).
    """

    def __init__(
        self,
        workflow: type[AgentWorkflow[Any]],
        workflow_config: AgentWorkflowConfig | None = None,
        grader: type[Grader[Any]] | None = None,
        grader_config: GraderConfig | None = None,
        *,
        workers: int,
        max_concurrent: int | None = None,
    ) -> None:
        if workers < 2:
            raise ValueError(f"a worker pool needs 2 or more workers, got {workers}")
        if "fork" not in multiprocessing.get_all_start_methods():
            raise RuntimeError("workers > 1 needs a platform that can fork (Linux)")
        template = LocalBackend(workflow, workflow_config, grader, grader_config, max_concurrent=max_concurrent)
        self._limit = template.max_concurrency
        per_worker = max(1, math.ceil(self._limit / workers))
        if template.grader_config is not None and template.grader_config.concurrency.max_concurrent is not None:
            # a grader limit is for the whole run too: split it like the workflow limit
            share = max(1, math.ceil(template.grader_config.concurrency.max_concurrent / workers))
            grader_config = attrs.evolve(template.grader_config, concurrency=ConcurrencyConfig(max_concurrent=share))
        self._grades = grader is not None
        self._conns: list[Connection] = []
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._load = [0] * workers
        self._pending: dict[str, _Pending] = {}
        self._attached: asyncio.AbstractEventLoop | None = None
        context = multiprocessing.get_context("fork")
        for _ in range(workers):
            parent_end, child_end = context.Pipe()
            backend = LocalBackend(workflow, workflow_config, grader, grader_config, max_concurrent=per_worker)
            proc = context.Process(target=_worker_main, args=(child_end, backend), daemon=True)
            proc.start()
            child_end.close()
            self._conns.append(parent_end)
            self._procs.append(proc)

    @property
    def max_concurrency(self) -> int:
        return self._limit

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok" if all(p.is_alive() for p in self._procs) else "degraded",
            "max_concurrency": self._limit,
            "workers": [
                {"pid": p.pid, "alive": p.is_alive(), "rollouts": n}
                for p, n in zip(self._procs, self._load, strict=True)
            ],
        }

    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._attached is loop:
            return
        for index, conn in enumerate(self._conns):
            loop.add_reader(conn.fileno(), self._readable, index)
        self._attached = loop

    def _readable(self, index: int) -> None:
        conn = self._conns[index]
        try:
            while conn.poll():
                kind, payload = conn.recv()
                if kind == "result":
                    pending = self._pending.get(payload.rollout_id)
                    if pending is not None:
                        pending.queue.put_nowait(payload)
                elif kind == "done":
                    pending = self._pending.get(payload)
                    if pending is not None:
                        pending.queue.put_nowait(None)
        except (EOFError, OSError):
            self._worker_lost(index)

    def _worker_lost(self, index: int) -> None:
        if self._attached is not None:
            self._attached.remove_reader(self._conns[index].fileno())
        pid = self._procs[index].pid
        for rollout_id, pending in list(self._pending.items()):
            if pending.worker == index and not pending.done:
                error = ErrorInfo(ErrorCategory.INFRA_ERROR, f"worker process {pid} ended while running the rollout")
                stage = ExecutionStage.WORKFLOW
                pending.queue.put_nowait(ExecutionResult(rollout_id, stage, ExecutionStatus.FAILURE, error=error))
                pending.queue.put_nowait(None)

    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback,
        on_grader_complete: ResultCallback | None = None,
    ) -> None:
        self._attach()
        index = min(range(len(self._conns)), key=lambda i: (not self._procs[i].is_alive(), self._load[i]))
        pending = self._pending[request.rollout_id] = _Pending(index)
        self._load[index] += 1

        async def relay() -> None:
            """Hand each stage's result to its callback until the worker says the rollout is done."""
            while (result := await pending.queue.get()) is not None:
                callback = on_workflow_complete if result.stage is ExecutionStage.WORKFLOW else on_grader_complete
                if callback is not None:
                    await callback(result)

        try:
            self._conns[index].send(("run", request))
            await relay()
            pending.done = True
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if self._procs[index].is_alive():
                    self._conns[index].send(("cancel", request.rollout_id))
                    await relay()  # the worker reports the cancelled stage, then done
            raise
        finally:
            self._load[index] -= 1
            self._pending.pop(request.rollout_id, None)

    async def aclose(self) -> None:
        """Stop the workers (their in-flight rollouts are cancelled) and wait for them."""
        if self._attached is not None:
            for conn in self._conns:
                self._attached.remove_reader(conn.fileno())
            self._attached = None
        for conn, proc in zip(self._conns, self._procs, strict=True):
            if proc.is_alive():
                try:
                    conn.send(("stop", None))
                except OSError:
                    pass
        deadline = anyio.current_time() + 10
        while any(p.is_alive() for p in self._procs) and anyio.current_time() < deadline:
            await anyio.sleep(0.02)  # polled, not joined in a thread: later forks stay single-threaded
        for proc in self._procs:
            if proc.is_alive():
                os.kill(proc.pid or 0, signal.SIGKILL)
            proc.join()
        for conn in self._conns:
            conn.close()
