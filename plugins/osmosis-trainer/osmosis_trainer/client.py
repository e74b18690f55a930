"""``RolloutClient``: what a trainer drives a rollout server with (ours, or osmosis-ai's).

Async, on aiohttp. ``async with RolloutClient(url) as client:`` gives the client a connection pool
of its own, closed when the block ends; a client used without ``async with`` rides on a session
the running loop's clients share, which closes when the loop shuts down (``asyncio.run`` ends).
It speaks the reference protocol, so it also drives an osmosis-ai 0.3.8 rollout server; against
``osmosis serve`` it uses a few additions (``callback_url``, ``model``, ``row``/``sample_index``,
``sampling_params``, ``policy_version``, the osmosis error category).

* :meth:`RolloutClient.submit` admits one rollout: 429 waits ``Retry-After`` and tries again; a
  connection error (or 502/503/504) is retried with backoff, the same bytes each time, so a
  resubmit whose first answer was lost gets 409 with the admission back from our server
  ("already admitted") and polls on;
* :meth:`RolloutClient.result` long-polls until the rollout is final (each poll renews its lease);
  :meth:`RolloutClient.run` submits and waits, in one request when the rollout ends within our
  server's poll wait (``POST /rollout?wait=final``; another server ignores the query and is polled);
* :meth:`RolloutClient.run_many` keeps ``concurrency`` rollouts in flight and yields each result
  as it completes;
* :meth:`RolloutClient.cancel` and :meth:`RolloutClient.health`.

A training step, end to end (needs a server: ``osmosis serve configs/training/multiply-plain.toml``)::

    import asyncio
    from osmosis_trainer import RolloutClient, RolloutRequest, SamplingParams

    async def step(rows, policy_url, n=8, version="step-1"):
        sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=1024)  # the trainer's, every call
        requests = [
            RolloutRequest(rollout_id=f"row{i}-s{k}", initial_messages=row["messages"],
                           chat_completions_url=policy_url, label=row["label"], row=i, sample_index=k,
                           sampling_params=sampling, policy_version=version)
            for i, row in enumerate(rows) for k in range(n)
        ]
        async with RolloutClient("http://127.0.0.1:8000") as client:    # token from $OSMOSIS_SERVER_TOKEN
            return [r async for r in client.run_many(requests, concurrency=64)]

A server restarted on the same run folder answers the rollouts it recorded and reports those it
lost (410); :meth:`RolloutClient.run` submits a lost one once more. A rollout that still cannot be
read (lost twice, unknown to the server, or admitted by an earlier attempt without the server
handing back its lease, as a reference server does) raises from ``run``; ``run_many`` (and every
trainer adapter) yields it as a failed result (``infra_error``) instead, as it does every other
per-rollout client error (:func:`failed_rollout`: the server unreachable, a 409, a 5xx, a broken
answer). Only a refusal of the setup is raised there: a wrong token (401), a request the server
finds malformed (422).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NoReturn

import attrs

from osmosis_trainer import _http
from osmosis_trainer._compat import TimeoutErrors, wait_for
from osmosis_trainer.records import ErrorCategory, ErrorInfo, Message, RolloutSample, TrainerError
from osmosis_trainer.retry import RetryLater, delay_of, retrying
from osmosis_trainer.sampling import SamplingParams
from osmosis_trainer.wire import DEFAULT_TOKEN_ENV, LEASE_HEADER, RolloutStatus, retry_after_seconds

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "Admission",
    "RolloutAlreadyAdmitted",
    "RolloutClient",
    "RolloutClientError",
    "RolloutConflict",
    "RolloutLost",
    "RolloutProtocolError",
    "RolloutRequest",
    "RolloutResult",
    "ServerUnavailable",
    "Unauthorized",
    "failed_rollout",
    "is_setup_refusal",
]

logger = logging.getLogger("osmosis_trainer.client")

RETRY_DELAYS_SEC: Final = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Waits between attempts after a connection error or a 502/503/504 (about 16 s in all)."""
_GATEWAY: Final = frozenset({502, 503, 504})
_FROM_REFERENCE: Final[Mapping[str, ErrorCategory]] = {
    "timeout": ErrorCategory.TIMEOUT,
    "validation_error": ErrorCategory.VALIDATION_ERROR,
    "agent_error": ErrorCategory.AGENT_ERROR,
    "http_error": ErrorCategory.POLICY_ERROR,
    "internal_error": ErrorCategory.INFRA_ERROR,
    "lease_expired": ErrorCategory.CANCELLED,
}


