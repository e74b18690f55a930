"""The driver's view of the actors: their state and load, and how requests reach them and results return.

A Ray call costs about a millisecond of CPU on each side whatever it carries, so requests and
results travel in batches:

* **Requests.** Each :class:`ActorSlot` keeps an *outbox*. A request assigned to an actor waits
  there up to ``batch_window_ms`` (or until ``chunk_size`` are waiting), then leaves with the
  others in one ``submit`` call, which returns as soon as the actor has started them.
* **Results.** Each actor has one long-lived ``results`` stream (a Ray streaming generator,
  opened when the actor is up): the outcomes of every rollout it runs, those that finish within
  ``batch_window_ms`` of each other in one item. Each rollout's results resolve its own
  :class:`Pending` future the moment they land, so results are handled in completion order.

With ``batch_window_ms = 0`` a request leaves at the end of the current event-loop turn, with
those that arrived in the same turn, and each result as soon as it is ready. Through Ray Client
(no streaming generators) every rollout is one plain ``run_one`` call.

A call or a stream that fails with one of Ray's own failures (actor died, node lost, object
lost) fails each of the actor's unfinished requests with :class:`ActorFailure`, marks the actor
unhealthy, and starts a probe that re-admits it once it answers ``ready()`` (Ray restarts it:
``max_restarts=-1``); its stream is then opened again. Nothing is dispatched to an actor that is
not healthy.

>>> slot = ActorSlot(0, "actor 0", handle=None, capacity=4)
>>> slot.state, slot.has_room
('starting', False)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from osmosis_core import ExecutionRequest, ExecutionResult
from osmosis_core.plugin import Waiters
from osmosis_ray.failures import describe, is_retriable

__all__ = ["ActorFailure", "ActorSlot", "Dispatcher", "Pending"]

log = logging.getLogger("osmosis_ray")

STARTING, HEALTHY, UNHEALTHY, BROKEN = "starting", "healthy", "unhealthy", "broken"
_PROBE_TIMEOUT_SEC = 10.0
_PROBE_MAX_DELAY_SEC = 5.0


class ActorFailure(Exception):
    """A call to an actor failed without the rollout's results (an infra failure, unless ``retriable`` is False)."""

    def __init__(self, actor: ActorSlot, cause: BaseException | str, *, retriable: bool, implicated: bool = True):
        self.actor = actor
        self.cause = cause
        self.retriable = retriable
        self.implicated = implicated
        """The rollout was in flight on the actor when it failed (counts toward isolating the row)."""
        self.text = cause if isinstance(cause, str) else describe(cause)
        super().__init__(f"{actor.describe()}: {self.text}")


@attrs.define(eq=False)
class ActorSlot:
    """One actor as the driver sees it."""

    index: int
    name: str
    handle: Any
    capacity: int
    state: str = STARTING
    node_id: str = ""
    node_ip: str = ""
    pid: int = 0
    broken: str | None = None
    """Why the actor cannot run rollouts (the rollout's code does not import on its node)."""
    in_flight: int = 0
    dispatched: int = 0
    deaths: int = 0
    """Failures seen (one per death: the actor's calls failing together count once)."""
    restarts: int = 0
    """Times it came back after a failure."""
    last_error: str | None = None
    down_since: float | None = None
    incarnation: int = 0
    """Bumped at each failure: a stream or call of an older incarnation no longer speaks for the actor."""
    pending: dict[str, Pending] = attrs.field(factory=dict)
    """Requests assigned here and not answered yet, by rollout id."""
    outbox: list[Pending] = attrs.field(factory=list)
    flush_handle: asyncio.Handle | asyncio.TimerHandle | None = None
    stream: asyncio.Task[None] | None = None
    stream_incarnation: int = -1
    cancels: list[str] = attrs.field(factory=list)

    @property
    def has_room(self) -> bool:
        """Healthy, with fewer rollouts in flight than its capacity."""
        return self.state == HEALTHY and self.in_flight < self.capacity

    def describe(self) -> str:
        """``actor 2 on node 10.0.0.3 (node id 1a2b3c4d)``."""
        if not self.node_ip:
            return self.name
        return f"{self.name} on node {self.node_ip} (node id {self.node_id[:8]})"

    def apply_ready(self, info: dict[str, Any]) -> None:
        """Take what ``ready()`` answered: where it runs, and whether it can run rollouts."""
        if self.pid and info.get("pid") != self.pid:
            self.restarts += 1
        self.node_id = str(info.get("node_id") or "")
        self.node_ip = str(info.get("node_ip") or "")
        self.pid = int(info.get("pid") or 0)
        self.broken = info.get("broken")
        self.state = BROKEN if self.broken else HEALTHY
        self.down_since = None

    def report(self) -> dict[str, Any]:
        """The actor's line in ``health()``."""
        return {
            "name": self.name,
            "state": self.state,
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "pid": self.pid,
            "in_flight": self.in_flight,
            "capacity": self.capacity,
            "dispatched": self.dispatched,
            "deaths": self.deaths,
            "restarts": self.restarts,
            "error": self.broken or (self.last_error if self.state != HEALTHY else None),
        }


