"""Harbor tasks in their own images, without Docker: real buildah builds, real overlays, real trials.

Every build here is real (buildah, bases made by mmdebstrap from Debian's archive), cached once for
the session in one image cache; trials run through ``osmosis run`` (dataset mode) or Harbor's own
CLI with the oracle agent. Marker ``images`` (the ``images`` nox session): they need root,
buildah, mmdebstrap and Debian's package archive.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harbor_helpers import HERE, TASKS_DIR, osmosis, sandbox_processes

from osmosis_core.testing import ScriptedPolicyServer

pytestmark = [pytest.mark.images, pytest.mark.timeout(900)]

IMAGE_TASKS = TASKS_DIR / "images"
SHELL_AGENT = HERE / "rollouts" / "shell_agent"

if os.geteuid() != 0 or not shutil.which("buildah") or not shutil.which("mmdebstrap"):
    pytest.skip("task images need root, buildah and mmdebstrap", allow_module_level=True)

from osmosis_harbor.bwrap import python_paths, sandbox_id_base  # noqa: E402
from osmosis_harbor.image_sandbox import ImageSandbox  # noqa: E402
from osmosis_harbor.images import BaseUnavailable, ImageBuildError, ImageCache  # noqa: E402
from osmosis_harbor.runtime import runtime_for  # noqa: E402


def _shell_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("shell_agent_script", SHELL_AGENT / "shell_agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.script


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One image cache for the session (``OSMOSIS_TEST_IMAGE_CACHE`` keeps one across sessions)."""
    given = os.environ.get("OSMOSIS_TEST_IMAGE_CACHE")
    return Path(given) if given else tmp_path_factory.mktemp("image-cache")


@pytest.fixture(scope="session")
def cache(cache_dir) -> ImageCache:
    return ImageCache(cache_dir, id_base=sandbox_id_base())


def _config(tmp_path: Path, url: str, cache_dir: Path, *, extra: str = "", concurrency: int = 4) -> Path:
    (tmp_path / "configs").mkdir(exist_ok=True)
    config = tmp_path / "configs" / "images.toml"
    config.write_text(
        f"""
[rollout]
path = "{SHELL_AGENT}"
entrypoint = "shell_agent.py"

[dataset]
path = "{tmp_path / "data.jsonl"}"

[policy]
base_url = "{url}"
model = "osmosis-stub"

[run]
backend = "harbor"
concurrency = {concurrency}
agent_timeout_sec = 300

[backend.harbor]
mode = "dataset"
dataset_dir = "{tmp_path / "tasks"}"

[backend.harbor.sandbox]
image_cache = "{cache_dir}"
{extra}
"""
    )
    return config


def _rows(tmp_path: Path, rows: list[dict]) -> None:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _results(run_dir: Path) -> dict[int, dict]:
    return {r["row"]: r for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())}


def test_a_task_runs_in_its_own_built_image_and_its_verifier_uses_the_images_tools(tmp_path, cache_dir, cache):
    shutil.copytree(IMAGE_TASKS, tmp_path / "tasks")
    with socket.socket() as listener:  # a host loopback port the no-network trial must not reach
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        instruction = tmp_path / "tasks" / "nonet" / "instruction.md"
        instruction.write_text(instruction.read_text().replace("HOST_PORT", str(port)))
        _rows(
            tmp_path,
            [
                {"task": "tool", "user_prompt": "-"},
                {"task": "tool", "user_prompt": "-", "system_prompt": "Do nothing."},
                {"task": "daemon", "user_prompt": "-"},
                {"task": "apt", "user_prompt": "-"},
                {"task": "nonet", "user_prompt": "-"},
                {"task": "user", "user_prompt": "-"},
            ],
        )
        with ScriptedPolicyServer(_shell_script()) as server:
            config = _config(tmp_path, server.url, cache_dir)
            run = osmosis("run", str(config), "--output", str(tmp_path / "runs/a"), cwd=tmp_path, timeout=800)
    assert run.returncode == 0, run.stdout + run.stderr
    results = _results(tmp_path / "runs/a")
    tool, nothing, daemon, apt, nonet, user = (results[i] for i in range(6))
    # the image's own tool, in its WORKDIR with its Env; no host tool, no build-context file it did not COPY
    assert (tool["status"], tool["reward"]) == ("success", 1.0), tool
    assert tool["metrics"]["harbor_rewards"] == {
        "reward": 1, "answer": 1, "workdir": 1, "env": 1, "host_tools_hidden": 1, "secret_absent": 1,
    }  # fmt: skip
    assert (nothing["status"], nothing["reward"]) == ("success", 0.0), nothing  # without the work: 0
    assert nothing["metrics"]["harbor_rewards"]["host_tools_hidden"] == 1
    assert (daemon["status"], daemon["reward"]) == ("success", 1.0), daemon  # the agent's daemon outlived its command
    assert (apt["status"], apt["reward"]) == ("success", 1.0), apt  # apt-get in a trial; no mknod, no /proc/sys
    assert (nonet["status"], nonet["reward"]) == ("success", 1.0), nonet  # its policy, and nothing else
    assert (user["status"], user["reward"]) == ("success", 1.0), user  # the image's USER: the runner, the verifier
    assert not sandbox_processes("print('ready', flush=True)")  # every trial's holder is gone
    assert not _overlays_mounted()


