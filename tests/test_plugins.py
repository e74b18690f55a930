"""Tests of the plugin registry and ``osmosis plugins``.

Everything is real: built-ins registered through the hooks, in-process plugins registered on a
fresh :class:`PluginRegistry`, and a fake *installed* distribution (a ``.dist-info`` folder with
``entry_points.txt``) that ``importlib.metadata`` finds on ``sys.path`` / ``PYTHONPATH``, loaded
both in-process and by subprocesses of the ``osmosis`` console script.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pluggy
import pytest
from click.testing import CliRunner

import osmosis_core
from osmosis_core._engine.registry import PluginRegistry
from osmosis_core.backend import BackendSpec
from osmosis_core.errors import PluginError
from osmosis_core.hookspecs import hookimpl
from osmosis_core.templates import GraderSpec, TemplateSpec

OSMOSIS = Path(sys.executable).parent / "osmosis"
FAKE_MODULES = ("osmosis_fake_plugin", "osmosis_broken_plugin")
REGISTER_HOOKS = (
    "osmosis_register_backends",
    "osmosis_register_commands",
    "osmosis_register_graders",
    "osmosis_register_templates",
)


def _plugin(name: str, **hooks: Any) -> types.ModuleType:
    """A module-like plugin object whose attributes are ``@hookimpl`` functions."""
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        setattr(module, hook_name, hookimpl(function))
    return module


def _backends(*names: str) -> Any:
    return lambda: [BackendSpec(n, "osmosis_core._engine.builtin:local_backend") for n in names]


# -- the core's built-ins --------------------------------------------------------------------------


def test_builtin_core_plugin_registers_through_the_hooks(osmosis_registry: PluginRegistry) -> None:
    (core,) = osmosis_registry.plugins
    assert core.name == "core"
    assert core.status == "active"
    assert core.builtin is True
    assert core.distribution == "osmosis-core"
    assert core.version == osmosis_core.__version__
    assert core.module == "osmosis_core._engine.builtin"
    assert core.hooks == ("osmosis_register_backends", "osmosis_register_templates")
    assert core.error is None
    assert core.to_json()["hooks"] == list(core.hooks)

    assert "local" in [b.name for b in osmosis_registry.backends()]
    local = osmosis_registry.backend("local")
    assert local.factory == "osmosis_core._engine.builtin:local_backend"
    assert callable(local.resolve_factory())
    assert local.resolve_config_type() is None  # local takes no [backend.local] settings
    assert local.description

    assert "multiply-plain" in [t.name for t in osmosis_registry.templates()]
    template = osmosis_registry.template("multiply-plain")
    assert template.description
    assert Path("rollouts/multiply-plain/main.py") in template.files()


def test_names_are_normalised(osmosis_registry: PluginRegistry) -> None:
    assert osmosis_registry.backend(" LOCAL ").name == "local"
    assert osmosis_registry.template("multiply_plain").name == "multiply-plain"


# -- in-process plugins ----------------------------------------------------------------------------


class EchoGrader:
    """A stand-in grader class registered by the in-process plugin."""


class EchoPlugin:
    """A class used as a plugin: its attributes are ``@hookimpl`` functions (no ``self``)."""

    @staticmethod
    @hookimpl
    def osmosis_register_backends() -> list[BackendSpec]:
        return [BackendSpec("echo", "osmosis_core._engine.builtin:local_backend", description="Echoes.")]

    @staticmethod
    @hookimpl
    def osmosis_register_templates() -> list[TemplateSpec]:
        return [TemplateSpec("echo-local", EchoPlugin.template_root, description="An echo rollout.")]

    @staticmethod
    @hookimpl
    def osmosis_register_graders() -> list[GraderSpec]:
        return [
            GraderSpec("echo-exact", EchoGrader, description="Exact match."),
            GraderSpec("echo-path", "osmosis_core.templates:GraderSpec", description="By import path."),
        ]

    @staticmethod
    @hookimpl
    def osmosis_register_commands(cli: click.Group) -> None:
        @cli.command("echo-hello")
        @click.option("--name", default="world")
        def echo_hello(name: str) -> None:
            """Say hello."""
            click.echo(f"hello {name}")

    template_root = Path(".")


def test_in_process_plugin_adds_backend_template_grader_and_command(
    osmosis_registry: PluginRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "hello.txt").write_text("hi\n")
    monkeypatch.setattr(EchoPlugin, "template_root", tmp_path / "tpl")
    assert [b.name for b in osmosis_registry.backends()] == ["local"]  # fills the cache

    info = osmosis_registry.register(EchoPlugin, "echo")
    osmosis_registry.check_pending()

    assert info.status == "active"
    assert info.distribution == "(in-process)"
    assert info.hooks == REGISTER_HOOKS
    assert info.module == "EchoPlugin"
    assert osmosis_registry.plugins[-1] is info

    # register() dropped the cached collection, so the new backend is seen
    assert [b.name for b in osmosis_registry.backends()] == ["echo", "local"]
    assert osmosis_registry.backend("echo").description == "Echoes."
    assert {t.name for t in osmosis_registry.templates()} == {"echo-local", "multiply-plain"}
    assert osmosis_registry.template("echo-local").files() == [Path("hello.txt")]
    assert [g.name for g in osmosis_registry.graders()] == ["echo-exact", "echo-path"]
    assert osmosis_registry.grader("echo_exact").resolve() is EchoGrader
    assert osmosis_registry.grader("echo-path").resolve() is GraderSpec
    assert osmosis_registry.conflicts() == []

    # make_cli() adds to the process-wide root group, so build a fresh group instead
    group = click.Group("osmosis")
    osmosis_registry.add_commands(group)
    assert "echo-hello" in group.commands
    result = CliRunner().invoke(group, ["echo-hello", "--name", "osmosis"])
    assert result.exit_code == 0, result.output
    assert result.output == "hello osmosis\n"


def test_module_like_plugin(osmosis_registry: PluginRegistry) -> None:
    plugin = _plugin("osmosis_modlike", osmosis_register_backends=_backends("mod-a", "mod-b"))
    info = osmosis_registry.register(plugin, "modlike", distribution="osmosis-modlike")
    assert info.module == "osmosis_modlike"
    assert info.distribution == "osmosis-modlike"
    assert info.hooks == ("osmosis_register_backends",)
    assert [b.name for b in osmosis_registry.backends()] == ["local", "mod-a", "mod-b"]


def test_registering_the_same_name_twice_is_reported(
    osmosis_registry: PluginRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    osmosis_registry.register(_plugin("a", osmosis_register_backends=_backends("a")), "same")
    with caplog.at_level(logging.WARNING, logger="osmosis.plugins"):
        info = osmosis_registry.register(_plugin("b", osmosis_register_backends=_backends("b")), "same")
    assert info.status == "failed"
    assert info.error is not None
    assert "same" in info.error
    assert any("'same'" in r.getMessage() for r in caplog.records)
    assert [b.name for b in osmosis_registry.backends()] == ["a", "local"]


# -- duplicates and unknown names ------------------------------------------------------------------


def test_duplicate_backend_names_are_reported_with_both_distributions(
    osmosis_registry: PluginRegistry,
) -> None:
    osmosis_registry.register(
        _plugin("pa", osmosis_register_backends=_backends("dup")), "plugin-a", distribution="osmosis-a"
    )
    osmosis_registry.register(
        _plugin("pb", osmosis_register_backends=_backends("DUP")), "plugin-b", distribution="osmosis-b"
    )

    with pytest.raises(PluginError) as excinfo:
        osmosis_registry.backend("dup")
    message = str(excinfo.value)
    for part in ("'dup'", "plugin-a", "osmosis-a", "plugin-b", "osmosis-b", "OSMOSIS_DISABLE_PLUGINS"):
        assert part in message

    assert osmosis_registry.conflicts() == ["backend 'dup' is provided by: plugin-a (osmosis-a), plugin-b (osmosis-b)"]
    # the listing shows each name once, and other names still resolve
    assert [b.name for b in osmosis_registry.backends()] == ["dup", "local"]
    assert osmosis_registry.backend("local").name == "local"


def test_duplicate_template_and_grader_names_are_listed(osmosis_registry: PluginRegistry) -> None:
    dup_template = _plugin("pt", osmosis_register_templates=lambda: [TemplateSpec("multiply-plain", Path("."))])
    graders = [lambda: [GraderSpec("g", EchoGrader)], lambda: [GraderSpec("G", EchoGrader)]]
    osmosis_registry.register(dup_template, "tpl", distribution="osmosis-tpl")
    for i, hook in enumerate(graders):
        osmosis_registry.register(_plugin(f"g{i}", osmosis_register_graders=hook), f"g{i}")
    assert osmosis_registry.conflicts() == [
        "template 'multiply-plain' is provided by: core (osmosis-core), tpl (osmosis-tpl)",
        "grader 'g' is provided by: g0 ((in-process)), g1 ((in-process))",
    ]
    with pytest.raises(PluginError, match="more than one plugin"):
        osmosis_registry.template("multiply-plain")
    with pytest.raises(PluginError, match="more than one plugin"):
        osmosis_registry.grader("g")


def test_unknown_names_list_the_known_ones(osmosis_registry: PluginRegistry) -> None:
    osmosis_registry.register(_plugin("x", osmosis_register_backends=_backends("extra")), "x")
    with pytest.raises(PluginError, match=r"unknown backend 'nope'; known backends: extra, local$"):
        osmosis_registry.backend("nope")
    with pytest.raises(PluginError, match=r"unknown template 'nope'.*multiply-plain"):
        osmosis_registry.template("nope")
    with pytest.raises(PluginError, match=r"unknown grader 'nope'; known graders: none"):
        osmosis_registry.grader("nope")


# -- broken plugins --------------------------------------------------------------------------------


def test_misspelt_hook_is_caught_by_check_pending(osmosis_registry: PluginRegistry) -> None:
    osmosis_registry.check_pending()  # the built-ins are fine
    typo = _plugin("typo", osmosis_register_backend=_backends("never"))  # missing "s"
    osmosis_registry.register(typo, "typo")
    with pytest.raises(pluggy.PluginValidationError, match="osmosis_register_backend"):
        osmosis_registry.check_pending()
    assert "never" not in [b.name for b in osmosis_registry.backends()]


def test_hookimpl_with_wrong_arguments_fails_to_register(
    osmosis_registry: PluginRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    bad = _plugin("bad", osmosis_register_backends=lambda extra: [])
    with caplog.at_level(logging.WARNING, logger="osmosis.plugins"):
        info = osmosis_registry.register(bad, "bad-args")
    assert info.status == "failed"
    assert info.error is not None
    assert info.error.startswith("PluginValidationError")
    assert any("bad-args" in r.getMessage() for r in caplog.records)
    assert [b.name for b in osmosis_registry.backends()] == ["local"]


def test_plugin_failing_validation_contributes_nothing(osmosis_registry: PluginRegistry) -> None:
    # a valid backends hook, then a commands hook with an argument the spec does not have
    half = _plugin(
        "half", osmosis_register_backends=_backends("half"), osmosis_register_commands=lambda cli, extra: None
    )
    info = osmosis_registry.register(half, "half")
    assert info.status == "failed"
    assert "extra" in (info.error or "")
    assert osmosis_registry.pm.get_plugin("half") is None
    assert [b.name for b in osmosis_registry.backends()] == ["local"]


def test_conflict_names_the_distribution_of_the_active_plugin(osmosis_registry: PluginRegistry) -> None:
    first = osmosis_registry.register(
        _plugin("a", osmosis_register_backends=_backends("dup")), "same", distribution="dist-a"
    )
    second = osmosis_registry.register(
        _plugin("b", osmosis_register_backends=_backends("other")), "same", distribution="dist-b"
    )
    osmosis_registry.register(_plugin("c", osmosis_register_backends=_backends("dup")), "c", distribution="dist-c")
    assert (first.status, second.status) == ("active", "failed")
    assert osmosis_registry.conflicts() == ["backend 'dup' is provided by: same (dist-a), c (dist-c)"]


def test_plugin_raising_in_a_hook_is_reported_as_failed_and_skipped(
    osmosis_registry: PluginRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    def explode() -> list[BackendSpec]:
        raise RuntimeError("boom in backends")

    def explode_commands(cli: click.Group) -> None:
        cli.add_command(click.Command("half-added"))
        raise RuntimeError("boom in commands")

    def good_commands(cli: click.Group) -> None:
        cli.add_command(click.Command("good-cmd", callback=lambda: click.echo("good")))

    with caplog.at_level(logging.WARNING, logger="osmosis.plugins"):
        bad = osmosis_registry.register(_plugin("bad", osmosis_register_backends=explode), "bad")
        osmosis_registry.register(_plugin("noisy", osmosis_register_commands=explode_commands), "noisy")
        good = osmosis_registry.register(
            _plugin("good", osmosis_register_backends=_backends("good"), osmosis_register_commands=good_commands),
            "good",
        )
        names = [b.name for b in osmosis_registry.backends()]
        group = click.Group("osmosis")
        osmosis_registry.add_commands(group)
    assert names == ["good", "local"]
    assert list(group.commands) == ["good-cmd"]  # nothing half-added by the failing plugin
    records = {p.name: p for p in osmosis_registry.plugins}
    assert (bad.status, records["bad"].status) == ("failed", "failed")
    assert records["bad"].error == "osmosis_register_backends failed: RuntimeError: boom in backends"
    assert records["noisy"].status == "failed"
    assert "boom in commands" in (records["noisy"].error or "")
    assert good.status == "active"
    assert records["good"].provides == {"backends": ("good",), "commands": ("good-cmd",)}
    assert osmosis_registry.provider_of("backend", "good").name == "good"  # type: ignore[union-attr]
    assert osmosis_registry.provider_of("backend", "nobody's") is None
    with pytest.raises(ValueError, match="kind must be one of backend, grader, template, got 'backends'"):
        osmosis_registry.provider_of("backends", "good")
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'bad'" in m and "osmosis_register_backends" in m and "boom in backends" in m for m in messages)
    assert any("'noisy'" in m and "boom in commands" in m for m in messages)
    assert CliRunner().invoke(group, ["good-cmd"]).output == "good\n"


@pytest.mark.parametrize(
    ("returned", "problem"),
    [
        ("local", "must return a list of BackendSpec, got str"),
        ([{"name": "x"}], "must return a list of BackendSpec, got an item {'name': 'x'}"),
        ([BackendSpec("", "a.b:C")], "returned a BackendSpec without a name"),
        ([BackendSpec("x", 42)], "backend 'x' has a factory that is neither callable nor an import path: 42"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_registration_fails_the_plugin(
    osmosis_registry: PluginRegistry, returned: Any, problem: str
) -> None:
    info = osmosis_registry.register(_plugin("odd", osmosis_register_backends=lambda: returned), "odd")
    assert info.status == "failed", info.error
    assert problem in (info.error or ""), info.error
    assert [b.name for b in osmosis_registry.backends()] == ["local"]
    assert info.to_json()["status"] == "failed"


def test_a_backend_factory_that_cannot_take_a_setup_names_the_plugin_and_the_factory(
    osmosis_registry: PluginRegistry, tmp_path: Path
) -> None:
    from osmosis_core._engine.config import config_from_dict
    from osmosis_core._engine.loader import load_rollout
    from osmosis_core._engine.runner import build_backend

    def no_arguments() -> None:
        return None

    osmosis_registry.register(
        _plugin(
            "factories",
            osmosis_register_backends=lambda: [
                BackendSpec("wrong-signature", no_arguments),
                BackendSpec("missing", "osmosis_nowhere.backend:Backend"),
                BackendSpec("not-a-backend", lambda setup: object()),
            ],
        ),
        "factories",
        distribution="osmosis-factories",
    )
    rollout_dir = Path(__file__).resolve().parent.parent / "rollouts" / "multiply-plain"
    for name, message in (
        (
            "wrong-signature",
            "its factory '"
            "test_a_backend_factory_that_cannot_take_a_setup_names_the_plugin_and_the_factory.<locals>.no_arguments"
            "' cannot be called with a BackendSetup",
        ),
        ("missing", "cannot import its factory 'osmosis_nowhere.backend:Backend': ModuleNotFoundError"),
        ("not-a-backend", "returned object, not an ExecutionBackend"),
    ):
        config = config_from_dict({"rollout": {"path": str(rollout_dir)}, "run": {"backend": name}}, root=tmp_path)
        with pytest.raises(PluginError) as info:
            build_backend(config, load_rollout(config, osmosis_registry), osmosis_registry, None)
        assert f"backend {name!r} of plugin 'factories' (osmosis-factories)" in str(info.value)
        assert message in str(info.value)


# -- a fake installed distribution (real entry points) ---------------------------------------------

FAKE_PLUGIN = '''\
"""A plugin shipped by the fake distribution osmosis-fake."""

import click

from osmosis_core.backend import BackendSpec
from osmosis_core.hookspecs import hookimpl


@hookimpl
def osmosis_register_backends():
    return [BackendSpec("fake", "osmosis_core._engine.builtin:local_backend",
                        description="A fake backend from osmosis-fake.")]


@hookimpl
def osmosis_register_commands(cli):
    @cli.command("fake-hello")
    def fake_hello():
        """Say hello from the fake plugin."""
        click.echo("hello from osmosis-fake")
'''

BROKEN_PLUGIN = 'raise ImportError("osmosis_broken_plugin needs the frobnicator package")\n'


def _write_dist(site: Path, dist: str, name: str, version: str, entry_points: str) -> None:
    info = site / f"{dist}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def fake_site(tmp_path: Path) -> Iterator[Path]:
    """A folder that looks like site-packages holding osmosis-fake 1.2.3 and its two modules."""
    site = tmp_path / "site"
    _write_dist(
        site,
        "osmosis_fake",
        "osmosis-fake",
        "1.2.3",
        "[osmosis]\nfake = osmosis_fake_plugin\nbroken = osmosis_broken_plugin\n",
    )
    (site / "osmosis_fake_plugin.py").write_text(FAKE_PLUGIN)
    (site / "osmosis_broken_plugin.py").write_text(BROKEN_PLUGIN)
    yield site
    for module in FAKE_MODULES:
        sys.modules.pop(module, None)


@pytest.fixture
def fake_on_path(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake distribution on this process's sys.path (for in-process registries)."""
    monkeypatch.syspath_prepend(str(fake_site))
    importlib.invalidate_caches()
    return fake_site


