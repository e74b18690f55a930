"""`osmosis report` as a user runs it, the page it writes, and the report every run writes by itself."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest
from report_helpers import clean_env, make_run, osmosis_exe, scripted

from osmosis_core.testing import ScriptedPolicyServer, check_lazy_exports
from osmosis_report.load import load_run
from osmosis_report.render import build_report


def osmosis(*args, cwd, env=None):
    return subprocess.run(
        [osmosis_exe(), *args], cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=120
    )


def test_osmosis_report_writes_one_file_and_prints_the_summary(run_a, workspace, tmp_path):
    out = tmp_path / "one.html"
    r = osmosis("report", str(run_a), "-o", str(out), cwd=workspace)
    assert r.returncode == 0, r.stderr
    assert "mean reward [95% CI]" in r.stdout
    assert "pass@k" in r.stdout
    assert "policy_error 2" in r.stdout
    assert f"wrote {out}" in r.stdout
    html = out.read_text()
    assert html.startswith("<!doctype html>")
    assert "</html>" in html
    # self-contained: no file or address is fetched, and the policy forbids every request
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", html)
    assert "default-src 'none'" in html
    assert "<link" not in html
    assert "@import" not in html
    assert "url(" not in html


def test_a_report_of_one_run_by_default_goes_into_its_folder(run_a, workspace):
    (run_a / "report.html").unlink(missing_ok=True)
    r = osmosis("report", "runs/a", cwd=workspace)
    assert r.returncode == 0, r.stderr
    assert (run_a / "report.html").is_file()


def test_not_a_run_folder_is_one_clear_line(tmp_path, workspace):
    r = osmosis("report", str(tmp_path), cwd=workspace)
    assert r.returncode == 1
    assert "is not a run folder" in r.stderr
    assert "Traceback" not in r.stderr


def test_rollout_content_is_data_never_markup(run_a, tmp_path):
    built = build_report([run_a], tmp_path / "r.html")
    html = built.path.read_text()
    # the prompt is in the page, but no tag of it is: its < and > are escaped inside the JSON data
    assert "<script>document" not in html
    assert "<img src=x" not in html
    assert "</script><img" not in html
    data = json.loads(
        re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S).group(1)
    )
    assert any("<script>document.title='pwned'</script>" in row["p"] for row in data["rows"])


def test_no_key_or_header_value_reaches_the_report(workspace, tmp_path):
    secret = "sk-report-secret-123456"
    with ScriptedPolicyServer(api_key=secret) as server:
        env = {**clean_env(), "REPORT_TEST_KEY": secret}
        r = subprocess.run(
            [osmosis_exe(), "run", "configs/eval/multiply-plain.toml", "--policy-url", server.url, "--api-key-env",
             "REPORT_TEST_KEY", "--limit", "3", "--output", "runs/keyed"],
            cwd=workspace, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    built = build_report([workspace / "runs" / "keyed"], tmp_path / "k.html")
    assert secret not in built.path.read_text()
    assert secret not in (workspace / "runs" / "keyed" / "report.html").read_text()


def test_past_its_size_limit_the_page_keeps_every_row_and_says_which_trajectories_it_kept(run_a, tmp_path):
    full = build_report([run_a], tmp_path / "full.html")
    assert full.embedded == len([r for r in full.runs[0].rollouts if r.trajectory is not None])
    bare = build_report([run_a], tmp_path / "bare.html", max_bytes=1)
    assert bare.embedded == 0
    small = build_report([run_a], tmp_path / "small.html", max_bytes=bare.bytes + 2_500)
    html = small.path.read_text()
    assert 0 < small.embedded < full.embedded
    assert small.bytes <= bare.bytes + 2_500
    assert f"The trajectories of {small.embedded:,} of {small.rollouts:,} rollouts" in html
    assert "every failed rollout first" in html
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', html, re.S).group(1))
    assert len(data["rows"]) == 21
    assert len(data["rollouts"][0]) == 42


def test_every_run_writes_its_report_by_itself_unless_told_not_to(workspace):
    on = make_run(workspace, "auto", scripted(), n_samples=1)
    page = (on / "report.html").read_text()
    assert "multiply" in page
    assert "data-partial" not in page  # the final report: not partial
    off = make_run(workspace, "off", scripted(), n_samples=1, extra=("--no-report",))
    assert not (off / "report.html").exists()
    r = run_with_report_table(workspace, "off2", "enabled = false")
    assert r.returncode == 0, r.stderr
    assert not (workspace / "runs" / "off2" / "report.html").exists()


def run_with_report_table(workspace, name: str, table: str) -> subprocess.CompletedProcess:
    """Two rows of the example, with a ``[report]`` table added to its config."""
    config = workspace / "configs" / "eval" / f"{name}.toml"
    config.write_text((workspace / "configs" / "eval" / "multiply-plain.toml").read_text() + f"\n[report]\n{table}\n")
    with ScriptedPolicyServer() as server:
        return subprocess.run(
            [osmosis_exe(), "run", str(config), "--policy-url", server.url, "--limit", "2", "--output", f"runs/{name}"],
            cwd=workspace, env=clean_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip


def test_an_unknown_report_key_is_named_and_does_not_fail_the_run(workspace):
    r = run_with_report_table(workspace, "typo", "enabeld = false")
    assert r.returncode == 0, r.stderr
    assert "enabeld" in r.stderr
    assert "$.report" in r.stderr
    assert load_run(workspace / "runs" / "typo").summary.finished == 2


def test_a_run_still_going_is_reported_as_partial_and_an_interrupted_one_says_so(workspace, tmp_path):
    with ScriptedPolicyServer(latency=0.25) as server:
        args = [osmosis_exe(), "run", "configs/eval/multiply-plain.toml", "--policy-url", server.url,
                "--concurrency", "1", "--output", "runs/live"]  # fmt: skip
        run = subprocess.Popen(args, cwd=workspace, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        results = workspace / "runs" / "live" / "results.jsonl"
        deadline = time.monotonic() + 60
        while not (results.exists() and results.read_text().count("\n") >= 3) and time.monotonic() < deadline:
            time.sleep(0.05)
        r = osmosis("report", "runs/live", "-o", str(tmp_path / "live.html"), cwd=workspace)
        assert r.returncode == 0, r.stderr
        assert "partial (the run is still going)" in r.stdout
        live = (tmp_path / "live.html").read_text()
        assert "data-partial" in live
        assert "the run is still going" in live
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    final = (workspace / "runs" / "live" / "report.html").read_text()  # written by the run as it stopped
    assert "data-partial" in final
    assert "the run was interrupted" in final
    assert "still going" not in final


@pytest.mark.parametrize("while_running", [False, True], ids=["when-it-stops", "while-it-runs"])
def test_osmosis_serve_writes_its_report_when_it_stops(workspace, while_running):
    pytest.importorskip("osmosis_server", reason="osmosis-server is not installed")
    folder = workspace / "runs" / f"served-{while_running}"  # a server remembers its folder: one each
    with ScriptedPolicyServer() as policy:
        serve = subprocess.Popen(
            [osmosis_exe(), "serve", "configs/eval/multiply-plain.toml", "--port", "0", "--no-auth", "--watch-stdin",
             "--output", str(folder), *(["--progress-every", "0.5"] if while_running else [])],
            cwd=workspace, env=clean_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            _drive_the_server(serve, policy, folder, while_running)
        finally:  # a failed check never leaves the server running
            if serve.poll() is None:
                serve.kill()
                serve.communicate(timeout=30)
    page = folder / "report.html"
    assert page.is_file(), "osmosis serve wrote no report when it stopped"
    data = load_run(folder)
    assert data.kind == "serve"
    assert data.summary.finished == 3
    assert data.summary.pass_rate == 2 / 3
    assert "3 rollouts" in page.read_text()


def _drive_the_server(serve, policy, folder, while_running):
    import asyncio

    from osmosis_core.http import http_scope
    from osmosis_trainer import RolloutClient, RolloutRequest

    url = ""
    for out in serve.stdout:
        if match := re.search(r"listening on (http://\S+)", out):
            url = match.group(1)
            break
    assert url, serve.stderr.read()

    async def submit_and_wait():
        client = RolloutClient(url)
        prompts = [("val1 = 3\nval2 = 4", "12"), ("val1 = 5\nval2 = 6", "30"), ("val1 = 7\nval2 = 8", "1")]
        admissions = [
            await client.submit(
                RolloutRequest(
                    rollout_id=f"s-{i}",
                    initial_messages=[{"role": "user", "content": text}],
                    chat_completions_url=policy.url,
                    label=label,
                )
            )
            for i, (text, label) in enumerate(prompts)
        ]
        return [await client.result(a) for a in admissions]

    async def go():
        async with http_scope():  # the loop's shared HTTP session, closed with it
            return await submit_and_wait()

    assert len(asyncio.run(go())) == 3
    page = folder / "report.html"
    if while_running:  # a long-running server's report is kept up to date while it serves
        deadline = time.monotonic() + 60
        while not (page.is_file() and "3 rollouts" in page.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert page.is_file(), "no report while the server ran"
        assert "3 rollouts" in page.read_text(), "no report while the server ran"
        assert serve.poll() is None
    serve.send_signal(signal.SIGTERM)
    serve.communicate(timeout=60)


def test_the_public_names_type_checkers_read_are_the_ones_the_package_hands_out():
    check_lazy_exports("osmosis_report")


def test_the_run_summary_names_the_report_it_wrote(workspace):
    with ScriptedPolicyServer() as server:
        r = subprocess.run(
            [osmosis_exe(), "run", "configs/eval/multiply-plain.toml", "--policy-url", server.url, "--limit", "2",
             "--output", "runs/named"],
            cwd=workspace, env=clean_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    page = workspace / "runs" / "named" / "report.html"
    assert page.is_file()
    [row] = [line for line in r.stdout.splitlines() if "report.html" in line]
    assert [cell.strip() for cell in row.split("│")[1:3]] == ["report", str(page)]


def test_open_without_a_browser_says_so_and_names_the_file(run_a, workspace, tmp_path):
    out = tmp_path / "open.html"
    env = {k: v for k, v in clean_env().items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(BROWSER=str(tmp_path / "no-such-browser"), PATH=str(tmp_path))  # nothing to open it with
    r = osmosis("report", str(run_a), "-o", str(out), "--open", cwd=workspace, env=env)
    assert r.returncode == 0, r.stderr
    assert "--open: no browser found to open it" in r.stderr
    assert out.resolve().as_uri() in r.stderr
    assert out.is_file()
