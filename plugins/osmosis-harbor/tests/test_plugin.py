"""The plugin's entry module is light, registers the backend and the template, and checks its settings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from harbor_helpers import PROBE_DIR, load, osmosis

from osmosis_core.config import structure_table
from osmosis_core.errors import ConfigError, OsmosisError


def test_entry_module_imports_neither_harbor_nor_litellm():
    code = (
        "import sys, osmosis_harbor.plugin, osmosis_harbor, osmosis_harbor.config; "
        "osmosis_harbor.plugin.osmosis_register_backends(); osmosis_harbor.plugin.osmosis_register_templates(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('harbor', 'litellm')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_osmosis_plugins_and_template_list_show_the_backend_and_the_template(tmp_path):
    plugins = osmosis("plugins", "--json", cwd=tmp_path)
    assert plugins.returncode == 0, plugins.stderr
    assert "harbor" in plugins.stdout and "osmosis-harbor" in plugins.stdout
    templates = osmosis("template", "list", "--json", cwd=tmp_path)
    assert templates.returncode == 0, templates.stderr
    names = [t["name"] for t in json.loads(templates.stdout)]
    assert "multiply-harbor-strands" in names


def test_the_backend_table_is_read_strictly():
    from osmosis_harbor.config import HarborBackendConfig

    cfg = structure_table(
        {"mode": "dataset", "dataset_dir": "tasks", "environment": {"type": "docker", "kwargs": {"a": 1}}},
        HarborBackendConfig,
        "$.backend.harbor",
        "run.toml",
    )
    assert (cfg.mode, cfg.environment.type, cfg.environment.is_bwrap) == ("dataset", "docker", False)
    with pytest.raises(ConfigError, match=r"unknown key\(s\): n_concurent"):
        structure_table({"n_concurent": 2}, HarborBackendConfig, "$.backend.harbor", "run.toml")
    with pytest.raises(ConfigError, match=r"memroy_mb .*\$\.backend\.harbor\.sandbox"):
        structure_table({"sandbox": {"memroy_mb": 1}}, HarborBackendConfig, "$.backend.harbor", "run.toml")
    with pytest.raises(ConfigError, match="mode must be one of 'template', 'dataset'"):
        structure_table({"mode": "tasks"}, HarborBackendConfig, "$.backend.harbor", "run.toml")


def test_a_missing_bubblewrap_is_one_clear_error_that_says_how_to_install_it(tmp_path):
    from osmosis_harbor import BubblewrapMissing, HarborBackend, HarborBackendConfig, SandboxSection

    probe = load(PROBE_DIR, "probe_rollout.py")
    config = HarborBackendConfig(sandbox=SandboxSection(bwrap=str(tmp_path / "no-bwrap-here")))
    with pytest.raises(BubblewrapMissing, match=r"apt-get install -y bubblewrap") as info:
        HarborBackend(probe.workflow_class, config=config, run_dir=tmp_path)
    assert isinstance(info.value, OsmosisError)  # the CLI shows it as one line, exit status 1


def test_a_bad_workflow_config_key_in_the_backend_table_names_its_path(tmp_path):
    from osmosis_harbor import HarborBackend, HarborBackendConfig

    probe = load(PROBE_DIR, "probe_rollout.py")
    with pytest.raises(ConfigError, match=r"unknown key 'max_turnz' .* @ \$\.backend\.harbor\.workflow_config"):
        HarborBackend(
            probe.workflow_class, config=HarborBackendConfig(workflow_config={"max_turnz": 3}), run_dir=tmp_path
        )