def _by_name(plugins: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in plugins}


def test_entry_points_in_process(fake_on_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="osmosis.plugins"):
        registry = PluginRegistry(env={})
    plugins = _by_name([p.to_json() for p in registry.plugins])
    assert plugins["core"]["status"] == "active"
    fake = plugins["fake"]
    assert fake["status"] == "active"
    assert (fake["distribution"], fake["version"], fake["module"]) == (
        "osmosis-fake",
        "1.2.3",
        "osmosis_fake_plugin",
    )
    assert fake["hooks"] == ["osmosis_register_backends", "osmosis_register_commands"]
    assert fake["builtin"] is False
    broken = plugins["broken"]
    assert broken["status"] == "failed"
    assert broken["error"] == "ImportError: osmosis_broken_plugin needs the frobnicator package"
    assert broken["hooks"] == []

    warnings = [r.getMessage() for r in caplog.records if "'broken'" in r.getMessage()]
    assert len(warnings) == 1
    for part in ("osmosis-fake 1.2.3", "frobnicator", "OSMOSIS_DISABLE_PLUGINS=broken"):
        assert part in warnings[0]

    assert registry.backend("fake").description == "A fake backend from osmosis-fake."
    assert registry.backend("local").name == "local"
    group = click.Group("osmosis")
    registry.add_commands(group)
    assert CliRunner().invoke(group, ["fake-hello"]).output == "hello from osmosis-fake\n"