class RolloutClientError(TrainerError):
    """Something went wrong talking to the rollout server."""


class RolloutProtocolError(RolloutClientError):
    """The server answered with a status (or a body) the protocol does not allow here."""

    def __init__(self, message: str, *, status: int) -> None:
        self.status = status
        super().__init__(message)


class Unauthorized(RolloutProtocolError):
    """401: no token or the wrong one (``token=`` or ``$OSMOSIS_SERVER_TOKEN``)."""


class RolloutConflict(RolloutProtocolError):
    """409: the rollout id is taken by another request."""


class RolloutAlreadyAdmitted(RolloutConflict):
    """409 for a resubmit after a lost answer, from a server that does not hand the lease back
    (a reference server): the earlier attempt was admitted, but its result cannot be read."""


class RolloutLost(RolloutClientError):
    """The server cannot give an admitted rollout's result.

    ``rerun`` is True when the server said the rollout is *lost* (410: a server on the same run
    folder admitted it, then stopped before it finished): submitting it again runs it once more,
    which :meth:`RolloutClient.run` does by itself. Otherwise the server does not know it (a
    server on another run folder) or refused its lease.
    """

    def __init__(self, message: str, *, rerun: bool = False) -> None:
        self.rerun = rerun
        super().__init__(message)


class ServerUnavailable(RolloutClientError):
    """The server stayed unreachable (or answered 502/503/504) through every retry."""


SETUP_REFUSALS: Final = frozenset({401, 422})
"""The statuses that refuse the trainer's setup, not one rollout: a wrong token (401), a request the
server finds malformed (422: the trainer builds every request alike, so the next one fails too)."""


def is_setup_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is the rollout server refusing the setup (:data:`SETUP_REFUSALS`): raised to
    the trainer, never turned into one failed rollout.

    >>> is_setup_refusal(Unauthorized("401", status=401)), is_setup_refusal(RolloutConflict("409", status=409))
    (True, False)
    """
    return isinstance(exc, RolloutProtocolError) and exc.status in SETUP_REFUSALS


def failed_rollout(rollout_id: str, exc: BaseException) -> RolloutResult | None:
    """What running ``rollout_id`` raising ``exc`` means to a trainer: a failed result
    (``infra_error``, the message naming the error) for any per-rollout client error (the server
    unreachable, the rollout lost or taken, a 5xx or another status, a broken answer, the admission's
    timeout); None for what must be raised: a setup refusal (:func:`is_setup_refusal`) or anything
    that is not a client error (a bug). Every adapter (TRL, SkyRL, verl, slime) and
    :meth:`RolloutClient.run_many` classify with it.

    >>> str(failed_rollout("r", RolloutProtocolError("unexpected 500: boom", status=500)).error)
    'infra_error: RolloutProtocolError (HTTP 500): unexpected 500: boom'
    >>> failed_rollout("r", Unauthorized("401", status=401)) is None, failed_rollout("r", KeyError("x")) is None
    (True, True)
    """
    if is_setup_refusal(exc) or not isinstance(exc, (RolloutClientError, *TimeoutErrors)):
        return None
    status = f" (HTTP {exc.status})" if isinstance(exc, RolloutProtocolError) else ""
    message = f"{type(exc).__name__}{status}: {exc}".rstrip(": ")
    return RolloutResult.failed(rollout_id, ErrorCategory.INFRA_ERROR, message)


def _clean(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if v is not None}


def _sampling(value: SamplingParams | Mapping[str, Any] | None) -> SamplingParams | None:
    """A request's sampling settings: a :class:`SamplingParams`, or its JSON object (checked here)."""
    if value is None or isinstance(value, SamplingParams):
        return value
    return SamplingParams.from_json(value)


