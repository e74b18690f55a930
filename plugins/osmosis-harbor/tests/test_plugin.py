"""The plugin's entry module is light, registers the backend and the template, and checks its settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from harbor_helpers import PROBE_DIR, TASKS_DIR, load, osmosis

from osmosis_core import ConfigError, OsmosisError
from osmosis_core.plugin import structure_table
from osmosis_core.testing import check_lazy_exports


def test_entry_module_imports_neither_harbor_nor_litellm():
    code = (
        "import sys, osmosis_harbor.plugin, osmosis_harbor, osmosis_harbor.config; "
        "osmosis_harbor.plugin.osmosis_register_backends(); osmosis_harbor.plugin.osmosis_register_templates(); "
        "osmosis_harbor.HarborBackendConfig(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('harbor', 'litellm')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_osmosis_plugins_and_template_list_show_the_backend_and_the_template(tmp_path):
    plugins = osmosis("plugins", "--json", cwd=tmp_path)
    assert plugins.returncode == 0, plugins.stderr
    assert "harbor" in plugins.stdout
    assert "osmosis-harbor" in plugins.stdout
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


def test_the_backend_table_cannot_choose_another_workflow_or_grader():
    """Which workflow and grader run is the run's decision ([rollout]), made once, as on every backend."""
    from osmosis_harbor import HarborBackendConfig

    for key in ("workflow", "grader", "workflow_config", "grader_config"):
        with pytest.raises(ConfigError, match=rf"unknown key\(s\): {key} @ \$\.backend\.harbor"):
            structure_table({key: "x"}, HarborBackendConfig, "$.backend.harbor", "run.toml")


# -- osmosis-ai's constructor (the documented keywords, one test each) ---------------------------------


def test_classes_and_configs_may_be_import_paths():
    from osmosis_harbor import HarborBackend

    probe = load(PROBE_DIR, "probe_rollout.py")
    name = probe.workflow_class.__module__
    backend = HarborBackend(workflow=f"{name}:ProbeWorkflow", grader=f"{name}:ProbeGrader")
    assert backend.workflow_class is probe.workflow_class
    assert backend.grader_class is probe.grader_class
    with pytest.raises(TypeError, match=r"cannot import the workflow 'nowhere:X'"):
        HarborBackend(workflow="nowhere:X")


def test_orchestrator_is_the_given_trial_queue():
    from harbor.trial.queue import TrialQueue

    from osmosis_harbor import HarborBackend

    probe = load(PROBE_DIR, "probe_rollout.py")
    queue = TrialQueue(n_concurrent=3)
    backend = HarborBackend(probe.workflow_class, orchestrator=queue, max_concurrent=3)
    assert backend.queue is queue
    assert backend.max_concurrency == 3
    # the queue keeps its own limit (Harbor does not publish it): unsaid, the backend claims none of its own
    assert HarborBackend(probe.workflow_class, orchestrator=TrialQueue(n_concurrent=3)).max_concurrency == 0


def test_task_dir_user_code_dir_and_cleanup_map_onto_the_config(tmp_path):
    from osmosis_harbor import HarborBackend, HarborBackendConfig

    probe = load(PROBE_DIR, "probe_rollout.py")
    task = TASKS_DIR / "nonet"
    backend = HarborBackend(
        probe.workflow_class, task_dir=task, user_code_dir=probe.rollout_dir, cleanup_successful_trials=False
    )
    assert backend.task_dir == task
    assert backend.code_dir == probe.rollout_dir.resolve()
    assert backend.config.keep_successful_trials is True
    assert HarborBackend(probe.workflow_class, cleanup_successful_trials=True).config.keep_successful_trials is False
    with pytest.raises(ConfigError, match=r"task_dir=.* and config task_dir=.* disagree"):
        HarborBackend(probe.workflow_class, config=HarborBackendConfig(task_dir=str(tmp_path)), task_dir=task)


def test_environment_config_is_used_as_given():
    from harbor.models.trial.config import EnvironmentConfig

    from osmosis_harbor import HarborBackend

    probe = load(PROBE_DIR, "probe_rollout.py")
    given = EnvironmentConfig(type="docker", kwargs={"keep_containers": True})
    backend = HarborBackend(probe.workflow_class, environment_config=given)
    assert backend._environment_config() == given
    assert backend.python == "python3"