@pytest.mark.parametrize(
    ("env", "fake_status", "broken_status"),
    [
        ({"OSMOSIS_DISABLE_PLUGINS": "broken"}, "active", "disabled"),
        ({"OSMOSIS_DISABLE_PLUGINS": " broken , fake "}, "disabled", "disabled"),
        ({"OSMOSIS_LOAD_PLUGINS": "fake"}, "active", "disabled"),
        ({"OSMOSIS_LOAD_PLUGINS": ""}, "disabled", "disabled"),
        ({"OSMOSIS_LOAD_PLUGINS": "fake,broken", "OSMOSIS_DISABLE_PLUGINS": "broken"}, "active", "disabled"),
    ],
)
def test_entry_point_switches_in_process(
    fake_on_path: Path,
    caplog: pytest.LogCaptureFixture,
    env: dict[str, str],
    fake_status: str,
    broken_status: str,
) -> None:
    with caplog.at_level(logging.WARNING, logger="osmosis.plugins"):
        registry = PluginRegistry(env=env)
    plugins = _by_name([p.to_json() for p in registry.plugins])
    assert plugins["core"]["status"] == "active"
    assert plugins["fake"]["status"] == fake_status
    assert plugins["broken"]["status"] == broken_status
    assert plugins["broken"]["error"] is None
    assert plugins["broken"]["distribution"] == "osmosis-fake"  # still reported, with its dist
    assert not [r for r in caplog.records if "broken" in r.getMessage()]
    if fake_status == "disabled":
        with pytest.raises(PluginError, match=r"known backends: (\w+, )*local"):
            registry.backend("fake")
    if env.get("OSMOSIS_LOAD_PLUGINS") == "":
        assert [p.name for p in registry.plugins if p.status == "active"] == ["core"]


