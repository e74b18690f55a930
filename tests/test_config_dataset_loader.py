"""Bad input gets a clear error naming the place: config key paths, dataset file:line, entrypoints."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Literal

import anyio
import attrs
import pytest

from osmosis_core import (
    AgentWorkflow,
    AgentWorkflowConfig,
    ConcurrencyConfig,
    ConfigError,
    DatasetError,
    ExecutionRequest,
    PolicyEndpoint,
    RolloutLoadError,
)
from osmosis_core._engine.config import load_config, workspace_root
from osmosis_core._engine.dataset import read_dataset
from osmosis_core._engine.loader import MissingDependency, load_rollout
from osmosis_core._engine.registry import PluginRegistry
from osmosis_core._engine.runner import build_backend, prepare_run
from osmosis_core.plugin import BackendSpec, hookimpl


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def config_problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path / "configs" / "eval" / "c.toml", text))
    return info.value.problems


# -- config ------------------------------------------------------------------------------------


def test_example_config_loads_and_resolves_against_the_workspace(workspace):
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    assert config.root == workspace.resolve()
    assert config.resolve(config.rollout.path) == workspace.resolve() / "rollouts" / "multiply-plain"
    assert config.name == "multiply-plain"
    assert workspace_root(workspace / "c.toml") == workspace.resolve()


def test_unknown_and_mistyped_keys_are_each_reported_with_their_path(tmp_path):
    problems = config_problems(
        tmp_path,
        """
        [rollout]
        path = "r"
        [run]
        concurency = 4
        n_samples = "two"
        agent_timeout_sec = true
        [dataset]
        limit = 1.5
        """,
    )
    assert "unknown key(s): concurency (did you mean 'concurrency'?) @ $.run" in problems
    assert "expected a whole number, got 'two' @ $.run.n_samples" in problems
    assert "expected a number, got True @ $.run.agent_timeout_sec" in problems
    assert "expected a whole number, got 1.5 @ $.dataset.limit" in problems


def test_api_key_in_the_file_is_refused_with_a_hint(tmp_path):
    [problem] = config_problems(tmp_path, '[rollout]\npath = "r"\n[policy]\napi_key = "sk-1"\n')
    assert "api_key_env" in problem
    assert "sk-1" not in problem


def test_semantic_checks(tmp_path):
    problems = config_problems(
        tmp_path,
        """
        [policy]
        base_url = "localhost:8000"
        [run]
        concurrency = 0
        grader_timeout_sec = -1
        """,
    )
    assert any(p.endswith("@ $.run.concurrency") for p in problems)
    assert any(p.endswith("@ $.run.grader_timeout_sec") for p in problems)
    assert any(p.endswith("@ $.policy.base_url") for p in problems)
    assert any(p.endswith("@ $.rollout") for p in problems)


def test_bad_toml_names_the_line(tmp_path):
    [problem] = config_problems(tmp_path, "[run]\nbackend = \n")
    assert "not valid TOML" in problem
    assert "line 2" in problem


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.toml")


def _registry() -> PluginRegistry:
    return PluginRegistry(load_entrypoints=False)


def test_unknown_backend_lists_the_known_ones(workspace):
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    config.run.backend = "nonesuch"
    rollout = load_rollout(config)
    with pytest.raises(ConfigError) as info:
        build_backend(config, rollout, _registry(), None)
    assert "unknown backend 'nonesuch'; known backends: local @ $.run.backend" in str(info.value)


@attrs.define(kw_only=True)
class EchoConfig:
    greeting: str = "hi"
    repeat: int = 1


class EchoPlugin:
    seen: list = []

    @staticmethod
    @hookimpl
    def osmosis_register_backends():
        def make(setup):
            EchoPlugin.seen.append(setup)
            from osmosis_core._engine.builtin import local_backend

            return local_backend(setup)

        return [BackendSpec("echo", make, config_type=EchoConfig, description="test backend")]


def test_backend_table_is_typed_and_closed(workspace):
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    rollout = load_rollout(config)
    registry = _registry()
    registry.register(EchoPlugin, "echo")
    config.run.backend = "echo"
    config.backend = {"echo": {"greeting": "hello", "repeat": 2}}
    build_backend(config, rollout, registry, None)
    setup = EchoPlugin.seen[-1]
    assert setup.backend_config == EchoConfig(greeting="hello", repeat=2)
    assert setup.config_root == workspace.resolve()
    assert setup.dataset_path.name == "multiply.jsonl"
    config.backend = {"echo": {"greting": "x"}}
    hinted = r"unknown key\(s\): greting \(did you mean 'greeting'\?\) @ \$\.backend\.echo"
    with pytest.raises(ConfigError, match=hinted):
        build_backend(config, rollout, registry, None)
    config.backend = {"echo": {"repeat": "twice"}}
    with pytest.raises(ConfigError, match=r"expected a whole number, got 'twice' @ \$\.backend\.echo\.repeat"):
        build_backend(config, rollout, registry, None)
    config.run.backend = "local"
    config.backend = {"local": {"max_concurrent": 3}}
    with pytest.raises(ConfigError, match=r"the 'local' backend takes no settings @ \$\.backend\.local"):
        build_backend(config, rollout, registry, None)
    config.backend = {"harbour": {}}
    with pytest.raises(ConfigError, match=r"no backend is called 'harbour' @ \$\.backend\.harbour"):
        build_backend(config, rollout, registry, None)


def test_run_concurrency_sets_the_local_limit(workspace):
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    rollout = load_rollout(config)
    assert build_backend(config, rollout, _registry(), None).max_concurrency == 8  # [run] concurrency = 8
    config.run.concurrency = 50
    assert build_backend(config, rollout, _registry(), None).max_concurrency == 50


class _SeesItsConfig(AgentWorkflow):
    """Answers with the ``concurrency`` its own config holds (what the author's class sees)."""

    async def run(self, ctx):
        return [*ctx.prompt, {"role": "assistant", "content": str(self.config.concurrency.max_concurrent)}]


def _seen_by_the_workflow(backend) -> str:
    results = []

    async def keep(result):
        results.append(result)

    request = ExecutionRequest("r", [{"role": "user", "content": "?"}], PolicyEndpoint("http://127.0.0.1:9/v1", "m"))
    anyio.run(backend.execute, request, keep)
    return results[-1].sample.messages[-1]["content"]


@pytest.mark.parametrize("workers", [1, 2])
def test_run_concurrency_is_kept_and_the_authors_workflow_config_is_never_written(workspace, workers):
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    authors = AgentWorkflowConfig(concurrency=ConcurrencyConfig(max_concurrent=3))
    rollout = attrs.evolve(
        load_rollout(config), workflow_class=_SeesItsConfig, workflow_config=authors, grader_class=None
    )
    config.run.workers = workers
    config.run.concurrency = None  # the author's own limit is honoured
    backend = build_backend(config, rollout, _registry(), None)
    try:
        assert backend.max_concurrency == 3
    finally:
        anyio.run(backend.aclose)
    config.run.concurrency = 50  # --concurrency 50: the run's limit, not a change to the author's config
    backend = build_backend(config, rollout, _registry(), None)
    try:
        assert backend.max_concurrency == 50
        if workers == 1:
            assert _seen_by_the_workflow(backend) == "3"
    finally:
        anyio.run(backend.aclose)
    assert authors.concurrency.max_concurrent == 3


def test_missing_api_key_variable_is_named_not_valued(workspace, monkeypatch):
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    config.policy.api_key_env = "OSMOSIS_TEST_KEY"
    monkeypatch.delenv("OSMOSIS_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"OSMOSIS_TEST_KEY is not set @ \$\.policy\.api_key_env"):
        prepare_run(config, registry=_registry())


# -- dataset -----------------------------------------------------------------------------------


def test_dataset_rows_prompts_labels_and_metadata(tmp_path):
    path = write(
        tmp_path / "d.jsonl",
        """\
        {"system_prompt": "s", "user_prompt": "u", "ground_truth": "1", "level": 2}

        {"messages": [{"role": "user", "content": "m"}], "label": 5}
        {"user_prompt": "no label"}
        """,
    )
    rows = read_dataset(path)
    assert [r.index for r in rows] == [0, 1, 2]
    assert [r.line for r in rows] == [1, 3, 4]
    assert rows[0].prompt == [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert rows[0].label == "1"
    assert rows[0].metadata == {"level": 2}
    assert rows[1].prompt == [{"role": "user", "content": "m"}]
    assert rows[1].label == 5
    assert rows[2].label is None
    assert len(read_dataset(path, limit=2)) == 2


def test_every_bad_line_is_reported_with_file_and_line(tmp_path):
    path = write(
        tmp_path / "bad.jsonl",
        """\
        {"user_prompt": "fine", "ground_truth": "1"}
        {"user_prompt": "broken",
        {"system_prompt": "only a system prompt"}
        [1, 2]
        {"user_prompt": 7}
        {"messages": [], "ground_truth": "1"}
        """,
    )
    with pytest.raises(DatasetError) as info:
        read_dataset(path)
    problems = info.value.problems
    assert problems[0].startswith(f"{path}:2: invalid JSON")
    assert problems[1] == f'{path}:3: missing "user_prompt" (or a "messages" list)'
    assert problems[2] == f"{path}:4: expected a JSON object, got list"
    assert problems[3] == f'{path}:5: "user_prompt" must be a string, got int'
    assert problems[4].startswith(f"{path}:6: ")


def test_a_dataset_of_bad_lines_reports_the_first_twenty_whatever_is_wrong_with_them(tmp_path):
    # invalid JSON, text that is not UTF-8 and rows of the wrong shape all count towards the cap
    lines = [b'{"user_prompt": "broken",', b"\xff\xfe not text", b"[1, 2]"] * 30 + [b'{"user_prompt": "fine"}']
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DatasetError) as info:
        read_dataset(path)
    problems = info.value.problems
    assert len(problems) == 21
    assert problems[0].startswith(f"{path}:1: invalid JSON")
    assert problems[1].startswith(f"{path}:2: not UTF-8 text (byte 0xff at column 1)")
    assert problems[2] == f"{path}:3: expected a JSON object, got list"
    assert problems[19].startswith(f"{path}:20: ")
    assert problems[20] == "(stopped after 20 problems, at line 21)"
    # twenty problems with nothing but blank lines after them: nothing was left unread
    path.write_bytes(b"\n".join(lines[:20]) + b"\n\n  \n")
    with pytest.raises(DatasetError) as info:
        read_dataset(path)
    assert len(info.value.problems) == 20


def test_missing_or_empty_dataset(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        read_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(DatasetError, match="no rows"):
        read_dataset(write(tmp_path / "empty.jsonl", "\n"))


# -- loading the rollout -----------------------------------------------------------------------


def rollout_config(tmp_path: Path, main_py: str, extra: str = "", pyproject: str | None = None):
    write(tmp_path / "rollouts" / "r" / "main.py", main_py)
    if pyproject is not None:
        write(tmp_path / "rollouts" / "r" / "pyproject.toml", pyproject)
    return load_config(write(tmp_path / "configs" / "eval" / "r.toml", f'[rollout]\npath = "rollouts/r"\n{extra}'))


MINIMAL = """\
from osmosis_core import AgentWorkflow, Grader

class W(AgentWorkflow):
    async def run(self, ctx):
        return []
"""


def test_entrypoint_import_failure_names_file_and_line(tmp_path):
    config = rollout_config(tmp_path, "import os\n\nvalue = undefined_name + 1\n")
    with pytest.raises(RolloutLoadError) as info:
        load_rollout(config)
    message = str(info.value)
    assert "main.py:3: import failed: NameError" in message


def test_syntax_error_names_file_and_line(tmp_path):
    config = rollout_config(tmp_path, "def broken(:\n    pass\n")
    with pytest.raises(RolloutLoadError, match=r"main\.py:1: import failed: SyntaxError"):
        load_rollout(config)


def test_missing_dependency_declared_or_not(tmp_path):
    deps = '[project]\nname = "r"\nversion = "0"\ndependencies = ["not-installed-pkg>=1"]\n'
    config = rollout_config(tmp_path, "import not_installed_pkg\n", pyproject=deps)
    with pytest.raises(MissingDependency) as info:
        load_rollout(config)
    assert info.value.declared
    assert "not_installed_pkg" in str(info.value)
    # a declared distribution is missing, so an import it may provide counts as declared
    config = rollout_config(tmp_path, "import another_missing_pkg\n", pyproject=deps)
    with pytest.raises(MissingDependency) as info:
        load_rollout(config)
    assert info.value.declared
    assert "not all installed" in str(info.value)
    # everything declared is installed: an undeclared import is not a declared dependency
    installed = '[project]\nname = "r"\nversion = "0"\ndependencies = ["attrs"]\n'
    config = rollout_config(tmp_path, "import another_missing_pkg\n", pyproject=installed)
    with pytest.raises(MissingDependency) as info:
        load_rollout(config)
    assert not info.value.declared


def test_workflow_discovery(tmp_path):
    loaded = load_rollout(rollout_config(tmp_path, MINIMAL))
    assert loaded.workflow_class.__name__ == "W"
    assert loaded.grader_class is None
    two = MINIMAL + "\nclass W2(W):\n    pass\n"
    with pytest.raises(RolloutLoadError, match=r"exactly one AgentWorkflow subclass \(found: W, W2\)"):
        load_rollout(rollout_config(tmp_path, two))
    loaded = load_rollout(rollout_config(tmp_path, two, 'workflow = "W2"\n'))
    assert loaded.workflow_class.__name__ == "W2"
    with pytest.raises(RolloutLoadError, match=r"'Nope' is not defined .* @ \$\.rollout\.workflow"):
        load_rollout(rollout_config(tmp_path, two, 'workflow = "Nope"\n'))
    with pytest.raises(RolloutLoadError, match="exactly one AgentWorkflow subclass"):
        load_rollout(rollout_config(tmp_path, "x = 1\n"))


def test_grader_choice(tmp_path):
    graders = MINIMAL + (
        "\nclass G1(Grader):\n    async def grade(self, ctx):\n        return 1.0\n\nclass G2(G1):\n    pass\n"
    )
    with pytest.raises(RolloutLoadError, match=r"more than one Grader \(G1, G2\)"):
        load_rollout(rollout_config(tmp_path, graders))
    assert load_rollout(rollout_config(tmp_path, graders, 'grader = "G2"\n')).grader_class.__name__ == "G2"
    assert load_rollout(rollout_config(tmp_path, graders, 'grader = "none"\n')).grader_class is None
    expected = (
        r"unknown grader 'exact-match' \(it comes with osmosis-graders: pip install osmosis-graders\); known graders"
    )
    with pytest.raises(RolloutLoadError, match=expected):
        load_rollout(rollout_config(tmp_path, graders, 'grader = "exact-match"\n'), _registry())


def test_workflow_config_table_sets_fields_and_rejects_unknown_ones(workspace):
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    config.rollout.workflow_config = {"max_turns": 3, "concurrency": {"max_concurrent": 9}}
    loaded = load_rollout(config)
    assert loaded.workflow_config.max_turns == 3
    assert loaded.workflow_config.concurrency.max_concurrent == 9
    config.rollout.workflow_config = {"max_turn": 3}
    with pytest.raises(ConfigError, match=r"unknown key 'max_turn' .* @ \$\.rollout\.workflow_config"):
        load_rollout(config)
    config.rollout.workflow_config = {"max_turns": "many"}
    with pytest.raises(
        ConfigError, match=r"expected a whole number, got 'many' @ \$\.rollout\.workflow_config\.max_turns"
    ):
        load_rollout(config)


def test_a_missing_first_party_plugin_says_what_to_install(workspace):
    config = load_config(workspace / "configs" / "eval" / "multiply-plain.toml")
    config.run.backend = "harbor"
    with pytest.raises(ConfigError, match=r"unknown backend 'harbor' \(it comes with osmosis-harbor: pip install"):
        build_backend(config, load_rollout(config), _registry(), None)


def test_list_and_literal_settings_are_refused_with_their_path_not_mangled():
    """A string for a list is not a list of its characters; a bad element or a value outside a Literal
    is a config error with its key path, not a raw cattrs exception."""
    from osmosis_core._engine.config import structure_table

    @attrs.define(kw_only=True)
    class Settings:
        extractors: list[str] = attrs.field(factory=list)
        mode: Literal["mean", "majority"] = "mean"

    cases = {
        "extractors = 'boxed'": ({"extractors": "boxed"}, "expected a list, got the string 'boxed' @ $.g.extractors"),
        "a number in the list": ({"extractors": ["boxed", 1]}, "expected a string, got 1 @ $.g.extractors[1]"),
        "outside the Literal": ({"mode": "median"}, "@ $.g.mode"),
    }
    for data, expected in cases.values():
        with pytest.raises(ConfigError) as info:
            structure_table(data, Settings, "$.g", "run.toml")
        assert expected in str(info.value), str(info.value)
    assert structure_table({"extractors": ["boxed"], "mode": "majority"}, Settings, "$.g", "x").extractors == ["boxed"]
