"""The rollout service behind the HTTP routes: admission, execution, leases, retention, cancel, drain.

It holds no HTTP: :mod:`osmosis_server.app` maps routes to its methods. Per rollout it keeps one
small record and one task; every bookkeeping step is O(1) (a poll waits on the rollout's own
event, leases expire from the front of an ordered map, retention from the front of a queue), so a
training run of millions of rollouts costs the same per rollout at the end as at the start, and
memory holds only what is in flight plus what finished within ``retention_sec``. Every admission
is recorded in the run folder before it is answered (:mod:`osmosis_server.ledger`), so an id is
admitted once per folder, and a server started again on the folder answers the results it recorded
and reports the rollouts it lost.

Lifecycle of a rollout::

    admit ──> queued ──(a backend slot)──> running ──(workflow ok, grading)──> grading ──> final
                 └──────────── cancel / lease expiry / shutdown ───────────────────────────> cancelled

*queued* means waiting for one of the backend's ``max_concurrency`` slots: the server holds its
own count of them (a slot is taken before ``execute`` and given back when the workflow stage
reports), so a queued rollout is cancelled without the backend ever seeing it. At most
``max_queued`` rollouts wait beyond the slots; past that, admission answers 429. A backend that
declares no limit runs all it is given, so then at most ``max_queued`` rollouts are in flight.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import enum
import hashlib
import hmac
import logging
import os
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import attrs

from osmosis_core import (
    ErrorCategory,
    ErrorInfo,
    ExecutionRequest,
    ExecutionResult,
    ExecutionStage,
    ExecutionStatus,
    PolicyEndpoint,
)
from osmosis_core.plugin import (
    ExecutionBackend,
    RolloutReports,
    SharedGateways,
    clip,
    error_info,
    redact,
    redact_data,
    run_one,
    warn_deprecated,
)
from osmosis_server.ledger import Known
from osmosis_server.protocol import (
    CancelBody,
    RolloutStatus,
    SubmitBody,
    dumps,
    result_document,
    result_from_line,
)
from osmosis_server.push import Pusher
from osmosis_server.run_folder import RunFolder
from osmosis_server.settings import ServerSettings

__all__ = [
    "MAX_TRACE_GATEWAYS",
    "BadLease",
    "Conflict",
    "Draining",
    "FolderError",
    "Lost",
    "QueueFull",
    "RolloutService",
    "Unavailable",
    "UnknownRollout",
    "Unreadable",
    "policy_defaults",
]

log = logging.getLogger("osmosis_server")

CANCEL_WAIT_SEC: Final = 30.0
"""After cancelling, how long the backend gets to report the cancellations before the server
records them itself."""
READ_WINDOW_SEC: Final = 5.0
"""After a drain, how long the server stays up for the final statuses to be read."""
MAX_TRACE_GATEWAYS: Final = 8
"""With traces on, the policy gateways (one per distinct upstream) kept open; past it, idle ones close."""

_WF: Final = ExecutionStage.WORKFLOW
_GR: Final = ExecutionStage.GRADER


class Conflict(Exception):
    """409: the rollout id is taken. ``admission`` is set when the body is the same (already admitted)."""

    def __init__(self, admission: dict[str, Any] | None) -> None:
        self.admission = admission
        super().__init__("rollout_id is already registered")


class QueueFull(Exception):
    """429: the server holds as many rollouts as it admits."""


class Draining(Exception):
    """503: the server is shutting down."""


class Unavailable(Exception):
    """503: the backend can no longer run rollouts (its message says why)."""


class FolderError(Exception):
    """503: the run folder cannot record the admission (its message says why); nothing was admitted."""


class UnknownRollout(KeyError):
    """404: no such rollout (never admitted on this run folder)."""


class Lost(Exception):
    """410: admitted on this run folder by an earlier server that stopped before the rollout was
    recorded. Submitting it again runs it once more."""

    def __init__(self, rollout_id: str, attempts: int) -> None:
        self.rollout_id = rollout_id
        self.attempts = attempts
        times = "once" if attempts == 1 else f"{attempts} times"
        super().__init__(
            f"rollout {rollout_id} is lost: it was admitted ({times}) but the server stopped before it finished, "
            "so it was never recorded; submit it again to run it once more"
        )


class Unreadable(Exception):
    """500: a recorded rollout whose line cannot be read back from results.jsonl."""


class BadLease(PermissionError):
    """403: the polling-lease token is not this rollout's."""


class _Why(enum.Enum):
    REQUEST = "cancelled by a /rollout/cancel request"
    LEASE = "polling lease expired"
    SHUTDOWN = "the server shut down"


