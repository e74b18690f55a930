"""`uvicorn main:app`: a rollout's own main.py served by plain uvicorn, from a starter template."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from server_helpers import TOKEN, read_lines, run

from osmosis_server import RolloutStatus
from osmosis_trainer import RolloutClient, RolloutRequest

# What a rollout's main.py adds to be served (proposed for the multiply-plain template itself): the
# app is built on first access, so `osmosis run` and `osmosis validate` never build it.
APP_HOOK = '''

def __getattr__(name: str) -> object:
    """``app``: this rollout as a rollout server (pip install osmosis-server; uvicorn main:app)."""
    if name != "app":
        raise AttributeError(name)
    from osmosis_core import LocalBackend
    from osmosis_server import create_app

    app = globals()["app"] = create_app(LocalBackend(MultiplyWorkflow, grader=MultiplyGrader))
    return app
'''


def test_uvicorn_serves_the_multiply_template_main_app_and_drains_on_sigterm(tmp_path, policy_server):
    osmosis = os.path.join(os.path.dirname(sys.executable), "osmosis")
    subprocess.run(
        [osmosis, "template", "apply", "multiply-plain", str(tmp_path / "ws")], check=True, capture_output=True
    )
    rollout = tmp_path / "ws" / "rollouts" / "multiply-plain"
    main = rollout / "main.py"
    if "def __getattr__" not in main.read_text():
        main.write_text(main.read_text() + APP_HOOK)
    env = {**os.environ, "OSMOSIS_SERVER_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "main:app", "--host", "127.0.0.1", "--port", "0"],
        cwd=rollout,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        url, lines = "", []
        deadline = time.monotonic() + 60
        while not url and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(r"Uvicorn running on (http://\S+)", line)
            url = match.group(1) if match else ""
        assert url, "".join(lines)

        async def go():
            client = RolloutClient(url, token=TOKEN)
            return await client.run(
                RolloutRequest(
                    rollout_id="tpl-1",
                    initial_messages=[
                        {"role": "system", "content": "Use the multiply tool, then answer as: #### <number>"},
                        {"role": "user", "content": "val1 = 21\nval2 = 2"},
                    ],
                    chat_completions_url=policy_server.url,
                    label="42",
                )
            )

        result = run(go)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
        log = "".join(lines) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert result.status is RolloutStatus.SUCCESS
    assert result.reward == 1.0
    [folder] = list((rollout / "runs").iterdir())  # the default run folder under the working directory
    [line] = read_lines(folder / "results.jsonl")
    assert line["rollout_id"] == "tpl-1"
    assert line["reward"] == 1.0
    assert json.loads((folder / "run.json").read_text())["kind"] == "serve"
    assert "SIGTERM received: draining" in log
    assert "drained: 1 finished" in log
    assert TOKEN not in log
    assert proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its stop