MAX_VERSION_CHARS: Final = 256
"""The longest policy version a server takes (osmosis serve answers 422 beyond it)."""


def _policy_version(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"policy_version must be a string, got {type(value).__name__} ({value!r})")
    if value is not None and not 1 <= len(value) <= MAX_VERSION_CHARS:
        raise ValueError(f"policy_version must be None or a string of 1 to {MAX_VERSION_CHARS} characters")
    return value


@attrs.frozen(kw_only=True)
class RolloutRequest:
    """One rollout to run (the ``POST /rollout`` body).

    :param rollout_id: unique while the server remembers it; one path segment.
    :param initial_messages: the prompt, as chat messages.
    :param chat_completions_url: the policy's base URL (the trainer's inference server or gateway).
    :param llm_api_key: the bearer for that URL, if it needs one.
    :param label: the row's ground truth, for the grader (a reference server takes strings only).
    :param grade: ``False`` skips grading.
    :param callback_url: push mode (our server): the results are POSTed there, no polling lease.
    :param model: the model name sent to the policy (our server; default the server's).
    :param row: where the rollout goes in the server's ``results.jsonl`` (our server).
    :param sampling_params: the trainer's sampling settings (a :class:`SamplingParams` or its JSON
        object), applied to every model call of the rollout over what the agent sends (our server).
    :param policy_version: the version of the weights the rollout samples (a trainer's step), recorded
        on each traced call (our server, ``--traces``): what off-policy correction reads.

    ``sampling_params`` and ``policy_version`` are sent only when set (an empty ``SamplingParams``
    is not sent either), so a server that does not know them sees the request it always saw.
    """

    rollout_id: str
    initial_messages: list[Message]
    chat_completions_url: str
    llm_api_key: str | None = attrs.field(default=None, repr=False)
    label: Any = None
    metadata: dict[str, Any] | None = None
    grade: bool = True
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    extra_fields: dict[str, Any] | None = None
    callback_url: str | None = None
    callback_api_key: str | None = attrs.field(default=None, repr=False)
    model: str | None = None
    row: int | None = None
    sample_index: int | None = None
    sampling_params: SamplingParams | None = attrs.field(default=None, converter=_sampling)
    policy_version: str | None = attrs.field(default=None, converter=_policy_version)

    def to_json(self) -> dict[str, Any]:
        """The body: every reference field, and ours only when set."""
        return {
            "rollout_id": self.rollout_id,
            "initial_messages": self.initial_messages,
            "chat_completions_url": self.chat_completions_url,
            "llm_api_key": self.llm_api_key,
            "label": self.label,
            "metadata": self.metadata,
            "grade": self.grade,
            "agent_timeout_sec": self.agent_timeout_sec,
            "grader_timeout_sec": self.grader_timeout_sec,
            "extra_fields": self.extra_fields,
            **_clean(
                {
                    "callback_url": self.callback_url,
                    "callback_api_key": self.callback_api_key,
                    "model": self.model,
                    "row": self.row,
                    "sample_index": self.sample_index,
                    "sampling_params": (self.sampling_params.to_json() or None)
                    if self.sampling_params is not None
                    else None,
                    "policy_version": self.policy_version,
                }
            ),
        }


@attrs.frozen
class Admission:
    """An admitted rollout: its id and the polling lease its result is read with."""

    rollout_id: str
    lease_token: str = attrs.field(repr=False)
    status: str = "queued"
    result_wait_sec: float = 30.0
    lease_timeout_sec: float = 120.0
    resubmitted: bool = False
    """True when an earlier attempt (whose answer was lost) had admitted it."""