class AdmittedRollout:
    """One admitted rollout's record (kept until its retention ends)."""

    __slots__ = (
        "attempts",
        "callback_api_key",
        "callback_url",
        "changed",
        "digest",
        "disposition",
        "finished_at",
        "holds_slot",
        "id",
        "label",
        "lease_deadline",
        "policy_version",
        "push_task",
        "read",
        "reports",
        "request",
        "result_body",
        "row",
        "sample_index",
        "sampling",
        "secrets",
        "status",
        "task",
        "trace",
        "trace_policy",
        "why",
    )

    def __init__(self, rollout_id: str, digest: bytes) -> None:
        self.id = rollout_id
        self.digest = digest
        self.attempts = 1
        self.status = RolloutStatus.QUEUED
        self.request: ExecutionRequest | None = None
        self.task: asyncio.Task[None] | None = None
        self.changed: asyncio.Event | None = None
        self.result_body: bytes | None = None
        self.reports: RolloutReports | None = None
        """What the backend reported (while it runs)."""
        self.holds_slot = False
        self.why: _Why | None = None
        self.disposition = ""
        self.lease_deadline = 0.0
        self.callback_url: str | None = None
        self.callback_api_key: str | None = None
        self.push_task: asyncio.Task[bool] | None = None
        self.label: Any = None
        self.row = 0
        self.sample_index = 0
        self.secrets: tuple[str, ...] = ()
        self.read = False
        self.finished_at = 0.0
        self.trace: dict[str, Any] | None = None
        self.trace_policy: PolicyEndpoint | None = None
        """The upstream its calls went to through a trace gateway (traces on)."""
        self.policy_version: str | None = None
        """The request's ``policy_version``: recorded on each traced call, echoed in the result."""
        self.sampling: dict[str, Any] | None = None
        """The request's ``sampling_params``, as checked: set on each model call, echoed in the result."""


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


_DEPRECATED_POLICY_KEYWORDS = ("model", "api_key", "headers", "max_response_bytes")


def policy_defaults(policy: PolicyEndpoint | None, deprecated: Mapping[str, Any], where: str) -> PolicyEndpoint:
    """The server's default policy: ``policy``, or one built from 0.1's keywords (with a warning).

    :raises TypeError: an unknown keyword, or both ``policy`` and 0.1's keywords.
    """
    unknown = sorted(set(deprecated) - set(_DEPRECATED_POLICY_KEYWORDS))
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword arguments {unknown}")
    if not deprecated:
        return policy if policy is not None else PolicyEndpoint("", "default")
    if policy is not None:
        raise TypeError(f"{where}(): give policy=PolicyEndpoint(...) or 0.1's {sorted(deprecated)}, not both")
    names = ", ".join(sorted(deprecated))
    # stacklevel 4: past this function and the constructor that called it, at the caller's line
    warn_deprecated(f"{where}({names}=...)", f"{where}(policy=PolicyEndpoint(...))", "0.2.0", stacklevel=4)
    given = {k: v for k, v in deprecated.items() if v is not None}
    return PolicyEndpoint("", given.pop("model", "default"), headers=dict(given.pop("headers", {})), **given)


