"""The plugin's entry module is light, registers the backend, and its table is read strictly (no cluster needed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from ray_helpers import FAULTS, osmosis, write_dataset

from osmosis_core import ConfigError
from osmosis_core.plugin import structure_table
from osmosis_core.testing import check_lazy_exports
from osmosis_ray import RayBackendConfig, declared_requirements, missing_requirements


def test_the_entry_module_and_the_package_do_not_import_ray():
    code = (
        "import sys, osmosis_ray.plugin, osmosis_ray, osmosis_ray.config; "
        "osmosis_ray.plugin.osmosis_register_backends(); osmosis_ray.RayBackendConfig(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_osmosis_plugins_lists_the_ray_backend(tmp_path):
    listed = osmosis("plugins", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    plugins = json.loads(listed.stdout)
    text = json.dumps(plugins)
    assert "osmosis-ray" in text, plugins
    assert '"ray"' in text, plugins


def test_the_backend_table_is_read_strictly_with_key_paths():
    cfg = structure_table(
        {"address": "auto", "actors": 3, "runtime_env": {"env_vars": {"A": "1"}}, "local_cluster": {"num_cpus": 2}},
        RayBackendConfig,
        "$.backend.ray",
        "run.toml",
    )
    assert (cfg.address, cfg.actors, cfg.local_cluster.num_cpus, cfg.runtime_env) == (
        "auto",
        3,
        2,
        {"env_vars": {"A": "1"}},
    )
    with pytest.raises(
        ConfigError, match=r"unknown key\(s\): chunk_sise \(did you mean 'chunk_size'\?\) @ \$\.backend\.ray"
    ):
        structure_table({"chunk_sise": 4}, RayBackendConfig, "$.backend.ray", "run.toml")
    with pytest.raises(ConfigError, match=r"num_cpu .*\$\.backend\.ray\.local_cluster"):
        structure_table({"local_cluster": {"num_cpu": 1}}, RayBackendConfig, "$.backend.ray", "run.toml")
    for table, message in (
        ({"inner": "ray"}, "inner cannot be 'ray'"),
        ({"dependencies": "sometimes"}, "dependencies must be one of 'auto', 'install', 'none'"),
        ({"chunk_size": 0}, "chunk_size must be >= 1"),
        ({"actors": "two"}, r"\$\.backend\.ray\.actors"),
        ({"address": " "}, "address must be 'auto'"),
    ):
        with pytest.raises(ConfigError, match=message):
            structure_table(table, RayBackendConfig, "$.backend.ray", "run.toml")


def test_a_mistyped_key_stops_the_run_with_its_path_before_ray_is_touched(tmp_path):
    data = write_dataset(tmp_path / "rows.jsonl", [{"user_prompt": "val1 = 2\nval2 = 3", "ground_truth": "6"}])
    config = tmp_path / "run.toml"
    config.write_text(f'[rollout]\npath = "{FAULTS}"\n[dataset]\npath = "{data}"\n[backend.ray]\nchunk_sise = 4\n')
    run = osmosis(
        "run", str(config), "--stub-policy", "--backend", "ray", "--output", str(tmp_path / "o"), cwd=tmp_path
    )
    assert run.returncode == 1, run.stderr
    assert "chunk_sise" in run.stderr, run.stderr
    assert "$.backend.ray" in run.stderr, run.stderr
    assert not (tmp_path / "o").exists()


def test_the_inner_backends_table_is_checked_against_the_inner_backend():
    from osmosis_ray.backend import RayBackend

    with pytest.raises(ConfigError, match=r"the 'local' backend takes no settings @ \$\.backend\.ray\.inner_config"):
        RayBackend._structure_inner(RayBackendConfig(inner_config={"n_concurrent": 2}))
    with pytest.raises(Exception, match="unknown backend 'nope'"):
        RayBackend._structure_inner(RayBackendConfig(inner="nope"))


def test_declared_dependencies_and_what_this_environment_lacks(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "r"\ndependencies = ["osmosis-core>=0.1", "attrs>=999", '
        '"surely-not-installed-anywhere", "pytest; python_version < \'3\'"]\n'
    )
    declared = declared_requirements(tmp_path)
    assert declared[0] == "osmosis-core>=0.1"
    assert len(declared) == 4
    assert missing_requirements(declared) == ["attrs>=999", "surely-not-installed-anywhere"]
    assert declared_requirements(FAULTS) == ["osmosis-core>=0.1"]
    assert missing_requirements(["osmosis-core>=0.1"]) == []


def test_loopback_urls_are_recognised():
    from osmosis_ray.cluster import is_loopback_url

    assert all(is_loopback_url(u) for u in ("http://127.0.0.1:1/v1", "http://localhost:8000/v1", "http://[::1]:9/v1"))
    assert not any(is_loopback_url(u) for u in ("http://10.0.0.5:8000/v1", "https://api.openai.com/v1"))


def test_the_public_names_type_checkers_read_are_the_ones_the_package_hands_out():
    check_lazy_exports("osmosis_ray")