class Pending:
    """One request assigned to one actor, until its results (or a failure) arrive."""

    __slots__ = ("actor", "done", "future", "request", "sent")

    def __init__(self, request: ExecutionRequest, actor: ActorSlot, future: asyncio.Future[list[ExecutionResult]]):
        self.request = request
        self.actor = actor
        self.future = future
        self.sent = False
        self.done = False


class Dispatcher:
    """Outboxes, calls and result streams for a set of actors, on one event loop (see the module docstring)."""

    def __init__(self, *, chunk_size: int, window_sec: float, streaming: bool) -> None:
        self.chunk_size = chunk_size
        self.window_sec = window_sec
        self.streaming = streaming
        self.closed = False
        self.on_change: Callable[[], None] = lambda: None
        """Called when an actor gains room or changes state (the backend tracks outages with it)."""
        self.calls = 0
        """Ray calls that carried requests."""
        self.items = 0
        """Result stream items received."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiters = Waiters()

    # -- the loop --------------------------------------------------------------------------------------

    def attach(self) -> asyncio.AbstractEventLoop:
        """Bind to the running loop (a new loop takes over once the old one is done)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._waiters.clear()
        return loop

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Start a background task that the dispatcher keeps alive and cancels on :meth:`close`."""
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- waiting for an actor with room ------------------------------------------------------------------

    async def wait(self, timeout: float | None) -> None:
        """Wait until some actor gains room or changes state (or ``timeout`` seconds pass)."""
        await self._waiters.wait(timeout)

    def wake(self, *, everyone: bool = False) -> None:
        """Wake one waiter (a slot was freed), or all (an actor changed state)."""
        self._waiters.wake(everyone=everyone)

    # -- sending ----------------------------------------------------------------------------------------

    def submit(self, actor: ActorSlot, request: ExecutionRequest) -> Pending:
        """Assign ``request`` to ``actor``; it leaves with the actor's next batch."""
        assert self._loop is not None
        pending = Pending(request, actor, self._loop.create_future())
        actor.in_flight += 1
        actor.dispatched += 1
        actor.pending[request.rollout_id] = pending
        actor.outbox.append(pending)
        if len(actor.outbox) >= self.chunk_size:
            if actor.flush_handle is not None:
                actor.flush_handle.cancel()
            self.flush(actor)
        elif actor.flush_handle is None:
            if self.window_sec > 0:
                actor.flush_handle = self._loop.call_later(self.window_sec, self.flush, actor)
            else:
                actor.flush_handle = self._loop.call_soon(self.flush, actor)
        return pending

    def flush(self, actor: ActorSlot) -> None:
        """Send the actor's outbox in one ``submit`` call (or one ``run_one`` call each, through Ray Client)."""
        actor.flush_handle = None
        batch = [p for p in actor.outbox if not p.done]
        actor.outbox = []
        if not batch:
            return
        if actor.state != HEALTHY:  # it went down since they were assigned: they never reached it
            self._fail(actor, batch, f"{actor.name} became unavailable", retriable=True, implicated=False)
            return
        for pending in batch:
            pending.sent = True
        try:
            if self.streaming:
                self.open_stream(actor)
                ref = actor.handle.submit.remote([p.request for p in batch])
                self.calls += 1
                self.spawn(self._submitted(actor, batch, ref, actor.incarnation))
            else:
                for pending in batch:
                    ref = actor.handle.run_one.remote(pending.request)
                    self.calls += 1
                    self.spawn(self._await_one(actor, pending, ref, actor.incarnation))
        except Exception as exc:  # the handle is unusable (the cluster went away)
            self._fail(actor, batch, exc, retriable=True)

    async def _submitted(self, actor: ActorSlot, batch: list[Pending], ref: Any, incarnation: int) -> None:
        try:
            await ref
        except Exception as exc:
            self._fail(actor, batch, exc, incarnation=incarnation)

    async def _await_one(self, actor: ActorSlot, pending: Pending, ref: Any, incarnation: int) -> None:
        try:
            _rollout_id, results = await ref
        except Exception as exc:
            self._fail(actor, [pending], exc, incarnation=incarnation)
            return
        self._resolve(actor, _rollout_id, results)

    def open_stream(self, actor: ActorSlot) -> None:
        """Make sure the actor's results stream of its current incarnation is being read."""
        if actor.stream_incarnation == actor.incarnation and actor.stream is not None and not actor.stream.done():
            return
        actor.stream_incarnation = actor.incarnation
        actor.stream = self.spawn(self._read_stream(actor, actor.incarnation))

    async def _read_stream(self, actor: ActorSlot, incarnation: int) -> None:
        try:
            stream = actor.handle.results.options(num_returns="streaming").remote(self.window_sec)
            async for ref in stream:
                items = await ref
                self.items += 1
                for rollout_id, results in items:
                    self._resolve(actor, rollout_id, results)
        except Exception as exc:
            if actor.incarnation == incarnation:
                self._fail(actor, list(actor.pending.values()), exc, incarnation=incarnation)
            return
        if actor.incarnation == incarnation:  # the stream never ends while its actor lives
            self._fail(actor, list(actor.pending.values()), "its results stream ended", retriable=True)

    def cancel_on_actor(self, pending: Pending) -> None:
        """Withdraw ``pending``; if it reached its actor, ask the actor to cancel it (coalesced per turn)."""
        self.withdraw(pending)
        if not pending.sent:
            return
        actor = pending.actor
        actor.cancels.append(pending.request.rollout_id)
        if len(actor.cancels) == 1 and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon(self._send_cancels, actor)

    def _send_cancels(self, actor: ActorSlot) -> None:
        ids, actor.cancels = actor.cancels, []
        if ids and actor.handle is not None:
            try:
                actor.handle.cancel.remote(ids)
            except Exception as exc:  # the actor is gone: nothing runs there any more
                log.debug("cancel on %s failed: %s", actor.describe(), exc)

    # -- results ----------------------------------------------------------------------------------------

    def withdraw(self, pending: Pending) -> None:
        """Stop waiting for ``pending`` (cancelled, or the watchdog gave up); its slot is freed."""
        if not pending.done:
            self._finish(pending)
            self.wake()
            self.on_change()

    def _finish(self, pending: Pending) -> None:
        pending.done = True
        actor = pending.actor
        actor.in_flight -= 1
        if actor.pending.get(pending.request.rollout_id) is pending:
            del actor.pending[pending.request.rollout_id]

    def _resolve(self, actor: ActorSlot, rollout_id: str, results: list[ExecutionResult]) -> None:
        pending = actor.pending.get(rollout_id)
        if pending is None or pending.done:
            return  # withdrawn (cancelled, watchdog), or already failed over to another actor
        self._finish(pending)
        self.wake()
        if not pending.future.done():
            pending.future.set_result(results)

    def _fail(
        self,
        actor: ActorSlot,
        pendings: Iterable[Pending],
        cause: BaseException | str,
        *,
        retriable: bool | None = None,
        implicated: bool = True,
        incarnation: int | None = None,
    ) -> None:
        if retriable is None:
            retriable = isinstance(cause, BaseException) and is_retriable(cause)
        for pending in list(pendings):
            if pending.done:
                continue
            self._finish(pending)
            if not pending.future.done():  # implicated only if it had reached the actor
                failure = ActorFailure(actor, cause, retriable=retriable, implicated=implicated and pending.sent)
                pending.future.set_exception(failure)
        if retriable and implicated and (incarnation is None or incarnation == actor.incarnation):
            self.mark_down(actor, cause if isinstance(cause, str) else describe(cause))
        self.wake(everyone=True)
        self.on_change()

    # -- health -----------------------------------------------------------------------------------------

    def mark_down(self, actor: ActorSlot, why: str) -> None:
        """The actor failed: no more dispatch to it until a probe sees it answer again.

        Every request still waiting on it fails over (its results cannot come back on a stream of
        a dead incarnation).
        """
        if actor.state not in (HEALTHY, BROKEN, STARTING):
            return
        actor.state = UNHEALTHY
        actor.deaths += 1
        actor.incarnation += 1
        actor.last_error = why
        actor.down_since = time.monotonic()
        log.info("%s failed (%s); rollouts in flight there are retried elsewhere", actor.describe(), why)
        self._fail(actor, list(actor.pending.values()), why, retriable=True)
        if actor.stream is not None:
            actor.stream.cancel()
        if not self.closed and self._loop is not None:
            self.spawn(self._probe(actor))
        self.wake(everyone=True)
        self.on_change()

    async def _probe(self, actor: ActorSlot) -> None:
        delay = 0.2
        while not self.closed:
            await asyncio.sleep(delay)
            try:
                async with asyncio.timeout(_PROBE_TIMEOUT_SEC):
                    info = await actor.handle.ready.remote()
            except Exception as exc:
                actor.last_error = describe(exc) if not isinstance(exc, TimeoutError) else "not answering"
                delay = min(delay * 2, _PROBE_MAX_DELAY_SEC)
                continue
            actor.apply_ready(info)
            if self.streaming and actor.state == HEALTHY:
                self.open_stream(actor)
            log.info("%s is back (%s)", actor.describe(), actor.state)
            self.wake(everyone=True)
            self.on_change()
            return

    def close(self, actors: Iterable[ActorSlot]) -> None:
        """Stop probing and reading streams; what still waits on an actor fails (not retried); wake every waiter."""
        self.closed = True
        for actor in actors:
            self._fail(actor, list(actor.pending.values()), "the backend was closed", retriable=False)
            if actor.flush_handle is not None:
                actor.flush_handle.cancel()
        for task in list(self._tasks):
            task.cancel()
        self.wake(everyone=True)