def _overlays_mounted() -> list[str]:
    """Any trial overlay still mounted, in any process's mount namespace."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "mountinfo").read_text()
            except OSError:
                continue
            found += [f"{entry.name}: {line}" for line in text.splitlines() if "osmosis-trial" in line]
    return found


def _mounted_under(folder: Path) -> list[str]:
    """Mounts in this mount namespace at or under ``folder``."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in lines if line.split()[4].startswith(str(folder))]


def test_harbors_own_cli_runs_the_oracle_on_a_built_image(tmp_path, cache_dir):
    """1 with the task's oracle solution, 0 with Harbor's nop agent: the verifier's tools are the image's."""
    harbor = shutil.which("harbor", path=str(Path(sys.executable).parent))
    assert harbor is not None
    rewards = {}
    for agent in ("oracle", "nop"):
        proc = subprocess.run(
            [
                harbor, "run", "-p", str(IMAGE_TASKS / "tool"), "-a", agent,
                "-e", "osmosis_harbor.sandbox:BubblewrapEnvironment", "--ek", "image=build",
                "--ek", f"image_cache={cache_dir}", "-o", str(tmp_path / "jobs"), "--job-name", agent, "-y", "-q",
            ],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        [trial] = [t for t in (tmp_path / "jobs" / agent).iterdir() if t.is_dir()]
        result = json.loads((trial / "result.json").read_text())
        assert result["exception_info"] is None, result["exception_info"]
        rewards[agent] = result["verifier_result"]["rewards"]
    assert rewards["oracle"]["reward"] == 1
    assert rewards["oracle"]["host_tools_hidden"] == 1
    assert rewards["nop"]["reward"] == 0


def test_the_cache_builds_a_key_once_and_again_only_when_the_dockerfile_or_context_changes(tmp_path, cache):
    task = tmp_path / "task"
    shutil.copytree(IMAGE_TASKS / "daemon" / "environment", task)
    # a key no earlier session built (OSMOSIS_TEST_IMAGE_CACHE keeps a cache across sessions)
    (task / "Dockerfile").write_text(
        f"FROM debian:13-slim\nRUN echo {os.urandom(6).hex()} > /one.txt\nCOPY data.txt /data.txt\n"
    )
    (task / "data.txt").write_text("first\n")
    (task / "ignored.log").write_text("not in the build\n")
    (task / ".dockerignore").write_text("*.log\n")
    # two processes at once want the same new key: one builds, the other waits and takes it
    code = (
        "import sys; from pathlib import Path; from osmosis_harbor.images import ImageCache; "
        f"c = ImageCache(Path({str(cache.root)!r}), id_base={cache.id_base}); "
        f"print(c.build(Path({str(task)!r}), progress=lambda m: print('PROGRESS', m)).key)"
    )
    both = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in both]
    assert all(p.returncode == 0 for p in both), outs
    keys = {out.strip().splitlines()[-1] for out in outs}
    assert len(keys) == 1, outs
    assert sum(out.count("PROGRESS building the image") for out in outs) == 1, outs
    [key] = keys
    image = cache.get(key)
    assert (image.rootfs / "data.txt").read_text() == "first\n"
    assert (image.rootfs / "etc" / "os-release").read_text().count("trixie") >= 1  # debian:13-slim is trixie
    # a second build builds nothing; a file .dockerignore leaves out changes nothing
    (task / "ignored.log").write_text("changed\n")
    started = time.monotonic()
    assert cache.build(task).key == key
    assert time.monotonic() - started < 5
    # a context file or the Dockerfile changed: another key, built; the first one untouched
    (task / "data.txt").write_text("second\n")
    changed = cache.build(task)
    assert changed.key != key
    assert (changed.rootfs / "data.txt").read_text() == "second\n"
    assert (image.rootfs / "data.txt").read_text() == "first\n"
    (task / "Dockerfile").write_text((task / "Dockerfile").read_text() + "RUN echo two > /two.txt\n")
    assert cache.build(task).key not in (key, changed.key)
    assert not list((cache.root / "tmp").iterdir())  # nothing unfinished left
    assert not _mounted_under(cache.root)  # and nothing of the builds' mounted