def test_prebuild_local_image_is_a_docker_option():
    from harbor.models.trial.config import EnvironmentConfig

    from osmosis_harbor import HarborBackend, HarborBackendConfig
    from osmosis_harbor.config import EnvironmentSection

    probe = load(PROBE_DIR, "probe_rollout.py")
    with pytest.raises(ConfigError, match=r"Docker environment .* trials run in 'bwrap' \(the plugin's bubblewrap"):
        HarborBackend(probe.workflow_class, prebuild_local_image=True)
    custom = EnvironmentConfig(import_path="some.module:SomeEnvironment")
    with pytest.raises(ConfigError, match=r"run in the environment class 'some.module:SomeEnvironment'"):
        HarborBackend(probe.workflow_class, environment_config=custom, prebuild_local_image=True)
    podman = HarborBackendConfig(environment=EnvironmentSection(type="podman"))
    with pytest.raises(ConfigError, match=r"these trials run in podman"):
        HarborBackend(probe.workflow_class, config=podman, prebuild_local_image=True)
    # False means "do not build", which holds in every environment: accepted, nothing changes
    assert HarborBackend(probe.workflow_class, prebuild_local_image=False).config.environment.is_bwrap
    kept = HarborBackend(probe.workflow_class, environment_config=custom, prebuild_local_image=False)
    assert kept._environment_config().import_path == "some.module:SomeEnvironment"
    # with Docker it is Harbor's force_build, in the environment the trials really use
    for given in (EnvironmentConfig(type="docker"), EnvironmentConfig()):  # Harbor's default type is docker
        backend = HarborBackend(probe.workflow_class, environment_config=given, prebuild_local_image=True)
        assert backend._environment_config().force_build is True
    docker = HarborBackendConfig(environment=EnvironmentSection(type="docker"))
    backend = HarborBackend(probe.workflow_class, config=docker, prebuild_local_image=True)
    assert backend._environment_config().force_build is True


def test_trial_result_files_hold_no_run_of_eight_characters_of_a_secret(tmp_path):
    """The in-trial runner's result files (kept for a failed trial) are redacted like results.jsonl:
    a provider's masked key and a header value's head too (issue 16.5)."""
    from osmosis_harbor.in_trial import _write_json

    key, header = "sk-proj-abcd1234EFGH5678ijkl9012MNOPwxyz", "org-0123456789abcdefXYZ"
    data = {
        "error": {"message": f"Incorrect API key provided: {key[:16]}****{key[-4:]}", "header": header[:16]},
        "sample": [f'quote "{key}" and \\ {header}'],
    }
    path = tmp_path / "result.json"
    _write_json(path, data, (key, header))
    text = path.read_text()
    assert not [s[i : i + 8] for s in (key, header) for i in range(len(s) - 7) if s[i : i + 8] in text], text
    assert json.loads(text)["error"]["message"] == f"Incorrect API key provided: *******{key[-4:]}"


def test_the_public_names_type_checkers_read_are_the_ones_the_package_hands_out():
    check_lazy_exports("osmosis_harbor")


def test_the_packages_uploaded_to_a_docker_trial_are_all_its_runner_imports_beyond_the_image(tmp_path):
    """A Harbor (non-bwrap) image brings Python with attrs, cattrs and anyio; everything else the
    runner imports (osmosis's packages, lazy_loader) must be in the upload set."""
    from osmosis_harbor.backend import _trial_lib_uploads

    lib = tmp_path / "lib"
    lib.mkdir()
    for target, source in _trial_lib_uploads(str(lib)).items():
        os.symlink(source, target)
    not_in_image = ["lazy_loader", "pluggy", "click", "tomlkit", "rich", "aiohttp", "osmosis_core", "osmosis_harbor"]
    code = f"""
import importlib.machinery, sys
lib = {str(lib)!r}
class OnlyUploaded:
    def find_spec(self, name, path=None, target=None):
        if name in {not_in_image!r}:
            found = importlib.machinery.PathFinder.find_spec(name, [lib])
            if found is None:
                raise ModuleNotFoundError(f"{{name}} is not uploaded", name=name)
            return found
        return None
sys.meta_path.insert(0, OnlyUploaded())
sys.path[:0] = [lib]
from osmosis_core import ExecutionRequest, PolicyEndpoint
from osmosis_core.plugin import run_grader, run_workflow
from osmosis_core.http import aclose_http
from osmosis_core.wire import result_from_json, result_to_json
import osmosis_harbor.grading, osmosis_harbor.in_trial, osmosis_harbor.relay, osmosis_harbor.wire
print("imported")
"""
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "imported", out.stderr
