"""Public names of the last release keep working, with a warning, for one release (CHANGELOG.md).

A third-party plugin written against 0.1's documented API (``BackendSpec(name, factory=
"...:MyLocalBackend.from_setup")``) is installed as a real distribution (a ``.dist-info`` with an
entry point on ``PYTHONPATH``) and run through ``osmosis run``, as its users would.
"""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path

import pytest

from osmosis_core.deprecation import OsmosisDeprecationWarning

LEGACY_PLUGIN = '''
from osmosis_core import BackendSpec, LocalBackend, hookimpl


class LegacyLocalBackend(LocalBackend):
    """A backend as 0.1's plugin docs showed it: a LocalBackend subclass built by from_setup."""


@hookimpl
def osmosis_register_backends():
    return [BackendSpec("legacy", "osmosis_legacy_plugin:LegacyLocalBackend.from_setup", description="0.1 style")]
'''


def _install_legacy_plugin(site: Path) -> None:
    info = site / "osmosis_legacy-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: osmosis-legacy\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[osmosis]\nlegacy = osmosis_legacy_plugin\n")
    (site / "osmosis_legacy_plugin.py").write_text(LEGACY_PLUGIN)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_plugin_registering_local_backend_from_setup_still_runs(workspace, osmosis_exe, clean_env, workers):
    site = workspace / "site"
    _install_legacy_plugin(site)
    env = {**clean_env, "PYTHONPATH": str(site)}
    listed = subprocess.run([osmosis_exe, "plugins", "--json"], env=env, capture_output=True, text=True, timeout=60)
    legacy = [p for p in json.loads(listed.stdout) if p["name"] == "legacy"]
    assert legacy, listed.stdout
    assert legacy[0]["status"] == "active", listed.stdout
    args = ["configs/eval/multiply-plain.toml", "--stub-policy", "--backend", "legacy", "--limit", "3"]
    run = subprocess.run(
        [osmosis_exe, "run", *args, "--workers", workers, "--output", "out"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr
    results = [json.loads(line) for line in (workspace / "out" / "results.jsonl").read_text().splitlines()]
    assert len(results) == 3
    assert all(r["reward"] == 1.0 for r in results)
    # the CLI shows the deprecation once, naming the replacement
    assert "LegacyLocalBackend.from_setup is deprecated since osmosis 0.2.0" in run.stderr
    assert "osmosis_core.plugin:local_backend" in run.stderr


@pytest.mark.parametrize(
    ("module", "name", "new_home"),
    [
        ("osmosis_core", "LocalBackendConfig", None),
        ("osmosis_core.results", "result_line", "osmosis_core.wire"),
        ("osmosis_core.lazy", "lazy_exports", None),
        ("osmosis_core.runner", "build_backend", "osmosis_core._engine.runner"),
        ("osmosis_core.workers", "WorkerPool", "osmosis_core._engine.workers"),
        ("osmosis_core.plugins", "hookimpl", "osmosis_core.hookspecs"),
        ("osmosis_core.plugins.registry", "get_registry", "osmosis_core.plugin"),
        ("osmosis_core.plugins.builtin", "local_backend", "osmosis_core.plugin"),
        ("osmosis_core.plugins.hookspecs", "hookspec", "osmosis_core.hookspecs"),
        ("osmosis_core.plugin", "RunLock", "osmosis_core._engine.run_lock"),
        ("osmosis_core.plugin", "build_backend", "osmosis_core._engine.runner"),
        ("osmosis_core.plugin", "config_options", "osmosis_core.frontend"),
        ("osmosis_core.plugin", "latest_records", "osmosis_core.frontend"),
        ("osmosis_core.plugin", "http_request", "osmosis_core.http"),
        ("osmosis_core.plugin", "start_http_server", "osmosis_core.http"),
        ("osmosis_core.plugin", "result_to_json", "osmosis_core.wire"),
        ("osmosis_core.plugin", "chat_completion_problem", "osmosis_core.wire"),
        ("osmosis_core.plugin", "SAMPLING_PARAMS", "osmosis_core.sampling"),
        ("osmosis_core.plugin", "multiply_template", "osmosis_core.templates"),
        ("osmosis_core.plugin", "load_rollout", "osmosis_core.frontend"),
        ("osmosis_core.plugin", "current_rollout_context", "osmosis_core"),
        ("osmosis_core", "ExecutionBackend", "osmosis_core.plugin"),
        ("osmosis_core", "hookimpl", "osmosis_core.plugin"),
        ("osmosis_core.frontend", "http_scope", "osmosis_core.http"),
    ],
)
def test_moved_names_warn_and_are_the_same_object(module, name, new_home):
    import importlib

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(importlib.import_module(module), name)
        if name == "LocalBackendConfig":
            assert value(max_concurrent=2).max_concurrent == 2
        if name == "lazy_exports":
            getattr_, dir_ = value("json", {"dumps": "json"}, ["dumps"])
            assert getattr_("dumps") is json.dumps
            assert dir_() == ["dumps"]
    assert [w.category for w in caught] == [OsmosisDeprecationWarning]
    assert "deprecated since osmosis 0.2.0" in str(caught[0].message)
    if new_home is not None:
        assert value is getattr(importlib.import_module(new_home), name)


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("osmosis_core.plugin", "Rollout", "RolloutReporter"),
        ("osmosis_core.lifecycle", "Rollout", "RolloutReporter"),
    ],
)
def test_renamed_names_warn_naming_the_new_one_and_are_the_same_object(module, old, new):
    import importlib

    imported = importlib.import_module(module)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(imported, old)
    assert value is getattr(imported, new)
    assert [w.category for w in caught] == [OsmosisDeprecationWarning], caught
    assert f"{module}.{new}" in str(caught[0].message)
    assert f"`{old}`" in (Path(__file__).parents[1] / "CHANGELOG.md").read_text()


