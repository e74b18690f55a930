"""`osmosis migrate` on a workspace written for osmosis-ai: real `osmosis` subprocesses on a copy of
plugins/osmosis-migrate/tests/fixtures/osmosis-ai-workspace (one rollout per kind the reference scaffolds), then
`osmosis validate` and `osmosis run --stub-policy` on the result."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from osmosis_migrate import plan_migration
from osmosis_migrate.names import NotOffered, Target, documented_names, resolve_name
from osmosis_migrate.python_source import LEFTOVER_MARK, migrate_python

REPO = Path(__file__).resolve().parents[3]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "osmosis-ai-workspace"
MIGRATING = REPO / "MIGRATING.md"

CONFIGS = sorted(p.relative_to(FIXTURE).as_posix() for p in (FIXTURE / "configs").glob("*/*.toml"))
HARBOR_CONFIGS = [c for c in CONFIGS if "harbor" in c]
LOCAL_CONFIGS = [c for c in CONFIGS if c not in HARBOR_CONFIGS]


OSMOSIS = str(Path(sys.executable).parent / "osmosis")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")} | {"COLUMNS": "200"}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def osmosis(exe: str, *args: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def osmosis_exe() -> str:
    """The ``osmosis`` console script of this environment."""
    assert Path(OSMOSIS).exists(), f"osmosis is not installed next to {sys.executable}"
    return OSMOSIS


@pytest.fixture
def clean_env() -> dict[str, str]:
    """The environment for CLI subprocesses, without debug switches or plugin filters."""
    return dict(ENV)


@pytest.fixture
def reference_ws(tmp_path: Path) -> Path:
    """A fresh copy of the osmosis-ai workspace."""
    target = tmp_path / "ws"
    shutil.copytree(FIXTURE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


@pytest.fixture
def migrated_ws(reference_ws: Path, osmosis_exe: str, clean_env: dict[str, str]) -> Path:
    """A copy after `osmosis migrate --write`, for a test that changes it."""
    r = osmosis(osmosis_exe, "migrate", "--write", cwd=reference_ws, env=clean_env)
    assert r.returncode == 0, r.stdout + r.stderr
    return reference_ws


@pytest.fixture(scope="module")
def shared_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated copy for the tests that only read it (validate, run into their own output folders)."""
    target = tmp_path_factory.mktemp("shared") / "ws"
    shutil.copytree(FIXTURE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    r = osmosis(OSMOSIS, "migrate", "--write", cwd=target, env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def test_diff_mode_shows_the_diff_and_what_it_cannot_map_and_changes_nothing(reference_ws, osmosis_exe, clean_env):
    before = snapshot(reference_ws)
    r = osmosis(osmosis_exe, "migrate", cwd=reference_ws, env=clean_env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "--- a/rollouts/my-rollout/main.py\n+++ b/rollouts/my-rollout/main.py" in out
    assert "-from osmosis_ai.rollout import (\n+from osmosis_core import (" in out
    assert '-    "osmosis-ai[server,strands]>=0.3.1,<0.4",\n+    "osmosis-core>=0.2",' in out
    assert "+[rollout]\n" in out
    assert "-[experiment]\n" in out
    assert "--- /dev/null\n+++ b/rollouts/multiply-harbor-strands/multiply_harbor_task/tests/test.sh" in out
    assert "would change" in out
    assert "apply with: osmosis migrate --write" in out
    assert "not mapped (" in out
    assert snapshot(reference_ws) == before  # nothing written, no .orig


def test_write_keeps_every_original_as_orig(reference_ws, osmosis_exe, clean_env):
    before = snapshot(reference_ws)
    r = osmosis(osmosis_exe, "migrate", str(reference_ws), "--write", cwd=reference_ws.parent, env=clean_env)
    assert r.returncode == 0, r.stdout + r.stderr
    listed = re.findall(r"^  ([MA]) (\S+)", r.stdout, re.MULTILINE)
    changed = [rel for flag, rel in listed if flag == "M"]
    assert len(changed) == 23
    assert {rel for flag, rel in listed if flag == "A"} == {
        "rollouts/multiply-harbor-strands/multiply_harbor_task/tests/test.sh",
        "rollouts/multiply-harbor-strands/multiply_harbor_task/instruction.md",
    }
    after = snapshot(reference_ws)
    for rel in changed:
        assert after[rel + ".orig"] == before[rel], rel  # the original, byte for byte
        assert after[rel] != before[rel]
    untouched = set(before) - set(changed)
    assert all(after[rel] == before[rel] for rel in untouched)
    assert "data/multiply.jsonl" in untouched
    assert "rollouts/my-rollout/README.md" in untouched
    for rel in after:
        if rel.endswith(".py"):
            ast.parse(after[rel])
            assert b"from osmosis_ai" not in after[rel], rel


@pytest.mark.parametrize("config", LOCAL_CONFIGS)
def test_every_migrated_config_validates(shared_ws, osmosis_exe, clean_env, config):
    text = (shared_ws / config).read_text()
    assert text.startswith("# osmosis run config, migrated from osmosis-ai")
    r = osmosis(osmosis_exe, "validate", config, cwd=shared_ws, env=clean_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok    config" in r.stdout


@pytest.mark.together
@pytest.mark.skipif(not installed("osmosis_harbor"), reason="osmosis-harbor is not installed")
def test_harbor_configs_validate(shared_ws, osmosis_exe, clean_env):
    for config in HARBOR_CONFIGS:
        r = osmosis(osmosis_exe, "validate", config, cwd=shared_ws, env=clean_env)
        assert r.returncode == 0, r.stdout + r.stderr


def test_harbor_settings_come_from_the_backend_call(shared_ws):
    text = (shared_ws / "configs/eval/multiply-harbor-strands.toml").read_text()
    assert 'backend = "harbor"' in text
    assert 'task_dir = "rollouts/multiply-harbor-strands/multiply_harbor_task"' in text
    assert "n_concurrent = 4" in text
    assert "keep_successful_trials = false" in text
    assert 'mode = "template"' in text
    main = (shared_ws / "rollouts/multiply-harbor-strands/main.py").read_text()
    assert "from osmosis_harbor import HarborBackend" in main
    assert "workflow_config = multiply_workflow_config\ngrader_config = multiply_grader_config\n" in main
    test_sh = shared_ws / "rollouts/multiply-harbor-strands/multiply_harbor_task/tests/test.sh"
    assert "exec bash /tests/osmosis-grade.sh" in test_sh.read_text()
    assert test_sh.stat().st_mode & 0o111


def test_plain_python_rollout_runs_on_the_stub_policy(shared_ws, osmosis_exe, clean_env):
    r = osmosis(
        osmosis_exe,
        "run",
        "configs/eval/multiply-custom.toml",
        "--stub-policy",
        "--output",
        "out-plain",
        cwd=shared_ws,
        env=clean_env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    results = lines(shared_ws / "out-plain" / "results.jsonl")
    assert len(results) == 12  # [evaluation] limit = 6, n = 2
    assert all(x["status"] == "success" and x["reward"] == 1.0 for x in results), results[0]
    assert results[0]["metrics"] == {"turns": 2}
    run = (shared_ws / "out-plain" / "config.toml").read_text()
    assert "concurrency = 4" in run
    assert "n_samples = 2" in run


@pytest.mark.together
@pytest.mark.skipif(not installed("osmosis_openai_agents"), reason="osmosis-openai-agents is not installed")
def test_openai_agents_rollout_runs_without_its_memory_session(shared_ws, osmosis_exe, clean_env):
    main = (shared_ws / "rollouts/multiply-local-openai/main.py").read_text()
    assert "OsmosisMemorySession" not in main
    assert "session=" not in main
    r = osmosis(
        osmosis_exe,
        "run",
        "configs/eval/multiply-local-openai.toml",
        "--stub-policy",
        "--output",
        "out-openai",
        cwd=shared_ws,
        env=clean_env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    results = lines(shared_ws / "out-openai" / "results.jsonl")
    assert len(results) == 4, results[0]
    assert all(x["reward"] == 1.0 for x in results), results[0]


@pytest.mark.together
@pytest.mark.skipif(not installed("osmosis_strands"), reason="osmosis-strands is not installed")
def test_strands_rollout_runs(shared_ws, osmosis_exe, clean_env):
    r = osmosis(
        osmosis_exe,
        "run",
        "configs/eval/multiply-local-strands.toml",
        "--stub-policy",
        "--limit",
        "2",
        "--output",
        "out-strands",
        cwd=shared_ws,
        env=clean_env,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_server_script_still_serves_but_imports_without_the_server_plugin(shared_ws):
    main = (shared_ws / "rollouts/my-rollout/main.py").read_text()
    top = main[: main.index("class MyAgentWorkflow")]
    assert "uvicorn" not in top
    assert "osmosis_server" not in top
    assert "def main() -> None:\n    import uvicorn\n    from osmosis_server import create_app\n" in main
    assert "app = create_app(backend=backend)" in main


def test_migrate_twice_is_a_no_op(migrated_ws, osmosis_exe, clean_env):
    before = snapshot(migrated_ws)
    r = osmosis(osmosis_exe, "migrate", cwd=migrated_ws, env=clean_env)
    assert r.returncode == 0, r.stderr
    assert "nothing to change" in r.stdout
    assert "---" not in r.stdout
    r = osmosis(osmosis_exe, "migrate", "--write", cwd=migrated_ws, env=clean_env)
    assert r.returncode == 0, r.stderr
    assert "nothing to change" in r.stdout, r.stderr
    assert snapshot(migrated_ws) == before


def test_an_unmappable_config_key_is_reported_and_kept(reference_ws, osmosis_exe, clean_env):
    config = reference_ws / "configs/eval/multiply-custom.toml"
    config.write_text(config.read_text().replace("[evaluation]\n", "[evaluation]\nwarmup_rows = 3\n"))
    r = osmosis(osmosis_exe, "migrate", "--write", cwd=reference_ws, env=clean_env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "configs/eval/multiply-custom.toml: [evaluation] warmup_rows = 3: not a setting osmosis has" in out
    assert "configs/training/my-rollout.toml: [training] lr = 1e-06: a trainer setting" in out
    assert "configs/eval/multiply-custom.toml: [env] LOG_LEVEL" in out
    assert 'configs/eval/my-rollout.toml: [experiment] dataset = "my-dataset": a platform dataset name' in out
    new = config.read_text()
    assert "#   [evaluation] warmup_rows = 3: not a setting osmosis has" in new  # kept in the file too
    assert 'path = "data/multiply.jsonl"' in new  # the platform dataset "multiply" found as data/multiply.jsonl
    assert "warmup_rows = 3" in (reference_ws / "configs/eval/multiply-custom.toml.orig").read_text()


def test_a_name_without_equivalent_is_reported_with_file_and_line(reference_ws, osmosis_exe, clean_env):
    extra = reference_ws / "rollouts/multiply-custom/outcomes.py"
    extra.write_text(
        textwrap.dedent(
            '''\
            """Helpers for the server's outcomes."""

            from osmosis_ai.rollout import AgentWorkflow, ExecutionOutcome, RolloutErrorCategory


            def failed_on_http(outcome: ExecutionOutcome) -> bool:
                return outcome.result.err_category == RolloutErrorCategory.HTTP_ERROR
            '''
        )
    )
    r = osmosis(osmosis_exe, "migrate", "--write", cwd=reference_ws, env=clean_env)
    assert r.returncode == 0, r.stderr
    assert (
        "rollouts/multiply-custom/outcomes.py:3: ExecutionOutcome: not offered, because a backend reports" in r.stdout
    )
    assert "outcomes.py:8: RolloutErrorCategory.HTTP_ERROR: osmosis splits it" in r.stdout
    text = extra.read_text().splitlines()
    assert text[2] == f"from osmosis_ai.rollout import ExecutionOutcome  {LEFTOVER_MARK}"
    assert text[3] == "from osmosis_core import AgentWorkflow, ErrorCategory"
    again = osmosis(osmosis_exe, "migrate", cwd=reference_ws, env=clean_env)
    assert again.returncode == 0
    assert "nothing to change" in again.stdout
    assert "outcomes.py:3: ExecutionOutcome" in again.stdout  # still reported, still not dropped


def test_an_existing_backup_stops_the_write_before_anything_is_written(reference_ws, osmosis_exe, clean_env):
    (reference_ws / "rollouts/my-rollout/main.py.orig").write_text("an older backup\n")
    before = snapshot(reference_ws)
    r = osmosis(osmosis_exe, "migrate", "--write", cwd=reference_ws, env=clean_env)
    assert r.returncode == 1
    assert "nothing was written" in r.stderr
    assert "rollouts/my-rollout/main.py.orig exists" in r.stderr
    assert snapshot(reference_ws) == before


def test_a_folder_that_is_not_an_osmosis_ai_workspace_exits_1(tmp_path, osmosis_exe, clean_env):
    (tmp_path / "notes.txt").write_text("nothing here\n")
    r = osmosis(osmosis_exe, "migrate", str(tmp_path), cwd=tmp_path, env=clean_env)
    assert r.returncode == 1
    assert "is not an osmosis-ai workspace" in r.stderr
    r = osmosis(osmosis_exe, "migrate", str(tmp_path / "missing"), cwd=tmp_path, env=clean_env)
    assert r.returncode == 1
    assert "not a folder" in r.stderr


def test_libcst_is_imported_only_when_a_python_file_is_migrated(tmp_path):
    """``osmosis --help`` loads the plugin and the package; libcst (about half a second) waits for a file."""
    (tmp_path / "main.py").write_text("from osmosis_ai.rollout import AgentWorkflow\n")
    script = (
        "import sys, osmosis_migrate, osmosis_migrate.plugin, osmosis_migrate.migrate_cmd\n"
        "assert 'libcst' not in sys.modules, 'libcst imported before any file was migrated'\n"
        f"osmosis_migrate.plan_migration({str(tmp_path)!r})\n"
        "assert 'libcst' in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_help_has_an_example(osmosis_exe, clean_env, tmp_path):
    r = osmosis(osmosis_exe, "migrate", "--help", cwd=tmp_path, env=clean_env)
    assert r.returncode == 0
    assert "osmosis migrate my-workspace --write" in r.stdout


# -- the name map itself (in-process: it imports the osmosis modules it points to) ------------------


def _documented() -> list:
    """Each documented name; one that maps into another first-party plugin is checked in plugins_all."""
    out = []
    for module, name in documented_names():
        result = resolve_name(module, name)
        other = isinstance(result, Target) and result.distribution != "osmosis-core"
        out.append(pytest.param(module, name, marks=[pytest.mark.together] if other else []))
    return out


@pytest.mark.parametrize(("module", "name"), _documented(), ids=lambda v: v)
def test_every_documented_name_maps_to_an_importable_name_or_says_why_not(module, name):
    result = resolve_name(module, name)
    if isinstance(result, NotOffered):
        assert len(result.why) > 20
        return
    assert isinstance(result, Target)
    if not installed(result.module):
        pytest.skip(f"{result.distribution} is not installed")
    assert hasattr(importlib.import_module(result.module), result.name), result


def test_the_reference_client_goes_to_the_trainer_side_distribution():
    """osmosis-ai's RolloutClient is a trainer's: osmosis-trainer (osmosis_server.RolloutClient is deprecated)."""
    target = Target("osmosis_trainer", "RolloutClient", "osmosis-trainer")
    assert resolve_name("osmosis_ai.rollout.client", "RolloutClient") == target


def test_migrating_md_lists_every_documented_name_and_where_it_went():
    text = MIGRATING.read_text()
    for module, name in documented_names():
        result = resolve_name(module, name)
        assert f"`{name}`" in text, name
        if isinstance(result, Target):
            rows = [line for line in text.splitlines() if line.startswith(f"| `{name}`")]
            assert any(f"`{result.module}.{result.name}`" in row for row in rows), (name, rows)


def test_python_rewrite_keeps_what_it_does_not_understand_and_is_idempotent():
    source = textwrap.dedent(
        """\
        import osmosis_ai.rollout as r
        from osmosis_ai.rollout import AgentWorkflowOutput  # the output

        __all__ = ["AgentWorkflowOutput"]  # the old name must stay bound


        def make():
            return r.AgentWorkflowOutput(messages=[]), AgentWorkflowOutput(messages=[])
        """
    )
    first = migrate_python("x.py", source)
    assert first.new_text.splitlines()[:2] == [
        "import osmosis_core as r",
        "from osmosis_core import RolloutSample as AgentWorkflowOutput  # the output",
    ]
    assert "r.RolloutSample(messages=[])" in first.new_text
    assert migrate_python("x.py", first.new_text).new_text == first.new_text


def test_crlf_files_keep_their_line_endings(tmp_path):
    main = tmp_path / "rollouts" / "r" / "main.py"
    main.parent.mkdir(parents=True)
    main.write_bytes(b"from osmosis_ai.rollout import AgentWorkflow\r\n\r\nx = 1\r\n")
    (change,) = plan_migration(tmp_path).changes
    assert change.new == "from osmosis_core import AgentWorkflow\r\n\r\nx = 1\r\n"


def test_comments_and_odd_formatting_around_the_edits_survive():
    """Only what is migrated changes: comments (in and around an import, after an argument, in a call
    losing its session=), odd spacing, a semicolon line and a parenthesised attribute stay as written."""
    source = textwrap.dedent(
        '''\
        #!/usr/bin/env python
        # -*- coding: utf-8 -*-
        """A rollout with comments everywhere and odd formatting."""
        import os ,  sys   # two at once
        from osmosis_ai.rollout import (  # the API
            AgentWorkflow,      # the agent

            # the output, renamed
            AgentWorkflowOutput ,
            get_rollout_context,
        )
        from agents import Agent, Runner
        from osmosis_ai.rollout.integrations.agents.openai_agents import OsmosisMemorySession


        class  Flow( AgentWorkflow ) :   # spaces inside
            async def run(self, ctx):
                c = get_rollout_context()
                url = c.chat_completions_url  # the endpoint
                key = (
                    c .api_key
                )
                out = AgentWorkflowOutput(messages = [  # kept
                    1,2,3,
                ])
                return await Runner.run(
                    Agent("a"),
                    "hi",   # the prompt
                    session=OsmosisMemorySession(),
                    max_turns = 3 ,  # odd spacing
                )
        x = [1,
             2]  ;  y = 3
        '''
    )
    new = migrate_python("x.py", source).new_text
    assert new == textwrap.dedent(
        '''\
        #!/usr/bin/env python
        # -*- coding: utf-8 -*-
        """A rollout with comments everywhere and odd formatting."""
        import os ,  sys   # two at once
        from osmosis_core import (  # the API
            AgentWorkflow,  # the agent
            # the output, renamed
            RolloutSample,
            get_rollout_context,
        )
        from agents import Agent, Runner


        class  Flow( AgentWorkflow ) :   # spaces inside
            async def run(self, ctx):
                c = get_rollout_context()
                url = c.policy.base_url  # the endpoint
                key = (
                    c .policy.api_key
                )
                out = RolloutSample(messages = [  # kept
                    1,2,3,
                ])
                return await Runner.run(
                    Agent("a"),
                    "hi",   # the prompt
                    max_turns = 3 ,  # odd spacing
                )
        x = [1,
             2]  ;  y = 3
        '''
    )
    assert migrate_python("x.py", new).new_text == new


def test_a_block_whose_only_statement_was_a_dropped_import_still_parses():
    source = (
        "if True:\n"
        "    from osmosis_ai.rollout.integrations.agents.openai_agents import OsmosisMemorySession\n"
        "R.run(a, session=OsmosisMemorySession())\n"
    )
    assert migrate_python("x.py", source).new_text == "if True:\n    pass\nR.run(a)\n"


def test_a_form_feed_between_functions_does_not_move_the_edits():
    """Python counts lines at newlines only; str.splitlines also splits at a form feed."""
    source = "from osmosis_ai.rollout import AgentWorkflowOutput\n\x0c\ndef f():\n    return AgentWorkflowOutput\n"
    new = migrate_python("x.py", source).new_text
    assert new == "from osmosis_core import RolloutSample\n\x0c\ndef f():\n    return RolloutSample\n"


# -- a hostile workspace: FIFOs, unreadable and binary files, symlinks ---------------------------------


def _without_file_capabilities() -> list[str]:
    """A prefix that runs a command without the capabilities that let root read any file (so a mode 000
    file is unreadable to it, as to anyone else); nothing when not root."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is needed to drop root's file capabilities")
    return [setpriv, "--inh-caps=-all", "--bounding-set=-all"]


@pytest.fixture
def hostile_ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    rollout = ws / "rollouts" / "r"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text("from osmosis_ai.rollout import AgentWorkflow\n")
    os.mkfifo(rollout / "helper.py")  # nobody ever writes it: opening it for reading blocks for ever
    secret = rollout / "secret.py"
    secret.write_text("from osmosis_ai.rollout import AgentWorkflow\n")
    secret.chmod(0)
    binary = ws / "rollouts" / "b" / "main.py"
    binary.parent.mkdir()
    binary.write_bytes(b"\x00\xff\xfeimport osmosis_ai\n")
    (ws / "shared.py").write_text("from osmosis_ai.rollout import AgentWorkflow\n")
    (rollout / "link.py").symlink_to("../../shared.py")
    return ws


def test_a_hostile_workspace_finishes_and_lists_every_file_it_could_not_read(hostile_ws, osmosis_exe, clean_env):
    r = subprocess.run(
        [*_without_file_capabilities(), osmosis_exe, "migrate", "--no-diff"],
        cwd=hostile_ws,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=60,  # the FIFO used to block open() for ever
    )
    assert r.returncode == 3, r.stdout + r.stderr
    out = r.stdout
    assert "M rollouts/r/main.py" in out
    assert "M shared.py" in out  # the readable files are still migrated
    assert "could not read (3), each with why" in out
    assert "rollouts/r/helper.py: a FIFO (named pipe): not a regular file: not opened" in out
    assert "rollouts/r/secret.py: could not be opened: Permission denied (EACCES)" in out
    assert "rollouts/b/main.py: not UTF-8 text: byte 0x00" not in out  # NUL is valid UTF-8: the 0xff is not
    assert "rollouts/b/main.py: not UTF-8 text: byte 0xff at offset 1 is not UTF-8; it names osmosis-ai" in out
    assert "symlinks left alone (1)" in out
    assert "rollouts/r/link.py: a symlink to ../../shared.py" in out
    assert "3 file(s) could not be read" in r.stderr
    assert "Traceback" not in r.stderr


def test_write_with_unreadable_files_writes_the_rest_and_exits_3(hostile_ws, osmosis_exe, clean_env):
    (hostile_ws / "rollouts" / "r" / "secret.py").unlink()
    r = osmosis(osmosis_exe, "migrate", "--write", cwd=hostile_ws, env=clean_env, timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    assert (hostile_ws / "rollouts/r/main.py").read_text() == "from osmosis_core import AgentWorkflow\n"
    assert (hostile_ws / "rollouts/r/link.py").is_symlink()
    assert stat.S_ISFIFO((hostile_ws / "rollouts/r/helper.py").lstat().st_mode)
    assert (hostile_ws / "rollouts/b/main.py").read_bytes() == b"\x00\xff\xfeimport osmosis_ai\n"


def test_a_workspace_whose_only_osmosis_ai_file_is_unreadable_says_so(tmp_path, osmosis_exe, clean_env):
    (tmp_path / "main.py").write_bytes(b"\xffimport osmosis_ai\n")
    with open(tmp_path / "big.py", "wb") as handle:
        handle.truncate(17 * 1024 * 1024)  # sparse: costs no disk
    r = osmosis(osmosis_exe, "migrate", str(tmp_path), cwd=tmp_path, env=clean_env)
    assert r.returncode == 1
    assert "main.py: not UTF-8 text: byte 0xff at offset 0" in r.stdout
    assert "big.py: too large: 17,825,792 bytes > the limit of 16,777,216: not read" in r.stdout
    assert "found in the files it could read; 2 file(s) could not be read" in r.stderr


def test_reading_checks_the_open_file_not_the_name(tmp_path):
    """A FIFO or symlink put where the listing saw a regular file is refused without blocking."""
    from osmosis_migrate.workspace import _read_text, _Unreadable

    fifo = tmp_path / "helper.py"
    os.mkfifo(fifo)
    with pytest.raises(_Unreadable, match="FIFO"):
        _read_text(fifo)
    (tmp_path / "link.py").symlink_to(fifo)
    with pytest.raises(_Unreadable, match="symlink"):
        _read_text(tmp_path / "link.py")


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ('from osmosis_ai import Grader\nx = "\\N{NOPE}"\n', 2),  # libcst parses it, Python does not compile it
        ("from osmosis_ai import Grader\ndef f(:\n", 2),
        ("from osmosis_ai import Grader\nx = 1\0\n", 1),
    ],
)
def test_a_file_python_cannot_compile_is_a_syntax_error_finding_not_a_crash(source, line):
    migration = migrate_python("bad.py", source)
    assert migration.new_text == source  # left as it is
    [finding] = migration.unmapped
    assert (finding.path, finding.line, finding.subject) == ("bad.py", line, "syntax error"), finding