@attrs.frozen
class RolloutResult:
    """A rollout's result (final, or the status of one poll round).

    ``error`` is in osmosis's categories (from our server's ``error`` field, else mapped from the
    reference's ``err_category``); ``err_category`` / ``err_message`` are the reference's as sent.
    ``trace`` is the rollout's training trace when the server records traces (``osmosis serve
    --traces``): the JSON form of a ``traces.jsonl`` line (:func:`osmosis_trainer.trace_from_json`
    reads it, :func:`osmosis_trainer.rollout_rows` turns the result into training rows; ``complete``
    says whether a trainer may use it), else None.
    """

    rollout_id: str
    status: RolloutStatus
    sample: RolloutSample | None = None
    reward: float | None = None
    error: ErrorInfo | None = None
    err_category: str | None = None
    err_message: str | None = None
    stage: str | None = None
    timings: dict[str, float] = attrs.field(factory=dict)
    remove_sample: bool = False
    trace: dict[str, Any] | None = None
    sampling_params: dict[str, Any] | None = None
    """The trainer's sampling settings the server applied, as it echoes them (None: the request gave
    none, or the server is older than osmosis-server 0.2 and ignored them)."""
    policy_version: str | None = None
    """The policy version the request gave, as the server echoes it."""

    @property
    def final(self) -> bool:
        """True when the rollout has ended (success, failure or cancelled)."""
        return self.status.final

    @property
    def ok(self) -> bool:
        """True when the rollout succeeded."""
        return self.status is RolloutStatus.SUCCESS

    @classmethod
    def failed(cls, rollout_id: str, category: ErrorCategory, message: str) -> RolloutResult:
        """A failure the client itself reports (the server could not give the result)."""
        return cls(rollout_id, RolloutStatus.FAILURE, error=ErrorInfo(category, message), err_message=message)

    @classmethod
    def from_json(cls, data: Any) -> RolloutResult:
        """Read a result document. :raises ValueError: not one."""
        if not isinstance(data, dict) or not isinstance(data.get("rollout_id"), str):
            raise ValueError("not a rollout result (no rollout_id)")
        status = RolloutStatus(str(data.get("status")))
        sample = None
        raw = data.get("sample")
        remove = False
        if isinstance(raw, dict):
            messages = raw.get("messages") or []
            if not isinstance(messages, list):
                raise ValueError("sample.messages is not a list")
            sample = RolloutSample(
                messages=messages,
                system_prompt=raw.get("system_prompt"),
                chat_messages=raw.get("chat_messages"),
                reward=raw.get("reward"),
                metrics=dict(raw.get("metrics") or {}),
            )
            remove = bool(raw.get("remove_sample", False))
        error = None
        ours = data.get("error")
        err_category = data.get("err_category")
        err_message = data.get("err_message")
        if isinstance(ours, dict) and "category" in ours:
            error = ErrorInfo(ErrorCategory(ours["category"]), str(ours.get("message", "")))
        elif status is RolloutStatus.CANCELLED:
            error = ErrorInfo(ErrorCategory.CANCELLED, err_message or "cancelled")
        elif err_category is not None or (status is RolloutStatus.FAILURE):
            category = _FROM_REFERENCE.get(str(err_category), ErrorCategory.AGENT_ERROR)
            error = ErrorInfo(category, err_message or f"failed ({err_category or 'no category'})")
        reward = data.get("reward", sample.reward if sample is not None else None)
        timings = data.get("timings")
        return cls(
            data["rollout_id"],
            status,
            sample=sample,
            reward=float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
            error=error,
            err_category=err_category,
            err_message=err_message,
            stage=data.get("stage"),
            timings=dict(timings) if isinstance(timings, dict) else {},
            remove_sample=remove,
            trace=trace if isinstance(trace := data.get("trace"), dict) else None,
            sampling_params=knobs if isinstance(knobs := data.get("sampling_params"), dict) else None,
            policy_version=version if isinstance(version := data.get("policy_version"), str) else None,
        )