class RolloutService:
    """Runs the rollouts a server admits on ``backend``.

    :param backend: any :class:`~osmosis_core.plugin.ExecutionBackend`; the service closes it in :meth:`close`.
    :param settings: queue bound, lease, retention, grace, poll wait.
    :param run_folder: where every finished rollout is recorded (opened by :meth:`start`).
    :param policy: the defaults of every request's policy (``[policy]``): the model when a request
        names none, the key when it gives no ``llm_api_key``, the extra headers (secrets) and the
        response limit; each request's ``chat_completions_url`` takes the place of its ``base_url``.
        (0.1's ``model``, ``api_key``, ``headers`` and ``max_response_bytes`` keywords still work,
        with a deprecation warning.)
    :param agent_timeout_sec: the workflow timeout when a request gives none (None: no limit).
    :param grader_timeout_sec: the grader timeout when a request gives none.
    :param traces: the ``[traces]`` table (traces on): each rollout's model calls go through a policy
        gateway (osmosis-gateway) in front of the policy its request names, and its result carries
        ``trace``. One gateway per distinct upstream (URL, model, key, headers): a trainer that sends
        another ``chat_completions_url`` gets a gateway in front of that one; idle ones beyond
        ``MAX_TRACE_GATEWAYS`` are closed.
    :param traces_source: where the ``[traces]`` table was read (the config file): what its relative
        paths (a token-in ``tokenizer``) are read against and its errors name.
    """

    def __init__(
        self,
        backend: ExecutionBackend,
        settings: ServerSettings,
        run_folder: RunFolder,
        *,
        policy: PolicyEndpoint | None = None,
        agent_timeout_sec: float | None = None,
        grader_timeout_sec: float | None = None,
        traces: Mapping[str, Any] | None = None,
        traces_source: str = "$.traces",
        **deprecated: Any,
    ) -> None:
        self.policy = policy_defaults(policy, deprecated, "RolloutService")
        self.backend = backend
        self.traces = dict(traces) if traces is not None else None
        self.gateways = SharedGateways(self.traces or {}, source=traces_source, keep_idle=MAX_TRACE_GATEWAYS)
        self.settings = settings
        self.folder = run_folder
        self.agent_timeout_sec = agent_timeout_sec
        self.grader_timeout_sec = grader_timeout_sec
        self.pusher = Pusher()
        self.instance_id = os.environ.get("_OSMOSIS_ROLLOUT_INSTANCE_ID") or uuid.uuid4().hex
        self.process_id = uuid.uuid4().hex
        self._key = secrets.token_bytes(32)
        self.slots = max(0, backend.max_concurrency)
        self.capacity = self.slots + settings.max_queued
        self._gate: asyncio.Semaphore | None = None
        self._table: dict[str, AdmittedRollout] = {}
        self._active: dict[str, AdmittedRollout] = {}
        self._leases: collections.OrderedDict[str, AdmittedRollout] = collections.OrderedDict()
        self._retained: collections.deque[AdmittedRollout] = collections.deque()
        self._idle: asyncio.Event | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._drain: asyncio.Task[None] | None = None
        self._watch: list[AdmittedRollout] = []
        self.draining = False
        self._hurried = False
        self.unavailable: str | None = None
        self.started = False
        self.closed = False
        self.counts: collections.Counter[str] = collections.Counter()
        self._server_secrets = self.policy.secrets()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the run folder and start the lease and retention sweeper (on the serving loop)."""
        if self.started:
            return
        self.folder.add_secrets(*self._server_secrets)
        self.folder.open()
        self._key = self.folder.lease_key
        recovered = self.folder.recovered
        if recovered["recorded"] or recovered["lost"]:
            log.info(
                "run folder %s: %d rollouts already recorded (their results are read back; a resubmit gets 409), "
                "%d admitted by an earlier server and lost (a poll gets 410; a resubmit runs it once more)",
                self.folder.path,
                recovered["recorded"],
                recovered["lost"],
            )
        self._gate = asyncio.Semaphore(self.slots) if self.slots else None
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        self.started = True

    def drain(self) -> asyncio.Task[None]:
        """Start draining (idempotent): 503 for new submits, ``grace_sec`` for the rollouts in flight,
        then the rest cancelled; every one ends with a final status, recorded in the run folder.
        The returned task ends when they are all final and read (or the read window has passed)."""
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._drain_now())
        return self._drain

    async def _drain_now(self) -> None:
        self.draining = True
        self._watch = list(self._active.values())
        grace = self.settings.grace_sec
        log.info("draining: new rollouts get 503; %d in flight get %gs to finish", len(self._active), grace)
        if self._active and grace > 0 and not self._hurried:
            await self._wait_idle(grace)
        if self._active:
            log.info("grace period over: cancelling %d rollouts", len(self._active))
            for entry in list(self._active.values()):
                self._cancel(entry, _Why.SHUTDOWN)
            await self._wait_idle(CANCEL_WAIT_SEC)
        for entry in list(self._active.values()):  # a backend that ignored its cancellation
            self._finish(entry, self._cancelled(entry, "; the backend did not report the cancellation"))
        deadline = time.monotonic() + (0.0 if self._hurried else READ_WINDOW_SEC)
        while time.monotonic() < deadline and (self.pusher.pending or not all(e.read for e in self._watch)):
            await asyncio.sleep(0.05)
        self._watch = []
        log.info(
            "drained: %d finished, %d cancelled in all; results in %s",
            self.counts["finished"],
            self.counts[RolloutStatus.CANCELLED.value],
            self.folder.results_path,
        )

    def hurry(self) -> None:
        """Cut the drain's grace period short (a second signal): cancel what is in flight now."""
        self._hurried = True
        if self._idle is not None:
            self._idle.set()

    async def _wait_idle(self, timeout: float) -> None:
        if not self._active:
            return
        self._idle = asyncio.Event()
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            pass
        finally:
            self._idle = None

    async def close(self) -> None:
        """Drain (when not done yet), then close the backend, the HTTP clients and the run folder."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.started:
                await self.drain()
                undelivered = await self.pusher.aclose(READ_WINDOW_SEC)
                if undelivered:
                    log.warning(
                        "%d callback deliveries were still retrying at shutdown; they were dropped", undelivered
                    )
        finally:
            if self._sweeper is not None:
                self._sweeper.cancel()
                await asyncio.wait({self._sweeper})
            try:
                await self.backend.aclose()
            finally:
                from osmosis_core.http import aclose_http

                await self.gateways.aclose()

                try:
                    await aclose_http()
                finally:
                    self.folder.close()

    # -- admission -------------------------------------------------------------------------------

    def lease_token(self, rollout_id: str, digest: bytes) -> str:
        """The polling lease of a rollout: derived from the id and the body, so an identical
        resubmit gets the same one back (and nothing else does)."""
        mac = hmac.digest(self._key, rollout_id.encode() + b"\0" + digest, "sha256")
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def _admission(self, entry: AdmittedRollout) -> dict[str, Any]:
        return self._admission_of(entry.id, entry.digest, entry.status.value)

    def _admission_of(self, rollout_id: str, digest: bytes, status: str) -> dict[str, Any]:
        return {
            "rollout_id": rollout_id,
            "status": status,
            "polling_lease_token": self.lease_token(rollout_id, digest),
            "result_wait_timeout_sec": self.settings.result_wait_sec,
            "polling_lease_timeout_sec": self.settings.lease_timeout_sec,
        }

    def admit(self, body: SubmitBody, raw: bytes) -> dict[str, Any]:
        """Admit one rollout, record the admission in the run folder, and start it; return the
        admission document (202). Nothing is admitted when it raises.

        A rollout id is admitted once per run folder: one recorded there (by this server or an
        earlier one) gets 409; one an earlier server admitted and lost is admitted once more.

        :raises Draining, Unavailable, FolderError: 503. :raises Conflict: 409. :raises QueueFull: 429.
        """
        if self.draining or not self.started:
            raise Draining
        if self.unavailable is not None:
            raise Unavailable(self.unavailable)
        digest = hashlib.sha256(raw).digest()
        existing = self._table.get(body.rollout_id)
        if existing is not None:
            same = hmac.compare_digest(existing.digest, digest)
            raise Conflict(self._admission(existing) if same else None)
        try:
            known = self.folder.lookup(body.rollout_id)
        except OSError as exc:
            raise FolderError(str(exc)) from None
        if known is not None and known.recorded:
            same = bool(known.digest) and hmac.compare_digest(known.digest, digest)
            raise Conflict(
                self._admission_of(known.rollout_id, known.digest, known.status or "unknown") if same else None
            )
        if len(self._active) >= self.capacity:
            self.counts["refused_full"] += 1
            raise QueueFull
        entry = AdmittedRollout(body.rollout_id, digest)
        defaults = self.policy  # the request's URL in place of its base_url, its model and key if given
        policy = PolicyEndpoint(
            body.chat_completions_url,
            body.model or defaults.model,
            body.llm_api_key or defaults.api_key,
            defaults.headers,
            defaults.max_response_bytes,
            sampling=body.sampling_params,  # every call of the rollout gets them (its gateway's, or its clients')
        )
        metadata: dict[str, Any] = body.metadata or {}
        entry.request = ExecutionRequest(
            rollout_id=body.rollout_id,
            prompt=body.initial_messages,
            policy=policy,
            label=body.label,
            metadata=metadata,
            agent_timeout_sec=body.agent_timeout_sec or self.agent_timeout_sec,
            grader_timeout_sec=body.grader_timeout_sec or self.grader_timeout_sec,
            grade=body.grade,
        )
        entry.label = body.label
        entry.secrets = tuple(s for s in (body.llm_api_key, body.callback_api_key) if s)
        entry.policy_version = body.policy_version
        entry.sampling = policy.sampling
        row = body.row if body.row is not None else _index(metadata.get("row"))
        sample_index = body.sample_index if body.sample_index is not None else _index(metadata.get("sample_index"))
        auto_row = False
        if known is not None:  # lost: it keeps its place
            entry.row = row if row is not None else known.row
            entry.sample_index = sample_index if sample_index is not None else known.sample_index
        else:
            auto_row = row is None
            entry.row = row if row is not None else self.folder.next_row()
            entry.sample_index = sample_index or 0
        admission = self._admission(entry)
        attempts = entry.attempts = 1 if known is None else known.attempts + 1
        try:  # durable before the 202: a server killed from here on knows the id
            self.folder.admit(
                entry.id, digest, entry.row, entry.sample_index, body.label, attempts=attempts, auto_row=auto_row
            )
        except OSError as exc:
            self.counts["refused_unrecordable"] += 1
            log.error("rollout %s: not admitted: %s", entry.id, exc)
            raise FolderError(str(exc)) from None
        loop = asyncio.get_running_loop()
        if body.callback_url is not None:
            entry.callback_url = body.callback_url
            entry.callback_api_key = body.callback_api_key
        else:
            entry.lease_deadline = loop.time() + self.settings.lease_timeout_sec
            self._leases[entry.id] = entry
        self._table[entry.id] = entry
        self._active[entry.id] = entry
        self.counts["admitted"] += 1
        entry.task = task = loop.create_task(self._run(entry, body.grade))
        task.add_done_callback(self._task_done(entry))
        if known is not None:
            self.counts["admitted_again"] += 1
            log.info("rollout %s: lost by an earlier server; admitted again (attempt %d)", entry.id, attempts)
        else:
            log.debug("rollout %s: queued", entry.id)
        return admission

    # -- execution -------------------------------------------------------------------------------

    async def _run(self, entry: AdmittedRollout, grade: bool) -> None:
        request = entry.request
        assert request is not None
        entry.reports = reports = RolloutReports(request)
        final: ExecutionResult
        try:
            if self._gate is not None:
                await self._gate.acquire()
                entry.holds_slot = True
            entry.status = RolloutStatus.RUNNING
            self._changed(entry)
            log.debug("rollout %s: running", entry.id)
            if self.traces is not None:
                request = await self._open_trace(entry, request)
            final = await run_one(
                self.backend,
                request,
                reports,
                on_workflow_complete=self._on_workflow(entry, grade),
                secrets=self._server_secrets + entry.secrets,
            )
            if final.status is ExecutionStatus.CANCELLED and entry.why is not None:
                final = self._cancelled(entry)
            elif reports.unavailable is not None and self.unavailable is None:
                self.unavailable = reports.unavailable
                log.error("the backend is unavailable: %s; new rollouts get 503", reports.unavailable)
            elif final is not reports.last and final.error is not None:  # run_one's: what went wrong around it
                log.error("rollout %s: the backend failed: %s", entry.id, final.error.message)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if entry.why is None and task is not None and not task.cancelling():
                # nobody cancelled the task (lifecycle's rule): a step of the server's around the backend raised it
                message = "CancelledError was raised while the server did not cancel the rollout"
                final = self._failure(entry, ErrorCategory.INFRA_ERROR, message)
            else:
                final = self._cancelled(entry)
        except Exception as exc:  # the server's own steps around the backend (opening the rollout's trace)
            info = error_info(exc, secrets=self._server_secrets + entry.secrets, category=ErrorCategory.INFRA_ERROR)
            log.error("rollout %s: the server failed running it: %s", entry.id, info.message)
            final = self._failure(entry, info.category, info.message)
        finally:
            self._release(entry)
            if self.traces is not None:
                self._take_trace(entry)
        self._finish(entry, final)

    async def _open_trace(self, entry: AdmittedRollout, request: ExecutionRequest) -> ExecutionRequest:
        """The request with the rollout's own endpoint on the gateway in front of its policy (which
        sets the trainer's sampling settings on each call and records them, with the policy version)."""
        endpoint = await self.gateways.open(request.policy, entry.id, policy_version=entry.policy_version)
        entry.trace_policy = request.policy
        return attrs.evolve(request, policy=endpoint)

    def _take_trace(self, entry: AdmittedRollout) -> None:
        upstream, entry.trace_policy = entry.trace_policy, None
        if upstream is None:
            return
        trace = self.gateways.take(upstream, entry.id)
        if trace is not None:
            entry.trace = trace.to_json()

    def _task_done(self, entry: AdmittedRollout) -> Callable[[asyncio.Task[None]], None]:
        # the safety net: a task cancelled before it ever ran (its coroutine never entered its
        # try block) or one that failed in the server's own code still ends with a final status
        def done(task: asyncio.Task[None]) -> None:
            if entry.result_body is not None:
                return
            self._release(entry)
            if task.cancelled():
                self._finish(entry, self._cancelled(entry))
            else:
                exc = task.exception()
                log.error("rollout %s: the server failed running it", entry.id, exc_info=exc)
                self._finish(entry, self._failure(entry, ErrorCategory.INFRA_ERROR, f"the server failed: {exc!r}"))

        return done

    def _release(self, entry: AdmittedRollout) -> None:
        if entry.holds_slot:
            entry.holds_slot = False
            assert self._gate is not None
            self._gate.release()

    def _on_workflow(self, entry: AdmittedRollout, grade: bool) -> Callable[[ExecutionResult], Awaitable[None]]:
        async def on_workflow_complete(result: ExecutionResult) -> None:
            if entry.result_body is not None:
                return
            self._release(entry)
            if result.ok:
                if grade:
                    entry.status = RolloutStatus.GRADING
                    self._changed(entry)
                    log.debug("rollout %s: grading", entry.id)
                if entry.callback_url is not None:
                    self._push(entry, result, final=False)

        return on_workflow_complete

    def _failure(self, entry: AdmittedRollout, category: ErrorCategory, message: str) -> ExecutionResult:
        return self._reports(entry).failure(category, message)

    def _reports(self, entry: AdmittedRollout) -> RolloutReports:
        if entry.reports is None:  # cancelled or failed before it ran
            assert entry.request is not None
            entry.reports = RolloutReports(entry.request)
        return entry.reports

    def _cancelled(self, entry: AdmittedRollout, more: str = "") -> ExecutionResult:
        reports = self._reports(entry)
        why = entry.why or _Why.SHUTDOWN
        if why is _Why.LEASE:
            reason = f"nobody polled its result for {self.settings.lease_timeout_sec:g}s (polling lease expired)"
        elif why is _Why.SHUTDOWN:
            reason = f"the server shut down (its grace period of {self.settings.grace_sec:g}s was over)"
        else:
            reason = why.value
        where = "while queued" if entry.disposition == "cancelled_queued" else f"during the {reports.stage} stage"
        return reports.cancelled(f"{reason} {where}{more}")

    def _finish(self, entry: AdmittedRollout, final: ExecutionResult) -> None:
        """End a rollout: its result document, its line in the run folder, its counters, its push.

        It never raises: whatever goes wrong here (a result no document can hold, a bug of ours)
        still ends the rollout, as a recorded failure, and frees everything it held.
        """
        if entry.result_body is not None:
            return
        lease_expired = entry.why is _Why.LEASE
        try:
            final, body = self._document(entry, final, lease_expired)
        except Exception as exc:  # not even a failure document could be made of it
            log.error("rollout %s: its result cannot be reported", entry.id, exc_info=exc)
            final = ExecutionResult(
                entry.id,
                _WF,
                ExecutionStatus.FAILURE,
                error=ErrorInfo(
                    ErrorCategory.INFRA_ERROR,
                    "the server could not report the result: " + clip(repr(exc), self._server_secrets + entry.secrets),
                ),
            )
            body = dumps(result_document(final))
        entry.result_body = body
        entry.status = RolloutStatus(final.status.value)
        entry.finished_at = time.monotonic()
        self._release(entry)
        try:
            self._record(entry, final, lease_expired)
            self.counts["finished"] += 1
            self.counts[final.status.value] += 1
            if final.error is not None:
                self.counts["error:" + final.error.category.value] += 1
            if lease_expired:
                entry.read = True  # nobody is listening
            if entry.callback_url is not None:
                self._push(entry, None, final=True)
            self._log_final(entry, final)
        except Exception as exc:
            log.error("rollout %s: the server failed finishing it", entry.id, exc_info=exc)
        finally:
            # forget what is not needed any more: only the encoded result stays for its retention
            entry.request = None
            entry.reports = None
            entry.sampling = entry.policy_version = None
            entry.task = None
            self._leases.pop(entry.id, None)
            self._active.pop(entry.id, None)
            self._retained.append(entry)
            self._changed(entry)
            if self._idle is not None and not self._active:
                self._idle.set()

    def _document(
        self, entry: AdmittedRollout, final: ExecutionResult, lease_expired: bool
    ) -> tuple[ExecutionResult, bytes]:
        """The final result and its encoded document. A malformed report of the backend's is an
        infra_error failure; a sample that is not JSON (the workflow's doing) a validation_error one."""
        problem = RolloutReports.problem(final)
        if problem is None:
            try:
                document = result_document(final, label=entry.label, lease_expired=lease_expired)
                return final, self._dumps(entry, self._with_trace(entry, self._with_knobs(entry, document)))
            except (TypeError, ValueError, RecursionError) as exc:
                info = error_info(exc, secrets=self._server_secrets + entry.secrets)
                category, problem = (
                    ErrorCategory.VALIDATION_ERROR,
                    f"the sample cannot be written as JSON: {info.message}",
                )
                stage = final.stage
        else:
            category, stage = ErrorCategory.INFRA_ERROR, _WF
        failure = ExecutionResult(entry.id, stage, ExecutionStatus.FAILURE, error=ErrorInfo(category, problem))
        document = self._with_knobs(entry, result_document(failure, label=entry.label))
        return failure, self._dumps(entry, self._with_trace(entry, document))

    def _dumps(self, entry: AdmittedRollout, document: dict[str, Any]) -> bytes:
        """A result document as the trainer gets it, without the server's or the request's secrets.

        The rollout itself redacts with the policy it was given; with traces on that is its gateway
        endpoint, so a message that carries what the upstream echoed of its key (a 401 passed on) is
        cleaned here, with the key the request brought (``llm_api_key``)."""
        body = dumps(document)
        secrets = self._server_secrets + entry.secrets
        if secrets:
            text = body.decode("utf-8", "surrogateescape")
            if redact(text, secrets) is not text:
                body = dumps(redact_data(document, secrets))
        return body

    def _with_knobs(self, entry: AdmittedRollout, document: dict[str, Any]) -> dict[str, Any]:
        """``document`` with what the request set of the rollout's sampling (``sampling_params``, as
        checked) and ``policy_version``, each only when it set it (:meth:`_knobs`)."""
        document.update(self._knobs(entry))
        return document

    @staticmethod
    def _knobs(entry: AdmittedRollout) -> dict[str, Any]:
        """The request's ``sampling_params`` and ``policy_version`` that it set (a result document
        and a ``results.jsonl`` line carry them; a request without them leaves both as before)."""
        knobs: dict[str, Any] = {}
        if entry.sampling is not None:
            knobs["sampling_params"] = entry.sampling
        if entry.policy_version is not None:
            knobs["policy_version"] = entry.policy_version
        return knobs

    def _with_trace(self, entry: AdmittedRollout, document: dict[str, Any]) -> dict[str, Any]:
        """``document`` with the rollout's ``trace`` when traces are on (null when it has none)."""
        if self.traces is not None:
            document["trace"] = entry.trace
        return document

    def _record(self, entry: AdmittedRollout, final: ExecutionResult, lease_expired: bool) -> None:
        try:
            trace_offset = None
            if entry.trace is not None:  # the trace line first: a result in the folder always has its trace
                trace_offset = self.folder.record_trace(
                    entry.row, entry.sample_index, entry.id, entry.trace, entry.secrets
                )
            self.folder.record(
                entry.row,
                entry.sample_index,
                final,
                entry.secrets,
                lease_expired=lease_expired,
                digest=entry.digest,
                attempts=entry.attempts,
                label=entry.label,
                trace_offset=trace_offset,
                extra=self._knobs(entry),
            )
        except (OSError, TypeError, ValueError, RecursionError) as exc:
            self.counts["unrecorded"] += 1
            log.error("rollout %s: its result could not be written to %s: %s", entry.id, self.folder.results_path, exc)

    def _log_final(self, entry: AdmittedRollout, final: ExecutionResult) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        spent = sum(v for k, v in final.timings.items() if k != "queued")
        if final.error is None:
            reward = final.reward
            log.info(
                "rollout %s: success%s in %.2fs", entry.id, "" if reward is None else f", reward {reward:g}", spent
            )
        else:
            log.info(
                "rollout %s: %s (%s: %s)",
                entry.id,
                final.status.value,
                final.error.category.value,
                clip(final.error.message, self._server_secrets + entry.secrets, 200),
            )

    def _push(self, entry: AdmittedRollout, result: ExecutionResult | None, *, final: bool) -> None:
        url = entry.callback_url
        assert url is not None
        if result is None:
            body = entry.result_body
            assert body is not None
            body = body[:-1] + b',"final":true}'
        else:
            try:
                document = self._with_knobs(entry, result_document(result, label=entry.label))
                body = self._dumps(entry, {**document, "final": final})
            except (TypeError, ValueError, RecursionError):
                return  # the final delivery reports why
        done = self._delivered(entry) if final else None
        entry.push_task = self.pusher.send(
            entry.id, url, entry.callback_api_key, body, after=entry.push_task, done=done
        )

    def _delivered(self, entry: AdmittedRollout) -> Callable[[bool], None]:
        def done(ok: bool) -> None:
            entry.read = True
            entry.push_task = None

        return done

    # -- polling ---------------------------------------------------------------------------------

    def _changed(self, entry: AdmittedRollout) -> None:
        event = entry.changed
        if event is not None:
            entry.changed = None
            event.set()

    def _check(self, rollout_id: str, token: str) -> AdmittedRollout:
        entry = self._table.get(rollout_id)
        if entry is None:
            raise UnknownRollout(rollout_id)
        if not hmac.compare_digest(token.encode(), self.lease_token(entry.id, entry.digest).encode()):
            raise BadLease(rollout_id)
        return entry

    def _renew(self, entry: AdmittedRollout) -> None:
        if entry.id in self._leases:
            entry.lease_deadline = asyncio.get_running_loop().time() + self.settings.lease_timeout_sec
            self._leases.move_to_end(entry.id)

    async def result(self, rollout_id: str, token: str, *, until_final: bool = False) -> bytes:
        """The rollout's result document when final; else wait up to ``result_wait_sec`` for a
        change and return its status then. Every poll renews the lease.

        :param until_final: wait through status changes for the final result (``?wait=final``,
            ours: one poll per rollout instead of one per status change).
        :raises UnknownRollout: 404. :raises BadLease: 403.
        """
        entry = self._table.get(rollout_id)
        if entry is None:  # not in memory: finished past its retention, or by an earlier server
            return await self._recorded(rollout_id, token)
        entry = self._check(rollout_id, token)
        body = entry.result_body
        if body is None:
            self._renew(entry)
            try:
                async with asyncio.timeout(self.settings.result_wait_sec):
                    while True:
                        event = entry.changed
                        if event is None:
                            event = entry.changed = asyncio.Event()
                        await event.wait()
                        if not until_final or entry.result_body is not None:
                            break
            except TimeoutError:
                pass
            self._renew(entry)
            body = entry.result_body
            if body is None:
                return dumps({"rollout_id": entry.id, "status": entry.status.value})
        entry.read = True
        return body

    async def _recorded(self, rollout_id: str, token: str) -> bytes:
        """The result of a rollout this run folder recorded (read back from its line in
        results.jsonl, and its trace from its line in traces.jsonl), checked against its lease as a
        live one is. It carries ``trace`` as a live one does: when traces are on (null when it was
        recorded without one), or whenever a trace was recorded.

        :raises UnknownRollout: never admitted here. :raises BadLease: 403. :raises Lost: 410.
        :raises Unreadable: 500.
        """
        try:
            known = self.folder.lookup(rollout_id)
        except OSError as exc:
            raise Unreadable(str(exc)) from None
        if known is None:
            raise UnknownRollout(rollout_id)
        if not known.digest:
            raise BadLease(f"{rollout_id} was recorded by a server that kept no admissions ledger: no lease is valid")
        if not hmac.compare_digest(token.encode(), self.lease_token(rollout_id, known.digest).encode()):
            raise BadLease(rollout_id)
        if not known.recorded:
            raise Lost(rollout_id, known.attempts)
        try:
            line, trace = await asyncio.to_thread(self._read_back, known)
            document = result_document(result_from_line(line), label=known.label, lease_expired=known.lease_expired)
            document.update({key: line[key] for key in ("sampling_params", "policy_version") if key in line})
            if trace is not None or self.traces is not None:
                document["trace"] = trace
            return dumps(document)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.error("rollout %s: its recorded result cannot be read back: %s", rollout_id, exc)
            raise Unreadable(f"rollout {rollout_id} is recorded, but its line cannot be read back: {exc}") from None

    def _read_back(self, known: Known) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The recorded result line, and its trace when that can still be read: a ``traces.jsonl``
        deleted, rotated or edited since costs the trace (``null``, logged), never the result."""
        line = self.folder.read_line(known)
        try:
            trace = self.folder.read_trace(known)
        except (OSError, ValueError) as exc:
            log.warning(
                "rollout %s: its recorded trace cannot be read back (%s); answered without it", known.rollout_id, exc
            )
            trace = None
        return line, trace

    # -- cancel ----------------------------------------------------------------------------------

    def cancel(self, body: CancelBody) -> dict[str, str]:
        """Cancel by ids, by prefix or all; ``{id: cancelled_queued | cancelled_running | not_found}``.

        Only rollouts in flight are cancelled; a finished or unknown id is ``not_found`` (it is
        idempotent: cancelling twice gives the same disposition twice).
        """
        if body.ids is not None:
            selected = list(dict.fromkeys(body.ids))
        elif body.prefix is not None:
            prefix = body.prefix
            selected = [rid for rid in self._active if rid.startswith(prefix)]
        else:
            selected = list(self._active)
        dispositions: dict[str, str] = {}
        for rollout_id in selected:
            entry = self._active.get(rollout_id)
            dispositions[rollout_id] = "not_found" if entry is None else self._cancel(entry, _Why.REQUEST)
        cancelled = sum(1 for d in dispositions.values() if d != "not_found")
        if cancelled:
            what = (
                "all" if body.all else f"prefix {body.prefix!r}" if body.prefix is not None else f"{len(selected)} ids"
            )
            log.info("cancel (%s): %d rollouts cancelled", what, cancelled)
        return dispositions

    def _cancel(self, entry: AdmittedRollout, why: _Why) -> str:
        if entry.why is not None:
            return entry.disposition
        entry.why = why
        entry.disposition = "cancelled_queued" if entry.status is RolloutStatus.QUEUED else "cancelled_running"
        self._leases.pop(entry.id, None)
        if why is _Why.LEASE:
            self.counts["lease_expired"] += 1
            log.info("rollout %s: nobody polled it for %gs; cancelled", entry.id, self.settings.lease_timeout_sec)
        task = entry.task
        if task is not None and not task.done():
            task.cancel()
        return entry.disposition

    # -- leases and retention --------------------------------------------------------------------

    def sweep(self) -> None:
        """Expire the leases and the retained results whose time is up (the sweeper calls it)."""
        loop_now = asyncio.get_running_loop().time()
        leases = self._leases
        while leases:
            entry = leases[next(iter(leases))]
            if entry.lease_deadline > loop_now:
                break
            leases.popitem(last=False)
            self._cancel(entry, _Why.LEASE)
        horizon = time.monotonic() - self.settings.retention_sec
        retained = self._retained
        table = self._table
        while retained and retained[0].finished_at <= horizon:
            entry = retained.popleft()
            if table.get(entry.id) is entry:
                del table[entry.id]
        if self.started and not self.closed:
            self.folder.flush()

    async def _sweep(self) -> None:
        shortest = min(self.settings.lease_timeout_sec, self.settings.retention_sec or 1.0)
        interval = min(1.0, max(0.02, shortest / 20))
        while True:
            await asyncio.sleep(interval)
            self.sweep()

    # -- health ----------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The backend's health report, plus the server's identity, lifecycle and counters."""
        try:
            report = dict(self.backend.health())
        except Exception as exc:
            report = {"status": "error", "error": clip(f"{type(exc).__name__}: {exc}", self._server_secrets)}
        if self.unavailable is not None:
            report["status"] = "unavailable"
            report["error"] = self.unavailable
        report.setdefault("status", "ok")
        running = sum(1 for e in self._active.values() if e.status is not RolloutStatus.QUEUED)
        report["instance_id"] = self.instance_id
        report["process_id"] = self.process_id
        report["lifecycle"] = {
            "accepting_rollouts": self.started and not self.draining and self.unavailable is None,
            "active_rollouts": len(self._active),
        }
        report["server"] = {
            "queued": len(self._active) - running,
            "running": running,
            "capacity": self.capacity,
            "backend_slots": self.slots,
            "retained_results": len(self._retained),
            "recovered": self.folder.recovered if self.started else {"recorded": 0, "lost": 0},
            "draining": self.draining,
            "callbacks_pending": self.pusher.pending,
            "counts": dict(sorted(self.counts.items())),
        }
        return report
