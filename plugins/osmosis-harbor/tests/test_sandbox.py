"""The bubblewrap sandbox itself: limits, a read-only host, per-command namespaces, safe file transfer."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import anyio
import pytest
from harbor_helpers import sandbox_processes

from osmosis_harbor.bwrap import CommandTimeout, Sandbox, SandboxStartError, python_paths, sandbox_id_base
from osmosis_harbor.limits import Limits
from osmosis_harbor.safetree import SafeTree, SymlinkRefused


def _sandbox(tmp_path, **kwargs) -> Sandbox:
    sandbox = Sandbox(tmp_path / "root", expose=python_paths(), **kwargs)
    sandbox.prepare(["/app", "/logs/agent"])
    return sandbox


def _run(sandbox: Sandbox, command: str, **kwargs):
    async def main():
        try:
            return await sandbox.run(command, **kwargs)
        finally:
            await sandbox.close()

    return anyio.run(main)


def test_each_command_gets_a_fresh_locked_down_sandbox_over_the_trials_own_files(tmp_path, monkeypatch):
    monkeypatch.setenv("OSMOSIS_TEST_SECRET", "s3cret")
    sandbox = _sandbox(tmp_path)
    script = (
        "echo kept > /app/note; touch /usr/osmosis-x 2>&1; echo pid=$$; hostname; id -u; "
        "grep CapEff /proc/self/status; echo secret=${OSMOSIS_TEST_SECRET:-none}; echo home=$HOME; "
        f"{sys.executable} -I -c 'import osmosis_core, sys; print(\"python\", sys.version_info[:2])'"
    )
    out = _run(sandbox, script, cwd="/app")
    assert out.return_code == 0, out.stderr
    assert "Read-only file system" in out.stdout
    assert "pid=2" in out.stdout
    assert "sandbox\n" in out.stdout
    assert "\n0\n" in out.stdout
    assert "CapEff:\t0000000000000000" in out.stdout  # root without capabilities
    assert "secret=none" in out.stdout
    assert "home=/root" in out.stdout
    assert f"python ({sys.version_info[0]}, {sys.version_info[1]})" in out.stdout  # this Python works inside
    assert (tmp_path / "root" / "app" / "note").read_text() == "kept\n"  # the trial's own files persist
    assert not os.path.exists("/usr/osmosis-x")


WRITABLE = """
import os, sys
found = []
for top in sys.argv[1:]:
    for folder, dirs, files in os.walk(top):
        found += [os.path.join(folder, n) for n in [".", *dirs, *files] if os.access(os.path.join(folder, n), os.W_OK)]
for path in ("/proc/sys/kernel/panic", "/proc/sys/vm/drop_caches", "/proc/sys/fs/file-max", "/proc/sysrq-trigger"):
    try:
        os.close(os.open(path, os.O_WRONLY))  # opened for writing only: nothing is written
        found.append(path)
    except OSError:
        pass
