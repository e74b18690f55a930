"""A small pool of CAS worker processes with a hard time limit per expression.

Why processes, and why this shape (the ``math`` grader's design; ``bench/graders.py`` measures it):

* Graders run on the rollout's event loop. sympy work is CPU-bound and can run for minutes
  (``9^{9^{9^{9}}}`` spins in C inside one bignum power), so it must not run on the loop.
* A thread cannot be killed, and math-verify's own timeout is ``signal.alarm``, which works only
  in the main thread and would interrupt whatever the loop was doing. So the CAS runs in child
  processes (``python -m osmosis_graders.cas_worker``), one job at a time each, and a job that
  outlives its limit plus a grace has its process killed (SIGKILL) and replaced.
* Inside the worker a ``SIGALRM`` at the limit ends pure-Python work softly (the worker answers
  ``timeout`` and lives on), so the expensive respawn (importing sympy takes ~2 s) is needed only
  for work the signal cannot interrupt.
* The loop talks to a worker over pipes with ``loop.add_reader``: no thread per job, and the
  pool is not tied to one event loop (``osmosis run`` has one, tests have many): an idle worker
  can serve any loop of the process. Each loop has its own semaphore of ``size`` slots.
* Not :class:`concurrent.futures.ProcessPoolExecutor`: it cannot kill one stuck worker without
  breaking the whole pool (``BrokenProcessPool`` for every job in flight).
* Not pebble's ``ProcessPool.schedule(..., timeout=...)`` either (issue 17 asked for it; measured
  side by side by ``bench/graders.py``, section 5, with the same job function in pebble's workers,
  ``bench/_pebble_cas.py``; 2 workers, 300 comparisons at concurrency 64, loaded 2-core machine):

  - the loop process's CPU per comparison (all its threads) is 1.5x ours (medians of 4
    alternating rounds: 0.50 ms ours, 0.76 ms pebble's; 0.50 / 0.74 in a 6-round run). Pebble
    runs three threads in the parent; every job goes through a ``queue.Queue`` hand-off to its
    scheduler thread, a pickled task, a pickled acknowledgement back (which starts the job's
    timeout), a pickled result, a ``concurrent.futures`` future and ``asyncio.wrap_future``'s
    ``call_soon_threadsafe``, with the thread switches between them. Its only knob,
    ``pebble.CONSTS.sleep_unit`` (0.1 s, how often the manager thread looks for overdue jobs and
    dead workers), moved nothing between 0.02 and 1.0 s: the cost is per job, not the polling.
  - the hard limit: a worker that stops answering (a C-level spin, as seen from outside) held its
    comparison 4.62 s with a 1 s limit, against 1.50 s here: pebble sends SIGTERM, waits
    ``CONSTS.term_timeout`` (3 s, process-wide) for the process to end, then SIGKILLs it, and its
    manager thread does nothing else meanwhile (other overdue jobs, dead workers).
  - ``spawn`` and ``forkserver`` workers import the main module again: ``python my_eval.py``
    without an ``if __name__ == "__main__"`` guard fails (every worker dies, ``BrokenProcessPool:
    All workers expired``). Under ``osmosis run`` all three worked with a plain rollout module
    (the main module is then the ``osmosis`` command's, which has the guard). ``fork`` workers
    never re-import, but they are forked from pebble's manager thread in a process running other
    threads, and keep every descriptor the process had open (a listening socket stays open in
    them after the server closes it).
  - in its favour: a worker takes its next job from the shared pipe without waiting for the loop
    (ours gets its next job once the loop has read its answer), so on the loaded machine its wall
    time was lower: 14.6 s against 20.2 s for the same 300 comparisons. The CPU per comparison in
    the workers is the same (16.6 and 16.8 ms).

Workers are started on first use (a grading that needs the CAS waits for one to be ready; the
start-up does not count against the per-expression limit), live as long as the process, and are
killed at exit; each also exits when its standard input closes and (Linux) when its parent dies.
After a ``fork`` the child starts with an empty pool of its own.

>>> import asyncio
>>> asyncio.run(cas_check("\\\\frac{1}{2}", "0.5", limit=5.0)).outcome   # doctest: +SKIP
'equal'
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import subprocess
import sys
import threading
import weakref
from typing import Any, Final

import attrs

__all__ = ["CasResult", "CasTiming", "CasUnavailable", "cas_check", "cas_pool", "default_workers"]

STARTUP_SEC: Final = 120.0
"""How long a new worker may take to import math-verify (the grader's own timeout usually ends it first)."""
GRACE_SEC: Final = 0.5
"""Past the per-expression limit, how long the worker gets to answer ``timeout`` itself before it is killed."""


def default_workers() -> int:
    """Worker processes per pool when the config does not say: the machine's cores, at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


@attrs.frozen
class CasResult:
    """How one CAS job ended.

    :ivar outcome: ``equal``, ``different``, ``unparsed``, ``timeout``, ``error`` (math-verify
        raised), or ``crashed`` (the worker died).
    :ivar detail: a few words on an unusual outcome (which side was unparsed, the error).
    :ivar wait_sec: seconds it waited for a worker (a free one, or a new one's start-up).
    :ivar compute_sec: seconds from handing the job to a worker to its answer (or its kill).
    """

    outcome: str
    detail: str | None = None
    wait_sec: float = 0.0
    compute_sec: float = 0.0


@attrs.define
class CasTiming:
    """Where one check's time has gone, kept up to date while it runs: a check cancelled from outside
    (the grader's timeout) still tells whether it was waiting for a worker or computing.

    :ivar phase: ``queued`` (all of this loop's workers busy), ``starting`` (a new worker imports
        math-verify), ``computing``, or ``done``.
    """

    phase: str = "queued"
    wait_sec: float = 0.0
    compute_sec: float = 0.0
    workers: int = 0
    """This loop's worker slots (all busy while ``queued``)."""
    ahead: int = 0
    """Checks already waiting when this one started to wait."""
    limit: float = 0.0
    """The per-comparison compute limit."""

    def describe(self) -> str:
        """What it was doing, in a few words: ``waiting for a CAS worker: ...`` or ``computing: ...``."""
        if self.phase == "queued":
            return (
                f"waiting for a CAS worker: {self.wait_sec:.1f} s waited, all {self.workers} busy, "
                f"{self.ahead} comparison(s) queued ahead; its comparison never started"
            )
        if self.phase == "starting":
            return f"waiting for a CAS worker to start (importing math-verify): {self.wait_sec:.1f} s waited"
        return (
            f"computing: the CAS ran {self.compute_sec:.1f} s (per-comparison limit {self.limit:g} s) "
            f"after {self.wait_sec:.1f} s waiting for a worker"
        )


class CasUnavailable(RuntimeError):
    """A CAS worker cannot start (math-verify is missing or broken in this environment)."""


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _Worker:
    """One child process and its pipes."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "osmosis_graders.cas_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.stdin = self.proc.stdin.fileno()
        self.stdout = self.proc.stdout.fileno()
        os.set_blocking(self.stdout, False)
        self.buffer = b""
        self.ready = False
        self.dead = False

    async def _line(self, deadline: float) -> bytes | None:
        """The next line the worker writes, or None at end-of-file. :raises TimeoutError: past ``deadline``."""
        loop = asyncio.get_running_loop()
        while True:
            newline = self.buffer.find(b"\n")
            if newline >= 0:
                line, self.buffer = self.buffer[:newline], self.buffer[newline + 1 :]
                return line
            # wait until readable first: the answer is never there yet right after a job was sent
            waiter: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self.stdout, _wake, waiter)
            timer = loop.call_at(deadline, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                loop.remove_reader(self.stdout)
            try:
                chunk = os.read(self.stdout, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                return None
            self.buffer += chunk

    async def start(self) -> None:
        """Wait for ``ready``. :raises CasUnavailable: the worker reported a fatal error or died."""
        if self.ready:
            return
        loop = asyncio.get_running_loop()
        try:
            line = await self._line(loop.time() + STARTUP_SEC)
        except TimeoutError:
            raise CasUnavailable(f"a CAS worker did not start within {STARTUP_SEC:g} s") from None
        doc = _doc(line)
        if doc.get("ready") is not True:
            reason = doc.get("fatal") or f"it exited with status {self.proc.poll()}"
            raise CasUnavailable(f"a CAS worker could not start: {reason}")
        self.ready = True

    async def run(self, job: dict[str, Any], limit: float) -> CasResult:
        """Send ``job``, return its result; kill the process when it does not answer in time."""
        if not self.ready:
            await self.start()
        data = json.dumps(job).encode() + b"\n"
        try:
            while data:
                data = data[os.write(self.stdin, data) :]
        except OSError as exc:  # a broken pipe: the worker is gone
            return CasResult("crashed", f"the CAS worker is gone ({type(exc).__name__})")
        loop = asyncio.get_running_loop()
        try:
            line = await self._line(loop.time() + limit + GRACE_SEC)
        except TimeoutError:
            self.kill()
            return CasResult("timeout", f"killed after {limit + GRACE_SEC:g} s")
        if line is None:
            self.kill()
            return CasResult("crashed", f"the CAS worker exited (status {self.proc.poll()})")
        doc = _doc(line)
        return CasResult(str(doc.get("outcome", "error")), doc.get("detail"))

    def kill(self) -> None:
        """Kill the process and close its pipes (it is reaped later, without blocking the loop)."""
        if self.dead:
            return
        self.dead = True
        try:
            self.proc.kill()
        except OSError:
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass


def _doc(line: bytes | None) -> dict[str, Any]:
    if line is None:
        return {}
    try:
        doc = json.loads(line)
    except ValueError:
        return {"outcome": "error", "detail": f"bad worker line: {line[:100]!r}"}
    return doc if isinstance(doc, dict) else {}


class CasPool:
    """The process's CAS workers (see the module docstring). Use :func:`cas_pool` for the shared one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()
        self._dying: list[_Worker] = []
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, asyncio.Semaphore]] = (
            weakref.WeakKeyDictionary()
        )
        self._keep = 1
        self._queued = 0
        self.started = 0
        """Worker processes started so far (a test or the bench reads it)."""
        self.killed = 0
        """Worker processes killed for overrunning a job (or at a cancelled job)."""

    def _semaphore(self, size: int) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        held = self._slots.get(loop)
        if held is None or held[0] != size:
            held = self._slots[loop] = (size, asyncio.Semaphore(size))
        return held[1]

    def _take(self) -> _Worker:
        with self._lock:
            self._reap()
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
                self._retire(worker)
        return self._spawn()

    def _spawn(self) -> _Worker:
        worker = _Worker()
        with self._lock:
            self._live.add(worker)
            self.started += 1
        return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not worker.dead and len(self._idle) < self._keep:
                self._idle.append(worker)
                return
            self._retire(worker)

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        self._live.discard(worker)
        self._dying.append(worker)

    def _reap(self) -> None:
        self._dying = [w for w in self._dying if w.proc.poll() is None]

    async def check(
        self,
        gold: str,
        answer: str,
        *,
        limit: float,
        workers: int | None = None,
        timing: CasTiming | None = None,
        **options: Any,
    ) -> CasResult:
        """Whether ``answer`` is equivalent to ``gold`` by math-verify, within ``limit`` seconds of computing.

        The time spent waiting for a worker does not count against ``limit``; the result says how
        long it waited and how long it computed. Cancelled (the grader's timeout), the
        ``CancelledError`` carries a note saying which of the two it was doing (:meth:`CasTiming.describe`).

        :param workers: this loop's concurrency (processes); default :func:`default_workers`.
        :param timing: filled in as the check goes (for a caller that may cancel it).
        :param options: ``float_rounding``, ``numeric_precision``, ``strict``, ``allow_set_relation_comp``.
        :raises CasUnavailable: no worker can start.
        """
        size = workers or default_workers()
        self._keep = max(self._keep, size)
        timing = timing if timing is not None else CasTiming()
        timing.phase, timing.workers, timing.ahead, timing.limit = "queued", size, self._queued, limit
        loop = asyncio.get_running_loop()
        start = begun = loop.time()
        semaphore = self._semaphore(size)
        self._queued += 1
        try:
            await semaphore.acquire()
        except BaseException as exc:
            timing.wait_sec = loop.time() - start
            _note(exc, timing)
            raise
        finally:
            self._queued -= 1
        try:
            worker = self._take()
            try:
                if not worker.ready:
                    timing.phase = "starting"
                    await worker.start()
                begun = loop.time()
                timing.phase, timing.wait_sec = "computing", begun - start
                result = await worker.run({"gold": gold, "answer": answer, "limit": limit, **options}, limit)
            except BaseException as exc:
                if timing.phase == "computing":
                    timing.compute_sec = loop.time() - begun
                else:
                    timing.wait_sec = loop.time() - start
                _note(exc, timing)
                with self._lock:
                    if worker.ready:
                        self.killed += 1
                    self._retire(worker)  # mid-job or not started: never reused
                raise
            timing.phase, timing.compute_sec = "done", loop.time() - begun
            if worker.dead:
                with self._lock:
                    self.killed += 1
            self._give_back(worker)
            return attrs.evolve(result, wait_sec=timing.wait_sec, compute_sec=timing.compute_sec)
        finally:
            semaphore.release()

    async def warm_up(self, workers: int | None = None) -> None:
        """Start ``workers`` processes now and wait until they are ready (so the first gradings do not wait)."""
        size = workers or default_workers()
        self._keep = max(self._keep, size)
        with self._lock:
            missing = size - len(self._idle)
        new = [self._spawn() for _ in range(max(0, missing))]
        try:
            await asyncio.gather(*(w.start() for w in new))
        except BaseException:
            with self._lock:
                for worker in new:
                    self._retire(worker)
            raise
        for worker in new:
            self._give_back(worker)

    def shutdown(self) -> None:
        """Kill every worker and wait for them (at exit, and in tests)."""
        with self._lock:
            for worker in list(self._live):
                self._retire(worker)
            self._idle.clear()
            dying, self._dying = self._dying, []
        for worker in dying:
            try:
                worker.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def forget(self) -> None:
        """In a forked child: drop the parent's workers without touching them (close our copies of their pipes)."""
        for worker in self._live | set(self._idle):
            for fd in (worker.stdin, worker.stdout):
                try:
                    os.close(fd)
                except OSError:
                    pass
            worker.dead = True
        _orphans.extend(self._live)  # keep the Popen objects alive: they are the parent's to reap
        self._live.clear()
        self._idle.clear()
        self._dying.clear()

    def pids(self) -> list[int]:
        """The process ids of the live workers, idle ones last (the next one used is the last)."""
        with self._lock:
            busy = [w.proc.pid for w in self._live if w not in self._idle]
            return busy + [w.proc.pid for w in self._idle]

    def stats(self) -> dict[str, int]:
        """``live``, ``idle``, ``started``, ``killed``: counts for tests and the bench."""
        with self._lock:
            return {"live": len(self._live), "idle": len(self._idle), "started": self.started, "killed": self.killed}


def _note(exc: BaseException, timing: CasTiming) -> None:
    """Say on a cancellation what the check was doing (the grader's timeout message shows it)."""
    if isinstance(exc, asyncio.CancelledError):
        exc.add_note(timing.describe())


_orphans: list[_Worker] = []
_pool: CasPool | None = None
_pool_lock = threading.Lock()


def cas_pool() -> CasPool:
    """The process's shared pool (made on first use; shut down at exit)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = CasPool()
            atexit.register(_pool.shutdown)
        return _pool


def _after_fork() -> None:
    global _pool
    if _pool is not None:
        _pool.forget()
        _pool = None


os.register_at_fork(after_in_child=_after_fork)


async def cas_check(
    gold: str,
    answer: str,
    *,
    limit: float,
    workers: int | None = None,
    timing: CasTiming | None = None,
    **options: Any,
) -> CasResult:
    """:meth:`CasPool.check` on the shared pool."""
    return await cas_pool().check(gold, answer, limit=limit, workers=workers, timing=timing, **options)