STUB_PACKAGE = """\
from {home} import attach_stub

__version__ = "0.1.0"
__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
"""


@pytest.mark.parametrize("home", ["osmosis_core.plugin", "osmosis_core.lazy"])
def test_a_package_on_0_1s_attach_stub_still_loads_lazily_and_warns_once_at_its_own_line(tmp_path, monkeypatch, home):
    import importlib
    import sys

    package = tmp_path / "stub_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(STUB_PACKAGE.format(home=home))
    (package / "__init__.pyi").write_text("from stub_pkg.parts import Part as Part\n\n__version__: str\n")
    (package / "parts.py").write_text("class Part:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("stub_pkg")]:
        monkeypatch.delitem(sys.modules, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stub_pkg = importlib.import_module("stub_pkg")
    assert [w.category for w in caught] == [OsmosisDeprecationWarning]
    assert "attach_stub is deprecated since osmosis 0.2.0" in str(caught[0].message)
    assert "use lazy_loader.attach(" in str(caught[0].message)
    assert caught[0].filename == str(package / "__init__.py")
    assert "stub_pkg.parts" not in sys.modules
    assert stub_pkg.__all__ == ["Part"]
    assert stub_pkg.Part is importlib.import_module("stub_pkg.parts").Part
    assert {"Part", "__version__"} <= set(dir(stub_pkg))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        stub_pkg.nope  # noqa: B018


def test_attach_stub_is_no_longer_in_the_plugin_api_but_still_there():
    import osmosis_core.plugin
    from osmosis_core.lazy import attach_stub

    assert "attach_stub" not in osmosis_core.plugin.__all__
    assert osmosis_core.plugin.attach_stub is attach_stub


def test_stub_exports_warns_and_reads_the_stub(tmp_path):
    from osmosis_core.lazy import stub_exports

    stub = tmp_path / "pkg.pyi"
    stub.write_text("from .mod import A as A\nfrom json import dumps as dumps\n")
    with pytest.warns(OsmosisDeprecationWarning, match="stub_exports is deprecated"):
        assert stub_exports(stub, "pkg") == {"A": "pkg.mod", "dumps": "json"}


def test_an_unknown_name_is_still_an_attribute_error():
    import osmosis_core.plugin
    import osmosis_core.results

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        osmosis_core.results.nope  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        osmosis_core.plugin.nope  # noqa: B018


def test_summary_fields_read_as_the_dict_it_was_warns_and_gives_the_same_values():
    """``summary_fields`` gives a :class:`LineOutcome` now; indexing it as 0.1's dict still works, with a warning."""
    from osmosis_core.frontend import LineOutcome, summary_fields

    error = {"category": "policy_error", "message": "HTTP 503"}
    line = {"row": 0, "sample_index": 0, "status": "failure", "reward": None, "sample": {"messages": []},
            "error": error, "timings": {"workflow": 0.5, "x": 1.0}}  # fmt: skip
    outcome = summary_fields(line)
    assert isinstance(outcome, LineOutcome)
    assert outcome.timings == {"workflow": 0.5}  # only what a latency adds up
    with pytest.warns(
        OsmosisDeprecationWarning, match=r"summary_fields\(line\)\['status'\].*use summary_fields\(line\).status"
    ) as told:
        assert outcome["status"] == "failure"
    assert told[0].filename == __file__
    with pytest.warns(OsmosisDeprecationWarning):
        assert outcome["error"] == error
    with pytest.warns(OsmosisDeprecationWarning):
        assert (outcome.get("reward"), outcome.get("nope", 3)) == (None, 3)


def test_every_deprecation_is_in_the_changelog():
    changelog = (Path(__file__).parents[1] / "CHANGELOG.md").read_text()
    names = ("LocalBackend.from_setup", "LocalBackendConfig", "result_line", "lazy_exports", "osmosis_harbor.wire")
    names += ("osmosis_core.plugin.attach_stub", "osmosis_core.lazy.stub_exports", "summary_fields(line)[key]")
    moved = ("osmosis_core.runner", "osmosis_core.plugins", "config_options", "build_backend", "RunLock")
    moved += ("osmosis_core.http", "osmosis_core.wire", "osmosis_core.sampling", "`osmosis_core.WorkerPool`")
    for name in (*names, *moved, "osmosis_core.plugin.rollout_openai_client", "osmosis_core.plugin.policy_error"):
        assert name in changelog, name


def test_osmosis_core_migrate_forwards_to_the_plugin_with_a_warning_or_says_what_to_install(monkeypatch):
    """``osmosis_core.migrate`` moved to osmosis-migrate: the old names warn and forward (plugin
    installed) or fail with the package to install (plugin absent); importing the module alone
    imports no plugin."""
    import importlib.util
    import sys

    code = "import sys, osmosis_core.migrate; assert 'osmosis_migrate' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
    import osmosis_core.migrate as old

    if importlib.util.find_spec("osmosis_migrate") is not None:
        with pytest.warns(OsmosisDeprecationWarning, match=r"osmosis_core\.migrate\.plan_migration is deprecated"):
            forwarded = old.plan_migration
        import osmosis_migrate

        assert forwarded is osmosis_migrate.plan_migration
    monkeypatch.setitem(sys.modules, "osmosis_migrate", None)  # as if it were not installed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OsmosisDeprecationWarning)
        with pytest.raises(ImportError, match="pip install osmosis-migrate"):
            _ = old.apply_migration
    with pytest.raises(AttributeError):
        _ = old.nothing_here


@pytest.mark.parametrize("name", ["rollout_openai_client", "policy_error"])
def test_the_openai_client_names_forward_to_osmosis_openai_naming_what_to_install(monkeypatch, name):
    """``osmosis_core.plugin.rollout_openai_client`` and ``policy_error`` moved to the osmosis-openai
    distribution: the old names warn with ``pip install osmosis-openai`` and are the same objects
    (when it is installed), or fail with an ImportError saying what to install (when it is not)."""
    import importlib.util
    import sys

    import osmosis_core.plugin

    if importlib.util.find_spec("osmosis_openai") is not None:
        with pytest.warns(
            OsmosisDeprecationWarning, match=r"use osmosis_openai\.\w+ \(pip install osmosis-openai\)"
        ) as record:
            forwarded = getattr(osmosis_core.plugin, name)
        assert record[0].filename == __file__  # the warning points at the code that asked for the name
        import osmosis_openai

        assert forwarded is getattr(osmosis_openai, name)
    monkeypatch.setitem(sys.modules, "osmosis_openai", None)  # as if it were not installed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OsmosisDeprecationWarning)
        with pytest.raises(ImportError, match=f"osmosis_core.plugin.{name} moved to the osmosis-openai distribution"):
            getattr(osmosis_core.plugin, name)
    assert name not in osmosis_core.plugin.__all__
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        osmosis_core.plugin.nope  # noqa: B018


def test_the_openai_client_module_says_what_to_install_when_osmosis_openai_is_missing(monkeypatch):
    """0.1's ``osmosis_core.openai_client`` names come from osmosis-openai; without it (the core
    session has only the core) the ImportError says what to install."""
    import sys

    import osmosis_core.openai_client as old

    monkeypatch.setitem(sys.modules, "osmosis_openai", None)  # as if not installed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ImportError, match="pip install osmosis-openai"):
            _ = old.rollout_openai_client
    assert "use osmosis_openai.rollout_openai_client (pip install osmosis-openai)" in str(caught[0].message)