print(len(found), found[:5])
"""


def test_a_command_is_not_the_hosts_root_and_cannot_change_kernel_settings(tmp_path):
    sandbox = _sandbox(tmp_path)
    (tmp_path / "root" / "app" / "writable.py").write_text(WRITABLE)
    out = _run(
        sandbox,
        f"id -u; cat /proc/self/uid_map; echo made > /app/mine; mknod /tmp/null c 1 3 2>&1; "
        f"{sys.executable} -I /app/writable.py /proc/sys /sys",
    )
    assert out.return_code == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "0 []"  # nothing under /proc/sys or /sys, nor those four, is writable
    assert "Operation not permitted" in out.stdout  # no device can be made
    owner = (tmp_path / "root" / "app" / "mine").stat().st_uid  # as the host sees the trial's file
    if os.geteuid() == 0:
        base = sandbox_id_base()
        assert lines[0] == "0"
        assert lines[1].split() == ["0", str(base), "65536"]  # root inside, mapped
        assert owner == base != 0  # not the host's root
    else:
        assert owner == os.geteuid()
    # the loader's variables reach the command, never the programs that run as the host's root around it
    loader = _run(sandbox, "echo $LD_LIBRARY_PATH", env={"LD_PRELOAD": "/osmosis-no.so", "LD_LIBRARY_PATH": "/opt/x"})
    assert loader.stdout == "/opt/x\n"
    assert loader.stderr.count("cannot be preloaded") == 1, loader.stderr  # bash's own complaint only


def test_a_symlink_the_trial_leaves_on_the_way_to_a_shown_path_is_not_followed_on_the_host(tmp_path):
    """bubblewrap sets the sandbox up as root and makes the folders on the way to each shown path:
    a symlink the trial left there (to the host, through bwrap's view of it) must not lead it out."""
    shown = tmp_path / "shown" / "pkg"
    shown.mkdir(parents=True)
    (shown / "mod.py").write_text("X = 1\n")
    target = tmp_path / "host-target"
    target.mkdir()
    sandbox = Sandbox(tmp_path / "root", expose=[*python_paths(), shown])
    sandbox.prepare(["/app"])
    first = tmp_path.relative_to("/").parts[0]  # "tmp": the trial's own folder, owned by its root
    planted = tmp_path / "root" / first / tmp_path.relative_to(f"/{first}").parts[0]
    if planted.exists():
        import shutil

        shutil.rmtree(planted)
    planted.symlink_to(f"/oldroot{target}")  # what `ln -s` in an earlier command leaves behind
    out = _run(sandbox, f"cat {shown}/mod.py")
    assert out.return_code == 0, out.stderr
    assert out.stdout == "X = 1\n", out.stderr
    assert list(target.iterdir()) == []  # nothing was made on the host
    assert not planted.is_symlink()
    # a dangling symlink in place of a shown file's mount point: bwrap would create its target
    (tmp_path / "root" / shown.relative_to("/") / "mod.py").unlink(missing_ok=True)
    (tmp_path / "root" / shown.relative_to("/")).rmdir()
    (tmp_path / "root" / shown.relative_to("/")).symlink_to(f"/oldroot{target}/made-by-bwrap")
    out = _run(sandbox, f"cat {shown}/mod.py")
    assert out.return_code == 0, out.stderr
    assert out.stdout == "X = 1\n", out.stderr
    assert list(target.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="as a user, bubblewrap's own user namespace is used")
def test_without_a_user_namespace_the_sandbox_refuses_to_start_rather_than_run_as_root():
    """Root that may not map ids (no CAP_SETUID/CAP_SETGID here, as in some containers): a clear error
    at the backend's check, never a sandbox run as the host's root."""
    check = (
        "from osmosis_harbor.bwrap import check_bwrap, find_bwrap\n"
        "try:\n    check_bwrap(find_bwrap())\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    drop = ["setpriv", "--bounding-set=-setuid,-setgid", "--inh-caps=-setuid,-setgid", "--"]
    out = subprocess.run([*drop, sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("SandboxStartError cannot map the sandbox's user namespace"), out.stdout + out.stderr
    assert "never as the host's root" in out.stdout
    assert "user.max_user_namespaces" in out.stdout


def test_the_sandbox_id_range_is_checked(monkeypatch):
    monkeypatch.setenv("OSMOSIS_SANDBOX_ID_BASE", "x")
    if os.geteuid() != 0:
        assert sandbox_id_base() is None  # bubblewrap's own user namespace, as the user
        return
    with pytest.raises(SandboxStartError, match="OSMOSIS_SANDBOX_ID_BASE='x' is not a whole number"):
        sandbox_id_base()
    from osmosis_harbor.bwrap import check_id_range

    with pytest.raises(SandboxStartError, match="host ids 0-65535 are not between 65536"):
        check_id_range(0)  # never the host's root


FORK_BOMB = """
import os, time
n = 0
for _ in range(60):
    try:
        pid = os.fork()
    except OSError as exc:
        print('refused:', exc.strerror)
        break
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    n += 1
print('started', n)
"""


def test_memory_and_process_limits_hold(tmp_path):
    sandbox = _sandbox(tmp_path, memory_mb=96, max_processes=24)
    hog = _run(sandbox, f"{sys.executable} -I -c 'x = bytearray(400 << 20); print(len(x))'")
    assert hog.return_code != 0
    assert "419430400" not in hog.stdout
    if sandbox.limits.kind != "rlimit":
        assert hog.oom_killed
    sandbox = _sandbox(tmp_path, memory_mb=None, max_processes=24)
    if sandbox.limits.kind == "rlimit" and os.geteuid() == 0 and sandbox.id_base is None:
        pytest.skip("no writable pids cgroup, and RLIMIT_NPROC does not bind the host's root")
    (tmp_path / "root" / "app" / "bomb.py").write_text(FORK_BOMB)
    forks = _run(sandbox, f"{sys.executable} -I /app/bomb.py")
    assert "refused: Resource temporarily unavailable" in forks.stdout, forks.stdout + forks.stderr
    assert int(forks.stdout.split("started ")[1]) < 24


def test_the_process_limit_binds_without_a_cgroup_too(tmp_path):
    """Where no cgroup can be made, ``ulimit`` limits the processes: it binds a trial's root (not the
    host's root, which RLIMIT_NPROC never binds)."""
    if os.geteuid() == 0 and sandbox_id_base() is None:
        pytest.skip("RLIMIT_NPROC does not bind the host's root")
    sandbox = _sandbox(tmp_path, memory_mb=None, max_processes=24, limits=Limits("rlimit"))
    (tmp_path / "root" / "app" / "bomb.py").write_text(FORK_BOMB)
    forks = _run(sandbox, f"{sys.executable} -I /app/bomb.py")
    assert "refused: Resource temporarily unavailable" in forks.stdout, forks.stdout + forks.stderr
    assert int(forks.stdout.split("started ")[1]) < 24


def test_a_timeout_kills_the_whole_process_tree(tmp_path):
    marker = f"osmosis-sandbox-{secrets.token_hex(3)}"
    sandbox = _sandbox(tmp_path)
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match="timed out after 1 seconds"):
        _run(
            sandbox,
            f"bash -c 'exec -a {marker} sleep 300' & setsid bash -c 'exec -a {marker} sleep 301' & "
            f"nohup bash -c 'exec -a {marker} sleep 302' & wait",
            timeout=1,
        )
    assert time.monotonic() - started < 10
    time.sleep(0.2)
    assert sandbox_processes(marker) == []


def test_files_move_in_and_out_without_following_the_sandboxs_symlinks(tmp_path):
    sandbox = _sandbox(tmp_path)
    target = tmp_path / "outside.txt"
    target.write_text("host file")
    made = _run(sandbox, f"ln -s /etc /app/evil && ln -s {target} /app/link && ln -s {tmp_path} /logs/agent/up")
    assert made.return_code == 0, made.stderr
    tree = SafeTree(tmp_path / "root")
    source = tmp_path / "source.txt"
    source.write_text("uploaded")
    tree.write_file(("app", "evil", "osmosis-harbor-test"), source)  # the link is replaced, /etc untouched
    assert not os.path.exists("/etc/osmosis-harbor-test")
    assert (tmp_path / "root" / "app" / "evil" / "osmosis-harbor-test").read_text() == "uploaded"
    tree.write_file(("app", "link"), source)  # writes the trial's file, not the host file it pointed at
    assert target.read_text() == "host file"
    (tmp_path / "root" / "app" / "link2").symlink_to(target)
    with pytest.raises(SymlinkRefused):
        tree.read_file(("app", "link2"), tmp_path / "copied.txt")
    tree.read_tree(("logs",), tmp_path / "logs-copy")
    assert not (tmp_path / "logs-copy" / "agent" / "up").exists()


def test_killing_the_osmosis_process_kills_its_sandboxes(tmp_path):
    marker = f"osmosis-sandbox-orphan-{secrets.token_hex(3)}"
    program = (
        "import anyio, sys\n"
        "from pathlib import Path\n"
        "from osmosis_harbor.bwrap import Sandbox, python_paths\n"
        f"sandbox = Sandbox(Path({str(tmp_path / 'root')!r}), expose=python_paths(), memory_mb=256)\n"
        "sandbox.prepare()\n"
        f"anyio.run(sandbox.run, \"setsid bash -c 'exec -a {marker} sleep 300' & wait\")\n"
    )
    host = subprocess.Popen([sys.executable, "-c", program])
    try:
        deadline = time.monotonic() + 30
        while not sandbox_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sandbox_processes(marker), "the sandboxed command did not start"
    finally:
        host.kill()  # SIGKILL: no cleanup code of osmosis runs
        host.wait()
    time.sleep(0.3)
    assert sandbox_processes(marker) == []
    limits = Limits.detect()  # the next osmosis process removes the cgroups a killed one left
    for _, parent in limits.parents:
        assert list(parent.glob(f"osmosis-sandbox-{host.pid}-*")) == []
