"""The ``osmosis_run_progress`` hook: plugins hear a run while it goes and once at its end, and a
hook that raises never fails the run. Also what ``osmosis report`` says when its plugin is missing."""

from __future__ import annotations

import functools
import logging
import subprocess
import threading

import anyio

from osmosis_core import PolicyEndpoint
from osmosis_core._engine.config import load_config
from osmosis_core._engine.runner import execute_run, prepare_run
from osmosis_core.plugin import hookimpl
from osmosis_core.testing import ScriptedPolicyServer


class Listener:
    def __init__(self) -> None:
        self.heard: list = []
        self.threads: set[str] = set()

    @hookimpl
    def osmosis_run_progress(self, progress):
        self.threads.add(threading.current_thread().name)
        self.heard.append(progress)


class Raiser:
    calls = 0

    @hookimpl
    def osmosis_run_progress(self, progress):
        Raiser.calls += 1
        raise RuntimeError("the dashboard is down")


def run_with(workspace, registry, *, latency: float, every: float):
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    config.run.output, config.run.concurrency = str(workspace / "out"), 2
    config.report["enabled"] = True  # a plugin's table reaches it through the config
    with ScriptedPolicyServer(latency=latency) as server:
        plan = prepare_run(config, policy_override=PolicyEndpoint(server.url, "m"), registry=registry)
        outcome = anyio.run(functools.partial(execute_run, plan, handle_signals=False, progress_every=every))
    return outcome


def test_plugins_hear_the_run_while_it_goes_and_once_at_its_end(workspace, osmosis_registry):
    listener = Listener()
    osmosis_registry.register(listener, "listener")
    outcome = run_with(workspace, osmosis_registry, latency=0.05, every=0.1)
    finals = [p for p in listener.heard if p.final]
    during = [p for p in listener.heard if not p.final]
    assert len(finals) == 1
    assert listener.heard[-1] is finals[0]
    assert finals[0].summary == outcome.summary
    assert finals[0].run_dir == workspace / "out"
    assert finals[0].kind == "run"
    assert finals[0].config.report == {"enabled": True}
    assert during, "no progress was heard during a run of several seconds"
    assert all(0 < p.summary.finished < 20 or p.summary.finished == 20 for p in during)
    assert during[0].summary.finished < 20
    assert not during[0].summary.interrupted
    assert "MainThread" not in listener.threads  # never on the event loop's thread


def test_a_hook_that_raises_is_logged_once_and_the_run_and_other_plugins_go_on(workspace, osmosis_registry, caplog):
    listener = Listener()
    osmosis_registry.register(Raiser(), "raiser")
    osmosis_registry.register(listener, "listener")
    with caplog.at_level(logging.WARNING, logger="osmosis.plugins"):
        outcome = run_with(workspace, osmosis_registry, latency=0.05, every=0.1)
    assert outcome.summary.finished == 20
    assert not outcome.failing
    assert Raiser.calls >= 2
    assert any(p.final for p in listener.heard)
    logged = [r.getMessage() for r in caplog.records if "osmosis_run_progress" in r.getMessage()]
    assert len(logged) == 1
    assert "the dashboard is down" in logged[0]
    assert "'raiser'" in logged[0]


def test_a_run_without_listeners_builds_no_progress(workspace, osmosis_registry):
    assert not osmosis_registry.hears_progress()
    assert run_with(workspace, osmosis_registry, latency=0.0, every=0.01).summary.finished == 20


def test_osmosis_report_without_its_plugin_says_what_to_install(workspace, osmosis_exe, clean_env):
    env = {**clean_env, "OSMOSIS_DISABLE_PLUGINS": "report"}  # as if osmosis-report were not installed
    r = subprocess.run([osmosis_exe, "report", "runs/x"], cwd=workspace, env=env, capture_output=True, text=True)
    assert r.returncode == 2
    assert "`osmosis report` comes with osmosis-report: pip install osmosis-report" in r.stderr


class Writer:
    """A plugin that writes a page at the run's end and says where (as osmosis-report does)."""

    @hookimpl
    def osmosis_run_progress(self, progress):
        if progress.final:
            page = progress.run_dir / "page.html"
            page.write_text("<p>done</p>")
            return page
        return None


def test_the_files_hooks_wrote_at_the_end_are_named_in_the_summary(workspace, osmosis_registry):
    from rich.console import Console

    from osmosis_core.cli.display import print_summary

    osmosis_registry.register(Writer(), "pages")
    osmosis_registry.register(Listener(), "listener")  # returns None: names nothing
    outcome = run_with(workspace, osmosis_registry, latency=0.0, every=60)
    assert outcome.written == (("pages", workspace / "out" / "page.html"),)
    console = Console(record=True, width=200)
    print_summary(console, outcome.summary, outcome.run_dir, written=outcome.written)
    [row] = [line for line in console.export_text().splitlines() if "page.html" in line]
    assert [cell.strip() for cell in row.split("│")[1:3]] == ["pages", str(workspace / "out" / "page.html")]