def test_same_entry_point_name_from_two_distributions(fake_on_path: Path) -> None:
    _write_dist(
        fake_on_path,
        "osmosis_fake_fork",
        "osmosis-fake-fork",
        "0.0.1",
        "[osmosis]\nfake = osmosis_fake_plugin\n",
    )
    importlib.invalidate_caches()
    registry = PluginRegistry(env={"OSMOSIS_DISABLE_PLUGINS": "broken"})
    fakes = [p for p in registry.plugins if p.name == "fake"]
    assert len(fakes) == 2
    assert sorted(p.status for p in fakes) == ["active", "failed"]
    failed = next(p for p in fakes if p.status == "failed")
    assert failed.error is not None
    assert "also provided by" in failed.error
    assert "uninstall one" in failed.error
    assert registry.backend("fake").name == "fake"  # registered once, no conflict


def test_conflict_after_same_entry_point_name_names_the_loaded_distribution(fake_on_path: Path) -> None:
    _write_dist(
        fake_on_path,
        "osmosis_fake_fork",
        "osmosis-fake-fork",
        "0.0.1",
        "[osmosis]\nfake = osmosis_fake_plugin\n",
    )
    importlib.invalidate_caches()
    registry = PluginRegistry(env={"OSMOSIS_DISABLE_PLUGINS": "broken"})
    active = next(p for p in registry.plugins if p.name == "fake" and p.status == "active")
    rejected = next(p for p in registry.plugins if p.name == "fake" and p.status == "failed")
    registry.register(
        _plugin("other", osmosis_register_backends=_backends("fake")), "other", distribution="osmosis-other"
    )
    with pytest.raises(PluginError) as excinfo:
        registry.backend("fake")
    assert f"fake ({active.distribution} {active.version})" in str(excinfo.value)
    assert f"({rejected.distribution} {rejected.version})" not in str(excinfo.value)


