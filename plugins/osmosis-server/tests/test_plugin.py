"""The plugin as the osmosis CLI sees it: discovered, light to import, `serve` added."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from server_helpers import osmosis_exe

import osmosis_server
from osmosis_core.testing import check_lazy_exports

MOVED_TO_TRAINER = (  # the client's public names in 0.1 (written here: a name the shim drops fails a test)
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
)


def test_the_plugin_is_discovered_and_adds_serve():
    plugins = subprocess.run([osmosis_exe(), "plugins", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(plugins.stdout)
    entries = data["plugins"] if isinstance(data, dict) else data
    [ours] = [p for p in entries if p["name"] == "server"]
    assert ours["status"] == "active"
    helped = subprocess.run([osmosis_exe(), "--help"], capture_output=True, text=True, check=True)
    assert "serve" in helped.stdout
    serve_help = subprocess.run([osmosis_exe(), "serve", "--help"], capture_output=True, text=True, check=True)
    for flag in ("--backend", "--workers", "--host", "--port", "--token-env", "--no-auth", "--grace", "--max-queued"):
        assert flag in serve_help.stdout


def test_importing_the_package_and_its_entry_module_stays_light():
    code = (
        "import sys, osmosis_server, osmosis_server.plugin; "
        "osmosis_server.ServerSettings; osmosis_server.LEASE_HEADER; osmosis_server.RolloutStatus; "
        "import osmosis_server.client, osmosis_trainer.client; "
        "heavy = [m for m in ('starlette', 'uvicorn', 'aiohttp', 'cattrs') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_public_names_type_checkers_read_are_the_ones_the_package_hands_out():
    check_lazy_exports("osmosis_server")


@pytest.mark.parametrize("module", ["osmosis_server", "osmosis_server.client"])
@pytest.mark.parametrize("name", MOVED_TO_TRAINER)
def test_the_client_names_moved_to_osmosis_trainer_warn_and_are_the_same_objects(module, name):
    import importlib

    import osmosis_trainer
    from osmosis_core import OsmosisDeprecationWarning

    message = rf"{module}\.{name} is deprecated .*: use osmosis_trainer\.{name} \(pip install osmosis-trainer\)"
    with pytest.warns(OsmosisDeprecationWarning, match=message):
        moved = getattr(importlib.import_module(module), name)
    assert moved is getattr(osmosis_trainer, name)
    assert name not in osmosis_server.__all__


def test_the_clients_retry_delays_moved_too():
    import osmosis_server.client
    import osmosis_trainer.client
    from osmosis_core import OsmosisDeprecationWarning

    with pytest.warns(OsmosisDeprecationWarning, match=r"use osmosis_trainer\.client\.RETRY_DELAYS_SEC"):
        assert osmosis_server.client.RETRY_DELAYS_SEC is osmosis_trainer.client.RETRY_DELAYS_SEC


def test_the_moved_client_names_are_in_the_changelogs_deprecations():
    from server_helpers import REPO

    changelog = (REPO / "CHANGELOG.md").read_text()
    deprecated = changelog.split("### Deprecated", 1)[1].split("\n### ", 1)[0]
    assert "`osmosis_server.RolloutClient`" in deprecated
    assert all(f"`{name}`" in deprecated for name in MOVED_TO_TRAINER if name != "RolloutClient")
    assert "osmosis_trainer" in deprecated


def test_the_protocols_shared_names_are_the_trainer_sides_own():
    """The server and the client read one status vocabulary, one lease header, one token variable."""
    import osmosis_trainer
    from osmosis_server.settings import DEFAULT_TOKEN_ENV

    assert osmosis_server.RolloutStatus is osmosis_trainer.RolloutStatus
    assert osmosis_server.LEASE_HEADER == osmosis_trainer.LEASE_HEADER
    assert DEFAULT_TOKEN_ENV == osmosis_trainer.DEFAULT_TOKEN_ENV


def test_the_docstring_examples_run():
    import doctest
    import importlib

    for name in ("osmosis_server", "osmosis_server.protocol", "osmosis_server.settings", "osmosis_server.auth"):
        failed, tried = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert tried, name
        assert not failed, name


@pytest.mark.together  # every first-party plugin that adds a command, installed beside this one
@pytest.mark.parametrize("columns", ["60", "80", "200"])
def test_no_command_description_is_cut_mid_phrase_with_every_plugin_installed(columns):
    """click cuts a command's first docstring line to the width and ends it in "..."; every command of
    the core and the plugins (export, gateway, harbor, migrate, report, serve) has a short help of its own."""
    for other in (
        "osmosis_gateway",
        "osmosis_harbor",
        "osmosis_migrate",
        "osmosis_report",
    ):  # (the plugins_all session has them)
        pytest.importorskip(other, reason="needs every first-party plugin that adds a command")
    env = {**os.environ, "COLUMNS": columns}
    helped = subprocess.run([osmosis_exe(), "--help"], capture_output=True, text=True, check=True, env=env)
    rows: dict[str, str] = {}
    name = None
    for line in helped.stdout.split("Commands:", 1)[1].splitlines():
        match = re.match(r"^  (\S+)\s+(.*)$", line)
        if match:
            name = match.group(1)
            rows[name] = match.group(2).strip()
        elif name is not None and line.strip():
            rows[name] += " " + line.strip()  # (a narrow terminal wraps a description: not a cut)
    assert {
        "export",
        "gateway",
        "harbor",
        "migrate",
        "report",
        "serve",
        "run",
        "validate",
        "template",
        "plugins",
    } <= set(rows)
    for command, description in rows.items():
        assert not description.endswith("..."), (command, description)
        assert description.endswith((".", ")")), (command, description)