def test_a_base_osmosis_cannot_make_fails_naming_the_ways_out_and_runs_when_given(tmp_path, cache):
    task = tmp_path / "py"
    task.mkdir()
    (task / "Dockerfile").write_text("FROM python:3.12-slim\nRUN echo made > /made.txt\nWORKDIR /srv\n")
    fresh = ImageCache(tmp_path / "cache", id_base=cache.id_base)  # nothing given yet, nothing tagged
    with pytest.raises(BaseUnavailable) as failed:
        fresh.build(task)
    message = str(failed.value)
    assert f"{task / 'Dockerfile'}:1" in message
    assert "'python:3.12-slim' cannot be made here" in message
    assert "reachable" in message
    assert 'bases = {"python:3.12-slim"' in message
    # the user gives it as a rootfs tarball (here: the session's bookworm base): the build runs on it
    tarball = tmp_path / "py312-rootfs.tar"
    cache.ensure_base("debian:bookworm", where="test")
    cache.export("docker.io/library/debian:bookworm", tmp_path / "base")
    subprocess.run(["tar", "-C", str(tmp_path / "base"), "--numeric-owner", "-cf", str(tarball), "."], check=True)
    given = ImageCache(fresh.root, {"python:3.12-slim": tarball}, cache.id_base)
    image = given.build(task)
    assert (image.rootfs / "made.txt").read_text() == "made\n"
    assert image.workdir == "/srv"
    # or as an OCI archive (what `skopeo copy` or `buildah push ... oci-archive:` write)
    archive = tmp_path / "node-oci.tar"
    cache._buildah("push", "--quiet", "docker.io/library/debian:bookworm", f"oci-archive:{archive}")
    node = tmp_path / "node"
    node.mkdir()
    (node / "Dockerfile").write_text("FROM node:20-slim\nRUN echo from-oci > /oci.txt\n")
    from_archive = ImageCache(fresh.root, {"node:20-slim": archive}, cache.id_base).build(node)
    assert (from_archive.rootfs / "oci.txt").read_text() == "from-oci\n"


def test_a_dockerfile_that_fails_reports_its_build_logs_tail_and_the_run_goes_on(tmp_path, cache_dir):
    shutil.copytree(IMAGE_TASKS / "daemon", tmp_path / "tasks" / "daemon")
    shutil.copytree(IMAGE_TASKS / "daemon", tmp_path / "tasks" / "broken")
    (tmp_path / "tasks" / "broken" / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm\nRUN echo osmosis-broken-step && exit 3\n"
    )
    _rows(tmp_path, [{"task": "broken", "user_prompt": "-"}, {"task": "daemon", "user_prompt": "-"}] * 2)
    with ScriptedPolicyServer(_shell_script()) as server:
        config = _config(tmp_path, server.url, cache_dir)
        run = osmosis("run", str(config), "--output", str(tmp_path / "runs/b"), cwd=tmp_path, timeout=600)
    results = _results(tmp_path / "runs/b")
    for row in (0, 2):
        error = results[row]["error"]
        assert error["category"] == "infra_error", results[row]
        assert "the image of broken failed to build" in error["message"]
        assert "osmosis-broken-step" in error["message"]  # the build log's tail
    assert [results[r]["reward"] for r in (1, 3)] == [1.0, 1.0], run.stdout + run.stderr
    assert run.stderr.count("building the image of broken") == 1  # built (and failed) once for its two rows


