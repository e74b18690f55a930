"""``create_app``: the rollout server as an ASGI app (Starlette), for uvicorn or ``osmosis serve``.

A rollout's ``main.py`` can end with::

    from osmosis_core import LocalBackend
    from osmosis_server import create_app

    app = create_app(LocalBackend(MyWorkflow, grader=MyGrader))

and be served with ``uvicorn main:app --port 8000``; ``osmosis serve CONFIG`` builds the same app
from a run config. Any :class:`~osmosis_core.plugin.ExecutionBackend` works (local, with workers,
harbor, a third-party one); the app closes it when it shuts down.

What happens at startup: the run folder is opened (``runs/serve-<timestamp>-<pid>/`` unless
``run_dir`` says otherwise; one server per folder), the token is written there when it was
generated, and the lease and retention sweeper starts. On SIGTERM or Ctrl-C under uvicorn
(``uvicorn main:app`` or ``osmosis serve``) the server keeps answering while it drains: new
submits get 503, the rollouts in flight get ``grace_sec`` to finish, the rest are cancelled, every
final status stays readable for a short window, and only then does uvicorn stop. A second signal
cuts the grace period short.

A runnable example (serves until Ctrl-C)::

    import uvicorn
    from osmosis_core import AgentWorkflow, LocalBackend
    from osmosis_server import create_app

    class Echo(AgentWorkflow):
        async def run(self, ctx):
            return [*ctx.prompt, {"role": "assistant", "content": "hi"}]

    app = create_app(LocalBackend(Echo), run_dir="runs/echo-server")
    uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from osmosis_core import PolicyEndpoint
from osmosis_core.plugin import ExecutionBackend
from osmosis_server.auth import LIVEZ, BearerAuth, generate_token
from osmosis_server.protocol import LEASE_HEADER, BadRequest, dumps, parse_cancel, parse_submit
from osmosis_server.run_folder import RunFolder
from osmosis_server.service import (
    BadLease,
    Conflict,
    Draining,
    FolderError,
    Lost,
    QueueFull,
    RolloutService,
    Unavailable,
    UnknownRollout,
    Unreadable,
    policy_defaults,
)
from osmosis_server.settings import DEFAULT_TOKEN_ENV, ServerSettings

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["MIN_TOKEN_LENGTH", "create_app"]

log = logging.getLogger("osmosis_server")

MIN_TOKEN_LENGTH: Final = 16
QUEUE_RETRY_AFTER: Final = "1"
DRAIN_RETRY_AFTER: Final = "5"


class _TooLarge(Exception):
    pass


def _check_token(token: str) -> str:
    if len(token) < MIN_TOKEN_LENGTH or not token.isascii() or not token.isprintable() or token.strip() != token:
        raise ValueError(
            f"a server token must be at least {MIN_TOKEN_LENGTH} printable ASCII characters without spaces "
            "around it (generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def _default_logging() -> None:
    logger = logging.getLogger("osmosis_server")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s osmosis-server: %(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


class _SignalHooks:
    """Drain on the first SIGTERM / SIGINT that uvicorn would act on, then let uvicorn stop.

    Only uvicorn's own handlers are wrapped (a host with other signal handling, such as gunicorn,
    keeps its own: the app then drains at lifespan shutdown, without serving polls meanwhile).
    """

    def __init__(self, service: RolloutService) -> None:
        self.service = service
        self.signalled = False
        self._installed: list[tuple[int, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> None:
        uvicorn = sys.modules.get("uvicorn")
        if uvicorn is None or threading.current_thread() is not threading.main_thread():
            return
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            if callable(previous) and isinstance(getattr(previous, "__self__", None), uvicorn.Server):
                signal.signal(sig, functools.partial(self._handle, previous))
                self._installed.append((sig, previous))

    def remove(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._installed:
            signal.signal(sig, previous)
        self._installed.clear()

    def _handle(self, previous: Callable[[int, FrameType | None], None], signum: int, frame: FrameType | None) -> None:
        loop = self._loop
        if self.signalled or loop is None or loop.is_closed():
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self.service.hurry)
            previous(signum, frame)  # a second signal: uvicorn stops now, the drain is cut short
            return
        self.signalled = True
        loop.call_soon_threadsafe(self._drain, previous, signum)

    def _drain(self, previous: Callable[[int, FrameType | None], None], signum: int) -> None:
        log.info("%s received: draining before shutdown", signal.Signals(signum).name)
        self.service.drain().add_done_callback(lambda _: previous(signum, None))


def create_app(
    backend: ExecutionBackend,
    *,
    settings: ServerSettings | None = None,
    run_dir: Path | str | None = None,
    run_folder: RunFolder | None = None,
    token: str | None = None,
    auth: bool = True,
    policy: PolicyEndpoint | None = None,
    agent_timeout_sec: float | None = None,
    grader_timeout_sec: float | None = None,
    configure_logging: bool = True,
    handle_signals: bool = True,
    traces: dict[str, Any] | None = None,
    traces_source: str = "$.traces",
    **deprecated: Any,
) -> Starlette:
    """The rollout server for ``backend``, as an ASGI app.

    :param settings: queue bound, lease, retention, grace, poll wait (``host``/``port`` are for
        ``osmosis serve``; uvicorn's own flags say where this app listens).
    :param run_dir: the run folder (default ``runs/serve-<timestamp>-<pid>`` under the working directory).
    :param run_folder: an already built :class:`RunFolder` instead (what ``osmosis serve`` passes).
    :param token: the bearer token; default: the variable ``settings.token_env`` (else
        ``OSMOSIS_SERVER_TOKEN``) names, else a generated one, written to ``<run folder>/server-token``
        (mode 0600) at startup.
    :param auth: ``False`` turns the token off: the app then serves loopback connections only.
    :param policy: the defaults of every request's policy (``[policy]``: the model when a request
        names none, the key when it gives no ``llm_api_key``, extra headers, the response limit); a
        request's ``chat_completions_url`` is its ``base_url``. (0.1's ``model``, ``api_key``,
        ``headers``, ``max_response_bytes`` keywords still work, with a deprecation warning.)
    :param agent_timeout_sec: the workflow timeout when a request gives none (None: no limit).
    :param grader_timeout_sec: the grader timeout when a request gives none.
    :param traces: the ``[traces]`` table, traces on: each result carries the rollout's ``trace``
        (every model call through a policy gateway in front of the request's policy; osmosis-gateway).
    :param traces_source: the file the ``[traces]`` table was read from (its relative paths are read
        against it).
    :param configure_logging: give the ``osmosis_server`` logger an INFO handler when the process has none.
    :param handle_signals: drain on SIGTERM / SIGINT while still serving (under uvicorn).
    :raises ValueError: bad settings, a named token variable that is unset, a weak token.
    """
    from starlette.applications import Starlette
    from starlette.routing import Route

    settings = settings or ServerSettings()
    problems = settings.problems()
    if problems:
        raise ValueError("bad server settings: " + "; ".join(problems))
    generated = False
    token_source = ""
    if not auth:
        token = None
    elif token is not None:
        token_source = "the token given"
        _check_token(token)
    else:
        variable = settings.token_env or DEFAULT_TOKEN_ENV
        token = os.environ.get(variable) or None
        if token is None and settings.token_env:
            raise ValueError(f"the environment variable {variable} (server token_env) is not set")
        if token is None:
            token, generated = generate_token(), True
        else:
            token_source = f"the variable {variable}"
            _check_token(token)
    if run_folder is None:
        if run_dir is None:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            run_dir = Path.cwd() / "runs" / f"serve-{stamp}-{os.getpid()}"
        run_folder = RunFolder(run_dir, meta={"backend": type(backend).__name__})
    run_folder.add_secrets(token)
    service = RolloutService(
        backend,
        settings,
        run_folder,
        policy=policy_defaults(policy, deprecated, "create_app"),
        agent_timeout_sec=agent_timeout_sec,
        grader_timeout_sec=grader_timeout_sec,
        traces=traces,
        traces_source=traces_source,
    )
    hooks = _SignalHooks(service)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if configure_logging:
            _default_logging()
        await service.start()
        try:
            if generated:
                assert token is not None
                path = run_folder.write_token(token)
                log.info("auth: a token was generated into %s; send Authorization: Bearer <its content>", path)
            elif token is not None:
                log.info("auth: bearer token from %s", token_source)
            else:
                log.warning("auth is off: only connections to a loopback address are served")
            if handle_signals:
                hooks.install()
            limit = f"{service.slots} at once" if service.slots else "no backend limit"
            log.info(
                "serving: backend %s (%s), admits up to %d in flight; results in %s",
                type(backend).__name__,
                limit,
                service.capacity,
                run_folder.results_path,
            )
            yield
        finally:
            hooks.remove()
            await service.close()
            log.info("stopped")

    routes = _routes(service, settings)
    app = Starlette(routes=[Route(path, fn, methods=[method]) for method, path, fn in routes], lifespan=lifespan)
    app.state.service = service
    app.state.token_generated = generated
    app.add_middleware(BearerAuth, token=token)
    return app


def _problem(status: int, detail: str, headers: dict[str, str] | None = None) -> Response:
    from starlette.responses import Response

    return Response(dumps({"detail": detail}), status, headers, "application/json")


def _routes(service: RolloutService, settings: ServerSettings) -> list[tuple[str, str, Callable[[Request], Any]]]:
    from starlette.requests import ClientDisconnect
    from starlette.responses import Response

    limit = int(settings.max_body_mb * 1024 * 1024)
    json_type = "application/json"

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _TooLarge
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _TooLarge
        return bytes(body)

    async def submit(request: Request) -> Response:
        try:
            raw = await read_body(request)
            body = parse_submit(raw)
            admission = service.admit(body, raw)
        except BadRequest as exc:
            return _problem(422, str(exc))
        except _TooLarge:
            return _problem(413, f"the body is over {settings.max_body_mb:g} MiB")
        except Conflict as exc:
            if exc.admission is None:
                return _problem(409, "rollout_id is already registered (with another body)")
            detail = {
                "detail": "rollout_id is already registered: this same request was admitted before",
                **exc.admission,
            }
            return Response(dumps(detail), 409, None, json_type)
        except QueueFull:
            return _problem(429, "the rollout queue is full; retry later", {"Retry-After": QUEUE_RETRY_AFTER})
        except Draining:
            return _problem(503, "the rollout server is shutting down", {"Retry-After": DRAIN_RETRY_AFTER})
        except Unavailable as exc:
            return _problem(503, f"the backend is unavailable: {exc}", {"Retry-After": DRAIN_RETRY_AFTER})
        except FolderError as exc:
            return _problem(503, f"the admission cannot be recorded: {exc}", {"Retry-After": DRAIN_RETRY_AFTER})
        except ClientDisconnect:
            return Response(b"", 400)
        encoded = dumps(admission)
        if request.query_params.get("wait") == "final":
            # ours: admit, then wait (as a poll does) for the result, so a short rollout costs one request
            found = await service.result(body.rollout_id, admission["polling_lease_token"], until_final=True)
            encoded = encoded[:-1] + b',"result":' + found + b"}"
        return Response(encoded, 202, None, json_type)

    async def result(request: Request) -> Response:
        token = request.headers.get(LEASE_HEADER)
        if not token:
            return _problem(422, f"the {LEASE_HEADER} header is missing")

        try:
            body = await service.result(
                request.path_params["rollout_id"], token, until_final=request.query_params.get("wait") == "final"
            )
        except UnknownRollout:
            return _problem(404, "unknown rollout_id")
        except BadLease:
            return _problem(403, "invalid polling lease")
        except Lost as exc:
            lost = {"detail": str(exc), "rollout_id": exc.rollout_id, "status": "lost", "attempts": exc.attempts}
            return Response(dumps(lost), 410, None, json_type)
        except Unreadable as exc:
            return _problem(500, str(exc))
        return Response(body, 200, None, json_type)

    async def cancel(request: Request) -> Response:
        try:
            body = parse_cancel(await read_body(request))
        except BadRequest as exc:
            return _problem(422, str(exc))
        except _TooLarge:
            return _problem(413, f"the body is over {settings.max_body_mb:g} MiB")
        except ClientDisconnect:
            return Response(b"", 400)
        return Response(dumps({"dispositions": service.cancel(body)}), 200, None, json_type)

    async def health(request: Request) -> Response:
        return Response(dumps(service.health()), 200, None, json_type)

    livez_body = dumps({"status": "ok"})

    async def livez(request: Request) -> Response:
        return Response(livez_body, 200, None, json_type)

    from osmosis_server import __version__
    from osmosis_server.openapi import openapi_document

    openapi_body = dumps(openapi_document(__version__))

    async def openapi(request: Request) -> Response:
        return Response(openapi_body, 200, None, json_type)

    return [
        ("POST", "/rollout", submit),
        ("GET", "/rollout/{rollout_id}/result", result),
        ("POST", "/rollout/cancel", cancel),
        ("GET", "/health", health),
        ("GET", LIVEZ, livez),
        ("GET", "/openapi.json", openapi),
    ]