def _detail(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:300].decode("utf-8", "replace").strip() or "(empty body)"
    detail = data.get("detail") if isinstance(data, dict) else None
    return str(detail if detail is not None else data)[:500]


class RolloutClient:
    """A client of one rollout server.

    Use it as ``async with RolloutClient(url) as client:`` (its own connection pool, closed when the
    block ends), or as a plain object whose requests share the running loop's session.

    :param url: the server's base URL, e.g. ``http://127.0.0.1:8000``.
    :param token: its bearer token; default ``$OSMOSIS_SERVER_TOKEN`` (none: no header).
    :param admission_timeout_sec: give up waiting for admission (429s) after this long; None: wait.
    :param retry_delays: the waits between attempts after a connection error or a 502/503/504.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        admission_timeout_sec: float | None = None,
        retry_delays: tuple[float, ...] = RETRY_DELAYS_SEC,
        request_timeout_sec: float = 60.0,
    ) -> None:
        self.url = url.rstrip("/")
        token = token if token is not None else os.environ.get(DEFAULT_TOKEN_ENV) or None
        self._auth = {"Authorization": "Bearer " + token} if token else {}
        self._post_headers = {**self._auth, "Content-Type": "application/json"}
        self.admission_timeout_sec = admission_timeout_sec
        self.retry_delays = retry_delays
        self.request_timeout_sec = request_timeout_sec
        self._wait_hint = 30.0  # the server's poll wait, learnt from its admissions
        self._echo_warned = False
        self._session: aiohttp.ClientSession | None = None  # its own, inside ``async with``
        self._proxy: dict[str, Any] | None = None  # the environment's proxy for the server, read once

    def __repr__(self) -> str:
        return f"RolloutClient({self.url!r})"

    async def __aenter__(self) -> RolloutClient:
        """Open the client's own connection pool (keep-alive connections to its server)."""
        if self._session is not None:
            raise RuntimeError(f"{self!r} is already open: enter `async with` once at a time")
        self._session = _http.new_session()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the pool ``async with`` opened (what the block ends with); idempotent. The client
        stays usable, on the loop's shared session."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- plumbing --------------------------------------------------------------------------------

    def _request(self, method: str, url: str, **options: Any) -> Any:
        """``async with`` one request: on the client's own pool inside ``async with``, else on the
        running loop's shared session (with the environment's proxy for the server)."""
        if self._proxy is None:
            self._proxy = _http.proxy_options(self.url)
        session = self._session if self._session is not None else _http.shared_session()
        return session.request(method, url, **self._proxy, **options)

    async def _call(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str], timeout: float
    ) -> tuple[int, bytes, Mapping[str, str], bool]:
        """One request, retried on connection errors and 502/503/504; the answer, and whether it
        was sent more than once. :raises ServerUnavailable."""
        import aiohttp

        client_timeout = aiohttp.ClientTimeout(total=timeout)
        unreachable: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError, *TimeoutErrors)
        try:
            async for attempt in retrying(self.retry_delays):
                with attempt:
                    delay = delay_of(self.retry_delays, attempt.num)
                    try:
                        async with self._request(
                            method,
                            self.url + path,
                            data=body,
                            headers=headers,
                            timeout=client_timeout,
                            allow_redirects=False,
                        ) as response:
                            status = response.status
                            content = await response.read()
                            answer_headers = response.headers
                    except unreachable as exc:
                        raise RetryLater(delay, f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
                    if status in _GATEWAY:
                        wait = retry_after_seconds(answer_headers.get("Retry-After"), delay)
                        raise RetryLater(wait, f"HTTP {status}: {_detail(content)}")
                    return status, content, answer_headers, attempt.num > 1
        except RetryLater as exc:
            last = exc.why
        else:  # pragma: no cover - stamina ends with the last attempt's exception
            last = "no attempt"
        raise ServerUnavailable(f"{method} {self.url}{path} failed after {len(self.retry_delays) + 1} attempts: {last}")

    def _raise(self, what: str, status: int, content: bytes) -> NoReturn:
        detail = _detail(content)
        if status == 401:
            raise Unauthorized(f"{what}: 401 {detail} (check the token: token= or ${DEFAULT_TOKEN_ENV})", status=status)
        raise RolloutProtocolError(f"{what}: unexpected {status}: {detail}", status=status)

    # -- the routes ------------------------------------------------------------------------------

    async def submit(self, request: RolloutRequest) -> Admission:
        """Admit ``request``; waits through 429s, retries lost connections (see the module docstring).

        :raises RolloutConflict: the id is taken by another request.
        :raises RolloutAlreadyAdmitted: a resubmit found it admitted, without a lease handed back.
        :raises RolloutProtocolError: 422 (the message names the field) and other refusals.
        :raises TimeoutError: ``admission_timeout_sec`` passed while the server was full.
        """
        admission, _ = await self._admit(request, wait=False)
        return admission

    async def _admit(self, request: RolloutRequest, *, wait: bool) -> tuple[Admission, RolloutResult | None]:
        """Admit ``request``; with ``wait``, ask our server to answer once the rollout is final (or its
        poll wait is over): the result then comes with the admission (other servers ignore it)."""
        body = json.dumps(request.to_json(), separators=(",", ":")).encode()
        deadline = None if self.admission_timeout_sec is None else time.monotonic() + self.admission_timeout_sec
        path = "/rollout?wait=final" if wait else "/rollout"
        timeout = self.request_timeout_sec + (self._wait_hint if wait else 0.0)
        resent = False
        while True:
            status, content, headers, again = await self._call("POST", path, body, self._post_headers, timeout)
            resent = resent or again
            if status == 202:
                admission = self._admission(content, request.rollout_id, resubmitted=False)
                return admission, self._inline_result(content, admission) if wait else None
            if status == 429:
                pause = retry_after_seconds(headers.get("Retry-After"), 1.0)
                if deadline is not None and time.monotonic() + pause > deadline:
                    raise TimeoutError(
                        f"rollout {request.rollout_id}: not admitted within {self.admission_timeout_sec}s (queue full)"
                    )
                await asyncio.sleep(pause)
                continue
            if status == 409:
                try:
                    data = json.loads(content)
                except ValueError:
                    data = None
                if isinstance(data, dict) and data.get("polling_lease_token"):
                    return self._admission(content, request.rollout_id, resubmitted=True), None
                if resent:
                    raise RolloutAlreadyAdmitted(
                        f"rollout {request.rollout_id}: admitted by an earlier attempt whose answer was lost; "
                        "this server gives no lease back for a resubmit, so its result cannot be read",
                        status=status,
                    )
                raise RolloutConflict(f"rollout {request.rollout_id}: {_detail(content)}", status=status)
            self._raise(f"POST /rollout ({request.rollout_id})", status, content)

    def _inline_result(self, content: bytes, admission: Admission) -> RolloutResult | None:
        data = json.loads(content)
        found = data.get("result") if isinstance(data, dict) else None
        if not isinstance(found, dict):
            return None
        try:
            result = RolloutResult.from_json(found)
        except (ValueError, TypeError) as exc:
            raise RolloutProtocolError(f"POST /rollout: not a result: {exc}", status=202) from None
        return result if result.rollout_id == admission.rollout_id else None

    def _admission(self, content: bytes, rollout_id: str, *, resubmitted: bool) -> Admission:
        try:
            data = json.loads(content)
            admission = Admission(
                str(data["rollout_id"]),
                str(data["polling_lease_token"]),
                str(data.get("status", "queued")),
                float(data.get("result_wait_timeout_sec", 30.0)),
                float(data.get("polling_lease_timeout_sec", 120.0)),
                resubmitted,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise RolloutProtocolError(f"POST /rollout: not an admission: {exc}", status=202) from None
        if admission.rollout_id != rollout_id:
            raise RolloutProtocolError(
                f"POST /rollout: admitted {admission.rollout_id!r}, not {rollout_id!r}", status=202
            )
        self._wait_hint = admission.result_wait_sec
        return admission

    async def poll(self, admission: Admission, *, until_final: bool = False) -> RolloutResult:
        """One long-poll round: the final result, or the status after the next change (or the
        server's wait); with ``until_final``, the status once the server's wait is over unless the
        rollout ended first. :raises RolloutLost: the server no longer knows the rollout."""
        headers = {**self._auth, LEASE_HEADER: admission.lease_token}
        path = f"/rollout/{urllib.parse.quote(admission.rollout_id, safe='')}/result"
        # ?wait=final (ours; other servers ignore it): one long poll per rollout, not one per status change
        query = "?wait=final" if until_final else ""
        status, content, _, _ = await self._call("GET", path + query, None, headers, admission.result_wait_sec + 10.0)
        if status == 200:
            try:
                result = RolloutResult.from_json(json.loads(content))
            except (ValueError, TypeError) as exc:
                raise RolloutProtocolError(f"GET {path}: not a result: {exc}", status=status) from None
            if result.rollout_id != admission.rollout_id:
                raise RolloutProtocolError(f"GET {path}: the result of {result.rollout_id!r}", status=status)
            return result
        if status == 410:
            raise RolloutLost(f"rollout {admission.rollout_id}: {_detail(content)}", rerun=True)
        if status in (403, 404):
            why = "its lease was refused" if status == 403 else "the server does not know it"
            raise RolloutLost(f"rollout {admission.rollout_id}: {why}: {_detail(content)}")
        self._raise(f"GET {path}", status, content)

    async def result(self, admission: Admission) -> RolloutResult:
        """Poll until the rollout is final; return its result. :raises RolloutLost."""
        while True:
            result = await self.poll(admission, until_final=True)
            if result.final:
                return result

    async def run(self, request: RolloutRequest) -> RolloutResult:
        """Submit one rollout and wait for its final result.

        Our server answers the submit itself once the rollout is final (within its poll wait), so
        a short rollout costs one request; otherwise (or with another server) it polls.
        """
        admission, result = await self._admit(request, wait=True)
        if result is None or not result.final:
            try:
                result = await self.result(admission)
            except RolloutLost as exc:
                if not exc.rerun:
                    raise
                # the server restarted and lost it before it finished: it runs once more on this submit
                admission, result = await self._admit(request, wait=True)
                if result is None or not result.final:
                    result = await self.result(admission)
        self._check_echo(request, result)
        return result

    async def run_to_result(self, request: RolloutRequest) -> RolloutResult:
        """:meth:`run`, with a per-rollout client error (the server unreachable, the rollout lost, a
        409, a 5xx, a broken answer) returned as that rollout's failed result (:func:`failed_rollout`),
        as a trainer masks it; a setup refusal (401, 422) and anything else still raise. Every
        trainer adapter runs a rollout this way (and :meth:`run_many` each of its requests)."""
        try:
            return await self.run(request)
        except Exception as exc:
            failed = failed_rollout(request.rollout_id, exc)
            if failed is None:
                raise
            return failed

    def _check_echo(self, request: RolloutRequest, result: RolloutResult) -> None:
        """Warn once when the server ran a rollout without echoing the trainer's sampling settings:
        it ignored them (a server older than osmosis-server 0.2, or another one), so the agent's own
        settings sampled it, which a trainer's loss does not assume (TRL #4159)."""
        if self._echo_warned or request.sampling_params is None or not result.ok or result.sampling_params:
            return
        self._echo_warned = True
        logger.warning(
            "the rollout server at %s did not echo sampling_params: it ignores them (older than osmosis-server "
            "0.2?), so its rollouts sample with the agent's own settings, not the trainer's",
            self.url,
        )

    async def cancel(
        self,
        ids: Iterable[str] | None = None,
        *,
        prefix: str | None = None,
        all: bool = False,
    ) -> dict[str, str]:
        """Cancel rollouts in flight by ids, by id prefix, or all of them (exactly one).

        :return: ``{rollout_id: "cancelled_queued" | "cancelled_running" | "not_found"}``.
        """
        selectors = (ids is not None) + (prefix is not None) + bool(all)
        if selectors != 1:
            raise ValueError("pass exactly one of ids, prefix, all")
        if prefix == "":
            raise ValueError("an empty prefix would select every rollout: pass all=True for that")
        payload: dict[str, Any] = (
            {"ids": list(ids)} if ids is not None else {"prefix": prefix} if prefix is not None else {"all": True}
        )
        status, content, _, _ = await self._call(
            "POST", "/rollout/cancel", json.dumps(payload).encode(), self._post_headers, self.request_timeout_sec
        )
        if status != 200:
            self._raise("POST /rollout/cancel", status, content)
        data = json.loads(content)
        dispositions = data.get("dispositions") if isinstance(data, dict) else None
        if not isinstance(dispositions, dict):
            raise RolloutProtocolError("POST /rollout/cancel: no dispositions", status=status)
        return {str(k): str(v) for k, v in dispositions.items()}

    async def health(self) -> dict[str, Any]:
        """The server's ``/health`` report."""
        status, content, _, _ = await self._call("GET", "/health", None, self._auth, self.request_timeout_sec)
        if status != 200:
            self._raise("GET /health", status, content)
        data = json.loads(content)
        if not isinstance(data, dict):
            raise RolloutProtocolError("GET /health: not an object", status=status)
        return data

    # -- many at once ----------------------------------------------------------------------------

    async def run_many(
        self, requests: Iterable[RolloutRequest] | AsyncIterable[RolloutRequest], concurrency: int = 64
    ) -> AsyncIterator[RolloutResult]:
        """Run every request with at most ``concurrency`` in flight; yield results as they complete.

        A rollout that raised a per-rollout client error is yielded as a failed result
        (:func:`failed_rollout`); a setup refusal (401, 422) is raised and ends the run.

        Stopping early (``break``) cancels what is in flight, on the server too; close the
        generator to make that happen at once: ``async with contextlib.aclosing(client.run_many(...)) as rs:``.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        source = _RequestSource(requests)
        done = object()
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=concurrency)
        in_flight: set[str] = set()
        alive = concurrency

        async def worker() -> None:
            nonlocal alive
            try:
                while True:
                    request = await source.next()
                    if request is None:
                        break
                    in_flight.add(request.rollout_id)
                    try:  # (a setup refusal or a bug raises: the consumer gets it)
                        result = await self.run_to_result(request)
                    finally:
                        in_flight.discard(request.rollout_id)
                    await queue.put(result)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                await queue.put(exc)  # the consumer raises it and cancels the rest
                return
            alive -= 1
            if alive == 0:
                await queue.put(done)

        loop = asyncio.get_running_loop()
        holding = contextlib.AsyncExitStack()
        if self._session is None:  # the loop's shutdown closes the shared session after the cancel below
            await holding.enter_async_context(_http.using_shared_session())
        tasks = [loop.create_task(worker()) for _ in range(concurrency)]
        try:
            while True:
                item = await queue.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            unfinished = sorted(in_flight)  # (a cancelled worker forgets its request)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                if unfinished:
                    await wait_for(self.cancel(unfinished), 5.0)
            except (RolloutClientError, TimeoutError, ValueError):
                pass
            finally:
                await holding.aclose()


class _RequestSource:
    """Hands out requests from a sync or async iterable to many workers."""

    def __init__(self, requests: Iterable[RolloutRequest] | AsyncIterable[RolloutRequest]) -> None:
        self._sync = iter(requests) if isinstance(requests, Iterable) else None
        self._async = aiter(requests) if self._sync is None else None  # type: ignore[arg-type]
        self._lock = asyncio.Lock()

    async def next(self) -> RolloutRequest | None:
        if self._sync is not None:
            return next(self._sync, None)
        assert self._async is not None
        async with self._lock:
            try:
                return await anext(self._async)
            except StopAsyncIteration:
                return None