def test_fifty_trials_on_one_image_never_see_each_others_writes_nor_change_it(tmp_path, cache):
    image = cache.build(IMAGE_TASKS / "daemon" / "environment")
    runtime = runtime_for(cache.root)

    def listing() -> list[tuple[str, int, int, int]]:
        out = []
        for folder, _, files in os.walk(image.rootfs):
            for name in files:
                info = os.lstat(os.path.join(folder, name))
                out.append((os.path.join(folder, name), info.st_size, info.st_mtime_ns, info.st_mode))
        return sorted(out)

    before = listing()

    async def trials() -> list[str]:
        seen = []
        for number in range(50):
            sandbox = ImageSandbox(image, tmp_path / f"trial-{number}", runtime, runtime_paths=python_paths())
            await sandbox.start()
            try:
                result = await sandbox.run(
                    f"cat /srv/app/mine 2>/dev/null; echo {number} > /srv/app/mine; echo x >> /etc/os-release; "
                    "rm -f /usr/bin/apt"
                )
                seen.append(result.stdout.strip())
            finally:
                await sandbox.close()
        return seen

    seen = asyncio.run(trials())
    assert seen == [""] * 50  # no trial saw the one before's file
    assert listing() == before  # the image itself: not one file changed
    assert (tmp_path / "trial-3" / "upper" / "srv" / "app" / "mine").read_text() == "3\n"  # the trial's writes
    assert not _overlays_mounted()


def test_kill_9_of_the_run_leaves_no_trial_process_and_no_mount(tmp_path, cache_dir):
    shutil.copytree(IMAGE_TASKS / "daemon", tmp_path / "tasks" / "daemon")
    instruction = tmp_path / "tasks" / "daemon" / "instruction.md"
    instruction.write_text(instruction.read_text() + "Run: sleep 600\n")
    _rows(tmp_path, [{"task": "daemon", "user_prompt": "-"}] * 2)
    with ScriptedPolicyServer(_shell_script()) as server:
        config = _config(tmp_path, server.url, cache_dir)
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "osmosis"), "run", str(config), "--output", str(tmp_path / "runs/k")],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(sandbox_processes("sleep 600")) < 2:
            time.sleep(0.2)
        assert len(sandbox_processes("sleep 600")) >= 2, "the trials never started"
        assert _overlays_mounted()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (sandbox_processes("sleep 600") or _overlays_mounted()):
            time.sleep(0.2)
    assert not sandbox_processes("sleep 600")  # the agents' commands, and the daemons they started
    assert not sandbox_processes("tick.new")
    assert not _overlays_mounted()


def test_osmosis_harbor_build_and_cache_commands(tmp_path, cache_dir):
    task = tmp_path / "tasks" / "daemon"
    shutil.copytree(IMAGE_TASKS / "daemon", task)
    with (task / "environment" / "Dockerfile").open("a") as dockerfile:
        dockerfile.write(f"ENV BUILT_FOR={tmp_path.name}\n")  # a key of its own (one image per content)
    built = osmosis("harbor", "build", str(task), "--cache", str(cache_dir), cwd=tmp_path, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    assert f"{task}: " in built.stdout
    assert "workdir /srv/app" in built.stdout
    listed = osmosis("harbor", "cache", "--cache", str(cache_dir), cwd=tmp_path)
    assert str(task / "environment") in listed.stdout
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /elsewhere\n")
    pruned = osmosis("harbor", "cache", "--prune", "--cache", str(cache_dir), cwd=tmp_path)
    assert pruned.returncode == 0, pruned.stderr
    assert str(task / "environment") not in osmosis("harbor", "cache", "--cache", str(cache_dir), cwd=tmp_path).stdout
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "Dockerfile").write_text("FROM ghcr.io/someone/thing:1\n")
    failed = osmosis("harbor", "build", str(broken), "--cache", str(cache_dir), cwd=tmp_path)
    assert failed.returncode == 1
    assert "'ghcr.io/someone/thing:1' cannot be made here" in failed.stderr


