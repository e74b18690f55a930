"""The CLI a click user expects: usage errors blame what the user typed, and `--help` cuts nothing short."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from osmosis_core._engine.config import config_from_dict
from osmosis_core.errors import ConfigError


def osmosis(exe: str, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("command", ["run", "validate"])
def test_no_config_is_clicks_missing_argument(osmosis_exe, clean_env, tmp_path, command):
    r = osmosis(osmosis_exe, command, cwd=tmp_path, env=clean_env)
    assert r.returncode == 2, r.stderr
    assert "Error: Missing argument 'CONFIG'." in r.stderr
    assert "invalid config" not in r.stderr
    assert f"Usage: osmosis {command} [OPTIONS] CONFIG" in r.stderr


def test_a_bad_flag_value_blames_the_flag_not_the_config(workspace, osmosis_exe, clean_env):
    config = "configs/eval/multiply-plain.toml"
    r = osmosis(osmosis_exe, "run", config, "--backend", "loacl", "--stub-policy", cwd=workspace, env=clean_env)
    assert r.returncode == 2, r.stderr
    assert "Error: Invalid value for '--backend': unknown backend 'loacl' (did you mean 'local'?)" in r.stderr
    assert config not in r.stderr
    assert "invalid config" not in r.stderr
    assert "stand-in" not in r.stderr  # refused before anything started
    r = osmosis(osmosis_exe, "validate", config, "--policy-url", "ftp://x", cwd=workspace, env=clean_env)
    assert r.returncode == 2, r.stderr
    assert "Error: Invalid value for '--policy-url': must start with http:// or https://, got 'ftp://x'" in r.stderr
    assert config not in r.stderr


def test_a_mistyped_key_or_backend_in_the_file_names_the_right_one(workspace, osmosis_exe, clean_env):
    path = workspace / "configs" / "eval" / "multiply-plain.toml"
    text = path.read_text()
    path.write_text(text.replace("concurrency = 8", "concurency = 8"))
    r = osmosis(osmosis_exe, "run", str(path), "--stub-policy", cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert "unknown key(s): concurency (did you mean 'concurrency'?) @ $.run" in r.stderr
    path.write_text(text.replace('backend = "local"', 'backend = "lcoal"'))
    r = osmosis(osmosis_exe, "validate", str(path), cwd=workspace, env=clean_env)
    assert r.returncode == 1
    assert f"{path}: invalid config" in r.stderr
    [problem] = [line.strip() for line in r.stderr.splitlines() if "unknown backend" in line]
    assert problem.startswith("unknown backend 'lcoal' (did you mean 'local'?); known backends: ")
    assert problem.endswith(" @ $.run.backend")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"polcy": {}}, "unknown key(s): polcy (did you mean 'policy'?) @ $"),
        ({"run": {"n_sample": 2}}, "unknown key(s): n_sample (did you mean 'n_samples'?) @ $.run"),
        (
            {"run": {"concurency": 2, "wrkers": 2}},
            "unknown key(s): concurency, wrkers (did you mean: concurency -> concurrency, wrkers -> workers?) @ $.run",
        ),
        ({"run": {"bogus": 1}}, "unknown key(s): bogus @ $.run"),  # nothing close: no guess
        ({"policy": {"api_key": "sk-x"}}, "unknown key(s): api_key (put the key in an environment variable"),
    ],
)
def test_typo_hints_for_config_keys(data, message):
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"rollout": {"path": "r"}, **data})
    assert message in caught.value.problems[0]


COMMAND_LINE = re.compile(r"^  (\S+)\s+(.*)$")


def command_rows(help_text: str) -> dict[str, str]:
    """The Commands section of a group's --help: name -> description (continuation lines joined)."""
    rows: dict[str, str] = {}
    section = help_text.split("Commands:", 1)[1]
    name = None
    for line in section.splitlines():
        match = COMMAND_LINE.match(line)
        if match:
            name = match.group(1)
            rows[name] = match.group(2).strip()
        elif name is not None and line.strip():
            rows[name] += " " + line.strip()
    return rows


@pytest.mark.parametrize("columns", ["60", "80", "200"])
def test_help_cuts_no_command_description_mid_phrase(osmosis_exe, clean_env, tmp_path, columns):
    """click cuts a command's first docstring line to fit the width and ends it in "..."; every command
    (with the plugins installed in this environment) has a short help of its own instead."""
    env = {**clean_env, "COLUMNS": columns}
    for group in ([], ["template"]):
        r = osmosis(osmosis_exe, *group, "--help", cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        rows = command_rows(r.stdout)
        assert {"run", "validate", "plugins", "template"} <= set(rows) or group
        for name, description in rows.items():
            assert not description.endswith("..."), (group, name, description)
            assert description.endswith((".", ")")), (group, name, description)
