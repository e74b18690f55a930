"""The plugin as osmosis sees it: its hooks, its commands, a light entry module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from osmosis_core.testing import check_lazy_exports

OSMOSIS = str(Path(sys.executable).parent / "osmosis")


def test_osmosis_lists_the_gateway_plugin_with_its_hook_and_commands(clean_env):
    r = subprocess.run([OSMOSIS, "plugins", "--json"], capture_output=True, text=True, env=clean_env, timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    plugins = data if isinstance(data, list) else data["plugins"]
    (gateway,) = [p for p in plugins if p["name"] == "gateway"]
    assert gateway["status"] == "active"
    assert gateway["distribution"] == "osmosis-gateway"
    assert "osmosis_policy_gateway" in gateway["hooks"]
    assert gateway["provides"] == {"commands": ["export", "gateway"]}


def test_the_entry_module_imports_no_aiohttp():
    code = "import sys, osmosis_gateway.plugin, osmosis_gateway; print('aiohttp' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_without_the_plugin_the_cli_says_what_to_install(clean_env):
    env = {**clean_env, "OSMOSIS_DISABLE_PLUGINS": "gateway"}
    r = subprocess.run([OSMOSIS, "gateway", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2
    assert "pip install osmosis-gateway" in r.stderr


def test_the_public_names_type_checkers_read_are_the_ones_the_package_hands_out():
    check_lazy_exports("osmosis_gateway")