def test_an_image_build_error_names_the_task(tmp_path, cache):
    task = tmp_path / "nofrom"
    task.mkdir()
    (task / "Dockerfile").write_text("# nothing\nRUN true\n")
    with pytest.raises(ImageBuildError, match=r"nofrom/Dockerfile: has no FROM line"):
        cache.build(task)


ESCAPE_IMAGE = (
    "FROM debian:bookworm\n"
    "RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*\n"
    "WORKDIR /app\n"
)


def test_the_escape_attempts_fail_on_an_image_built_task_too(probe, tmp_path, cache_dir):
    """test_isolation's escape test, the task on its own image (its verifier's python3 is the image's)."""
    from test_isolation import check_escape_attempts

    check_escape_attempts(probe, tmp_path, dockerfile=ESCAPE_IMAGE, image="build", image_cache=str(cache_dir))


def test_an_ubuntu_base_is_made_from_ubuntus_archive_and_runs_osmosis_own_python(tmp_path, cache):
    """ubuntu:24.04 (glibc 2.39, newer than a Debian 12 host's): made by mmdebstrap from Ubuntu's archive,
    and osmosis's interpreter runs in it through its own loader, whatever the image's libraries."""
    from osmosis_harbor.runtime import RUNTIME_PYTHON, relocated

    task = tmp_path / "noble"
    task.mkdir()
    (task / "Dockerfile").write_text("FROM ubuntu:noble\nRUN echo built > /built.txt\nWORKDIR /srv\n")
    image = cache.build(task)
    paths = ",".join(repr(relocated(p)) for p in python_paths(import_path=True))
    probe = f"import sys; sys.path[:0] = [{paths}]; import osmosis_core, ssl; print('python', sys.version_info[:2])"

    async def run() -> list[str]:
        sandbox = ImageSandbox(image, tmp_path / "trial", runtime_for(cache.root), runtime_paths=python_paths())
        await sandbox.start()
        try:
            release = await sandbox.run(". /etc/os-release; echo $VERSION_ID; cat /built.txt; pwd")
            python = await sandbox.run(f'{RUNTIME_PYTHON} -I -c "{probe}"')
            return [release.stdout, python.stdout + python.stderr]
        finally:
            await sandbox.close()

    release, python = asyncio.run(run())
    assert release.split() == ["24.04", "built", "/srv"]
    assert python.strip() == f"python {sys.version_info[:2]}", python


def test_a_dockerfile_with_heredocs_builds_with_a_buildah_that_reads_them(tmp_path, cache):
    """``RUN <<EOF`` and ``COPY <<EOF``: Debian 12's buildah (1.28) rejects them ("Unknown instruction"),
    so such a Dockerfile is built by buildah >= 1.39 from a trixie tools tree (made once in the cache)."""
    from osmosis_harbor.images import HEREDOC_BUILDAH, _version, uses_heredocs

    task = tmp_path / "heredoc"
    task.mkdir()
    (task / "Dockerfile").write_text(
        "FROM debian:bookworm\n"
        "RUN <<EOT\nset -e\necho 'from a heredoc' > /heredoc.txt\necho second line >> /heredoc.txt\nEOT\n"
        "COPY <<EOT /etc/greeting\nhello heredoc\nEOT\n"
        "WORKDIR /app\n"
    )
    assert uses_heredocs(task / "Dockerfile")
    image = cache.build(task)
    assert (image.rootfs / "heredoc.txt").read_text() == "from a heredoc\nsecond line\n"
    assert (image.rootfs / "etc" / "greeting").read_text() == "hello heredoc\n"
    assert image.workdir == "/app"
    if _version(cache._builder(None)) < HEREDOC_BUILDAH:  # this machine's buildah
        assert (cache.root / "tools" / "trixie" / "usr" / "bin" / "buildah").is_file()
    assert not _mounted_under(cache.root)

    async def run() -> str:
        sandbox = ImageSandbox(image, tmp_path / "trial", runtime_for(cache.root), runtime_paths=python_paths())
        await sandbox.start()
        try:
            return (await sandbox.run("cat /heredoc.txt /etc/greeting; pwd")).stdout
        finally:
            await sandbox.close()

    assert asyncio.run(run()).split("\n")[:4] == ["from a heredoc", "second line", "hello heredoc", "/app"]
