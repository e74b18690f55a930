"""``osmosis serve CONFIG``: serve a rollout to a trainer over HTTP.

The config is read, the rollout loaded and the backend built exactly as ``osmosis run`` does
(the same file, the same flags, the same errors); the ``[server]`` table (see
:mod:`osmosis_server.settings`) says how to listen, and flags override it.
"""

from __future__ import annotations

import datetime as _dt
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from osmosis_core.frontend import config_options

__all__ = ["serve"]

_NOT_FOR_SERVE = ("--dataset", "--limit", "--n-samples", "--policy-url")
"""``osmosis run``'s flags that mean nothing here: each request brings its prompt and its policy endpoint."""


def _refuse(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    if value is not None:
        raise click.UsageError(
            f"{param.opts[0]} has no meaning for serve: each request brings its prompt and its policy endpoint", ctx
        )


def _not_for_serve(function: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of :data:`_NOT_FOR_SERVE`, hidden from ``--help`` and refused with the reason (not
    click's bare "No such option"): a user who runs ``osmosis run`` with them tries them here too."""
    for flag in _NOT_FOR_SERVE:
        option = click.option(flag, hidden=True, expose_value=False, callback=_refuse, help="(not for serve)")
        function = option(function)
    return function


@click.command("serve", short_help="Serve a rollout to a trainer over HTTP.")
@click.argument("config_file", metavar="CONFIG", required=False, type=click.Path(dir_okay=False, path_type=Path))
@config_options(omit=_NOT_FOR_SERVE)
@_not_for_serve
@click.option("--host", metavar="ADDR", help="The address to listen on (overrides server.host; default 127.0.0.1).")
@click.option(
    "--port", type=click.IntRange(0, 65535), help="The port (overrides server.port; default 8000; 0: a free one)."
)
@click.option(
    "--token-env", metavar="VAR", help="The variable holding the bearer token (default OSMOSIS_SERVER_TOKEN)."
)
@click.option("--no-auth", is_flag=True, help="No token (accepted on a loopback address only).")
@click.option(
    "--max-queued", type=click.IntRange(min=0), help="Rollouts waiting beyond the backend's concurrency (429 past it)."
)
@click.option(
    "--lease-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds without a poll before a rollout is cancelled.",
)
@click.option(
    "--retention",
    type=click.FloatRange(min=0),
    help="Seconds a finished result stays in memory (then a poll reads it back from results.jsonl).",
)
@click.option("--grace", type=click.FloatRange(min=0), help="Seconds running rollouts get to finish after SIGTERM.")
@click.option(
    "--result-wait", type=click.FloatRange(min=0, min_open=True), help="The longest a result poll waits, in seconds."
)
@click.option("--progress-every", type=click.FloatRange(min=0, min_open=True), default=60.0, hidden=True)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="debug also logs every rollout's queued / running / grading.",
)
@click.option(
    "--traces",
    is_flag=True,
    help="Record every model call (prompt and generated token ids, logprobs) through a policy gateway in front "
    "of each request's policy; each result carries its trace (as a [traces] table does; needs osmosis-gateway).",
)
@click.option(
    "--watch-stdin",
    is_flag=True,
    help="Drain and stop when standard input reaches end-of-file, as on SIGTERM: for a server another process "
    "starts with a pipe as its stdin (a trainer's script, a test), so it never outlives that process (kill -9 too).",
)
def serve(
    config_file: Path | None,
    host: str | None,
    port: int | None,
    token_env: str | None,
    no_auth: bool,
    max_queued: int | None,
    lease_timeout: float | None,
    retention: float | None,
    grace: float | None,
    result_wait: float | None,
    progress_every: float,
    log_level: str,
    traces: bool,
    watch_stdin: bool,
    **flags: Any,
) -> None:
    """Serve a rollout to a trainer over HTTP (the osmosis-ai rollout protocol).

    CONFIG is a run config (see configs/training/); its [server] table and the flags say how to
    listen. A trainer submits rollouts (POST /rollout, each with its policy endpoint), polls their
    results or has them pushed, and cancels them; every finished rollout is also appended to the
    run folder's results.jsonl, like `osmosis run` writes it. Every route but /livez needs
    "Authorization: Bearer <token>": the token is read from OSMOSIS_SERVER_TOKEN (or --token-env),
    else generated into <run folder>/server-token. SIGTERM drains: new rollouts get 503, running
    ones get --grace seconds, the rest are cancelled, and every final status is recorded.

    \b
    Examples:
      osmosis serve configs/training/multiply-plain.toml
      osmosis serve configs/training/multiply-plain.toml --host 0.0.0.0 --port 8100 --workers 2
      OSMOSIS_SERVER_TOKEN=$(cat token) osmosis serve configs/training/multiply-plain.toml --output runs/train-1
    """
    import attrs

    from osmosis_core import ConfigError, OsmosisError, PolicyEndpoint
    from osmosis_core.frontend import (
        load_run,
        make_console,
        make_trace_gateway,
        policy_endpoint,
        signal_when_parent_gone,
        traces_enabled,
    )
    from osmosis_core.plugin import structure_table
    from osmosis_server.auth import is_loopback
    from osmosis_server.run_folder import RunFolder
    from osmosis_server.settings import DEFAULT_TOKEN_ENV, ServerSettings

    config, table = _read_config(config_file, flags)
    source = str(config.source or "<command line>")
    if traces:
        config.traces = {**config.traces, "enabled": True}
    traces_table = config.traces if traces_enabled(config.traces) else None
    if traces_table is not None:  # a missing plugin or a bad [traces] key stops here, not in every rollout
        make_trace_gateway(PolicyEndpoint("http://127.0.0.1/v1", config.policy.model), traces_table, source=source)
    settings = structure_table(table, ServerSettings, "$.server", source)
    overrides = {
        "host": host,
        "port": port,
        "token_env": token_env,
        "max_queued": max_queued,
        "lease_timeout_sec": lease_timeout,
        "retention_sec": retention,
        "grace_sec": grace,
        "result_wait_sec": result_wait,
    }
    changes: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    settings = attrs.evolve(settings, **changes)
    problems = settings.problems()
    if problems:
        raise ConfigError(source, problems)
    if no_auth and not is_loopback(settings.host):
        raise click.ClickException(
            f"refusing to serve {settings.host} without a token: --no-auth is for loopback addresses only "
            "(drop --no-auth: a token is then read from the environment or generated)"
        )
    token: str | None = None
    if not no_auth:
        variable = settings.token_env or DEFAULT_TOKEN_ENV
        token = os.environ.get(variable) or None
        if token is None and settings.token_env:
            raise ConfigError(source, [f"the environment variable {variable} is not set @ $.server.token_env"])
    # the [policy] defaults of every request (each request's chat_completions_url is its base_url)
    policy = policy_endpoint(config)

    _logging(log_level)
    console = make_console()
    run = load_run(config)
    rollout = run.rollout
    if config.run.output:
        run_dir = config.resolve(config.run.output)
        assert run_dir is not None
    else:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = config.root / "runs" / f"{config.name}-serve-{stamp}"
    folder = RunFolder(
        run_dir,
        meta={
            "config": str(config.source) if config.source else None,
            "backend": config.run.backend,
            "rollout": str(rollout.rollout_dir or ""),
            "host": settings.host,
            "port": settings.port,
        },
        secrets=[token, *policy.secrets()],
    )
    from osmosis_server.serving import bind

    sock = bind(settings.host, settings.port)  # before anything is built: a taken port is one line
    folder.open()
    try:
        backend = run.build_backend(run_dir)
    except BaseException:
        folder.close()
        sock.close()
        raise
    from osmosis_server.app import create_app
    from osmosis_server.serving import serve as serve_app

    try:
        app = create_app(
            backend,
            settings=settings,
            run_folder=folder,
            token=token,
            auth=not no_auth,
            policy=policy,
            agent_timeout_sec=config.run.agent_timeout_sec,
            grader_timeout_sec=config.run.grader_timeout_sec,
            configure_logging=False,
            traces=traces_table,
            traces_source=source,
        )
    except ValueError as exc:
        folder.close()
        sock.close()
        raise OsmosisError(str(exc)) from None
    service = app.state.service
    limit = f"up to {service.slots} at once" if service.slots else "no backend limit"
    console.print(
        f"osmosis serve: rollout {rollout.rollout_dir or rollout.workflow_class.__name__} on backend "
        f"{config.run.backend!r} ({limit}, {settings.max_queued} more queued); results in {folder.results_path}",
        soft_wrap=True,
        markup=False,
    )

    def listening(url: str) -> None:
        # what start-up built (imports, the app, the backend) lives as long as the server: the
        # collections its rollouts cause need not scan it (bench/server_throughput.py at 100 ms)
        gc.freeze()
        if no_auth:
            how = "no token (loopback only)"
        elif token is not None:
            how = f"send Authorization: Bearer ${settings.token_env or DEFAULT_TOKEN_ENV}"
        else:
            how = f"send Authorization: Bearer $(cat {run_dir / 'server-token'})"
        console.print(
            f"listening on {url}  (auth: {how}; SIGTERM drains, Ctrl-C twice stops now)", soft_wrap=True, markup=False
        )
        sys.stdout.flush()
        if watch_stdin:  # now that SIGTERM drains (a parent already gone is seen at once)
            signal_when_parent_gone()

    progress = _ProgressTeller(lambda final: run.tell_progress(run_dir, final=final))
    progress.start(folder.results_path, progress_every)
    try:
        serve_app(app, sock=sock, on_listening=listening, log_level="warning" if log_level != "debug" else "info")
    except OsmosisError:
        raise
    finally:
        progress.stop()
        folder.close()
    progress.tell(final=True)  # report.html, dashboards
    console.print(f"stopped; results in {folder.results_path}", soft_wrap=True, markup=False)


class _ProgressTeller:
    """Tells the plugins' ``osmosis_run_progress`` hooks how a long-running server stands: every
    ``every`` seconds in which results came in, from a thread of its own (a hook may take seconds),
    and once when it stops. Each look reads the run folder's ``results.jsonl``; a server that has
    recorded millions of rollouts waits at least twenty times as long as the last look took, so the
    looks never take more than a twentieth of a core."""

    def __init__(self, tell: Callable[[bool], None]) -> None:
        self._tell = tell
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tell(self, *, final: bool) -> None:
        self._tell(final)

    def start(self, results: Path, every: float) -> None:
        def loop() -> None:
            seen: tuple[int, int] | None = None
            wait = every
            while not self._stop.wait(wait):
                try:
                    stat = results.stat()
                except OSError:
                    continue
                if (stat.st_size, stat.st_mtime_ns) == seen:
                    continue  # nothing new since the last look
                seen = (stat.st_size, stat.st_mtime_ns)
                started = time.monotonic()
                self._tell(False)
                wait = max(every, 20 * (time.monotonic() - started))

        self._thread = threading.Thread(target=loop, name="osmosis-serve-progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def _logging(level: str) -> None:
    logger = logging.getLogger("osmosis_server")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s osmosis-server: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def _read_config(config_file: Path | None, flags: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The run config (read by the core, flags applied, as ``osmosis run`` reads it) and its ``[server]`` table."""
    from osmosis_core.frontend import resolve_config

    config = resolve_config(config_file, flags)
    return config, dict(config.server)