# -- the osmosis CLI, as a subprocess --------------------------------------------------------------


def _osmosis(*args: str, pythonpath: Path | None = None, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_") and k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    env.update(extra_env)
    return subprocess.run([str(OSMOSIS), *args], capture_output=True, text=True, env=env, timeout=60, check=False)


def test_osmosis_console_script_exists() -> None:
    assert OSMOSIS.is_file(), f"no osmosis console script next to {sys.executable}"


def test_cli_plugins_json_with_fake_distribution(fake_site: Path) -> None:
    proc = _osmosis("plugins", "--json", pythonpath=fake_site)
    assert proc.returncode == 0, proc.stderr
    plugins = _by_name(json.loads(proc.stdout))  # stdout is pure JSON, warnings go to stderr
    assert plugins["core"]["status"] == "active"
    assert plugins["core"]["distribution"] == "osmosis-core"
    fake = plugins["fake"]
    assert fake["status"] == "active"
    assert "osmosis_register_backends" in fake["hooks"]
    assert (fake["distribution"], fake["version"]) == ("osmosis-fake", "1.2.3")
    broken = plugins["broken"]
    assert broken["status"] == "failed"
    assert "ImportError" in broken["error"]
    assert "frobnicator" in broken["error"]
    assert "'broken'" in proc.stderr
    assert "OSMOSIS_DISABLE_PLUGINS=broken" in proc.stderr
    assert "frobnicator" in proc.stderr


@pytest.mark.parametrize(
    ("env", "active_external", "disabled"),
    [
        ({"OSMOSIS_DISABLE_PLUGINS": "broken"}, {"fake"}, {"broken"}),
        ({"OSMOSIS_LOAD_PLUGINS": "fake"}, {"fake"}, {"broken"}),
        ({"OSMOSIS_LOAD_PLUGINS": ""}, set(), {"fake", "broken"}),
    ],
)
def test_cli_plugins_json_switches(
    fake_site: Path, env: dict[str, str], active_external: set[str], disabled: set[str]
) -> None:
    proc = _osmosis("plugins", "--json", pythonpath=fake_site, **env)
    assert proc.returncode == 0, proc.stderr
    plugins = json.loads(proc.stdout)
    ours = {"core", "fake", "broken"}  # other installed plugins (strands, harbor, ...) are not this test's
    active = {p["name"] for p in plugins if p["status"] == "active" and p["name"] in ours}
    assert active == {"core"} | active_external
    by_name = _by_name(plugins)
    assert {n for n in disabled if by_name[n]["status"] == "disabled"} == disabled
    assert not [p for p in plugins if p["status"] == "failed"]
    assert "broken" not in proc.stderr


def test_cli_plugins_table_with_fake_distribution(fake_site: Path) -> None:
    proc = _osmosis("plugins", pythonpath=fake_site)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DISTRIBUTION", "VERSION", "STATUS", "PROVIDES"]
    rows = {line.split()[0]: line.split(maxsplit=4) for line in lines[1:]}
    assert rows["core"][1:4] == ["osmosis-core", osmosis_core.__version__, "active"]
    assert rows["core"][4] == "backends local; templates multiply-plain"
    assert rows["fake"] == ["fake", "osmosis-fake", "1.2.3", "active", "backends fake; commands fake-hello"]
    assert rows["broken"] == ["broken", "osmosis-fake", "1.2.3", "failed", "-"]
    assert "broken: ImportError: osmosis_broken_plugin needs the frobnicator package" in proc.stderr


def test_cli_gets_a_plugin_command_from_an_entry_point(fake_site: Path) -> None:
    help_proc = _osmosis("--help", pythonpath=fake_site)
    assert help_proc.returncode == 0, help_proc.stderr
    assert "fake-hello" in help_proc.stdout
    proc = _osmosis("fake-hello", pythonpath=fake_site, OSMOSIS_DISABLE_PLUGINS="broken")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hello from osmosis-fake\n"
    assert proc.stderr == ""
    gone = _osmosis("fake-hello", pythonpath=fake_site, OSMOSIS_DISABLE_PLUGINS="fake,broken")
    assert gone.returncode == 2
    assert "fake-hello" in gone.stderr


@pytest.mark.parametrize("args", [("plugins",), ("plugins", "--json"), ("--help",), ("plugins", "--help")])
def test_cli_commands_exit_zero(args: tuple[str, ...]) -> None:
    proc = _osmosis(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout


def test_cli_help_lists_core_commands() -> None:
    proc = _osmosis("--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("run", "validate", "plugins", "template"):
        assert f"  {command}" in proc.stdout
    assert "core" in _osmosis("plugins").stdout


def test_a_first_party_command_without_its_plugin_says_what_to_install(osmosis_exe, clean_env, tmp_path):
    """``osmosis migrate`` and ``osmosis serve`` live in plugins; without them the CLI names the package."""
    env = clean_env | {"OSMOSIS_LOAD_PLUGINS": ""}  # no external plugin, as with the core alone
    for command, dist in (("migrate", "osmosis-migrate"), ("serve", "osmosis-server")):
        r = subprocess.run([osmosis_exe, command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert f"`osmosis {command}` comes with {dist}: pip install {dist}" in r.stderr, r.stderr
