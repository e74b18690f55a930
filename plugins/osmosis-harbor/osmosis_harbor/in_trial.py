"""The runner inside a Harbor trial: runs the workflow (agent phase) or the grader (verifier phase).

It runs in the trial's environment with the interpreter that runs osmosis (``sys.executable``,
visible read-only in the bwrap sandbox) or the image's ``python3``, in isolated mode (``-I``: no
current folder, no ``PYTHON*`` variables, no user site), so nothing the agent left in the trial
can shadow a module. It never imports Harbor. Each phase runs through the core's stage runners
(:func:`~osmosis_core.lifecycle.run_workflow`, :func:`~osmosis_core.lifecycle.run_grader`, what
the ``local`` backend runs), so results mean exactly what they mean locally.

* ``run REQUEST RESULT``: read the request the host uploaded (prompt, metadata, policy endpoint,
  rollout id; never the label), run the workflow, write the workflow's result.
* ``grade REQUEST SAMPLE VERIFIER_DIR``: read the grading request (with the label, uploaded to
  ``/tests`` only when verification starts), grade the workflow's sample (its reward, if the agent
  put one there, is discarded), write ``reward.json`` (``{"reward": r}``) for Harbor's verifier and
  ``osmosis-grader.json`` (the grader's result) for the host.

A request with ``policy_socket`` (a ``no-network`` trial) first starts the forwarder from the
sandbox's own loopback to that socket (:func:`osmosis_harbor.relay.start_sandbox_forwarder`) and
points the policy's ``base_url`` at it.

The exit status is 0 whenever a result was written, failures included.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from osmosis_core import PolicyEndpoint

__all__ = ["GRADER_RESULT", "REQUEST_FILE", "RESULT_FILE", "bootstrap", "main"]

REQUEST_FILE = "/logs/agent/osmosis-request.json"
RESULT_FILE = "/logs/agent/osmosis-result.json"
GRADE_REQUEST_FILE = "/tests/osmosis-grade.json"
GRADE_SCRIPT_FILE = "/tests/osmosis-grade.sh"
GRADER_RESULT = "osmosis-grader.json"
"""Written next to ``reward.json`` in ``/logs/verifier``: the grader's full result."""


def bootstrap(lib_paths: list[str] | None = None) -> str:
    """The ``python -I -c`` program that starts :func:`main` (``lib_paths`` go first on ``sys.path``)."""
    head = f"import sys; sys.path[:0] = {lib_paths!r}; " if lib_paths else "import sys; "
    return head + "from osmosis_harbor.in_trial import main; sys.exit(main(sys.argv[1:]))"


def _load_class(spec: dict[str, Any], code_dir: str | None) -> type[Any]:
    """Import the workflow or grader class the host named (module, qualname, file)."""
    if code_dir and code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    module_name = str(spec["module"])
    file = spec.get("file")
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name or not file or not Path(file).is_file():
                raise
            loader_spec = importlib.util.spec_from_file_location(module_name, file)
            if loader_spec is None or loader_spec.loader is None:
                raise
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = module
            loader_spec.loader.exec_module(module)
    obj: Any = module
    for part in str(spec["qualname"]).split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{module_name}:{spec['qualname']} is not a class")
    return obj


def _write_json(path: str | Path, data: Any, secrets: tuple[str, ...] = ()) -> None:
    """``data`` as JSON, atomically, with every secret (and every run of 8 of its characters)
    redacted from every string: the trial folder of a failed trial is kept."""
    text = json.dumps(data, default=repr)
    if secrets:
        from osmosis_core.plugin import redact_data

        text = json.dumps(redact_data(json.loads(text), secrets))
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _infra(rollout_id: str, stage: str, message: str) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "stage": stage,
        "status": "failure",
        "error": {"category": "infra_error", "message": message},
        "sample": None,
        "timings": {},
    }


async def _close_http() -> None:
    from osmosis_core.http import aclose_http

    await aclose_http()


async def _run(request: dict[str, Any], policy: PolicyEndpoint) -> dict[str, Any]:
    from osmosis_core import ExecutionRequest
    from osmosis_core.plugin import run_workflow
    from osmosis_core.wire import result_to_json
    from osmosis_harbor.wire import load_object_blob

    rollout_id = str(request["rollout_id"])
    try:
        workflow = _load_class(request["workflow"], request.get("code_dir"))
        config = load_object_blob(request["workflow_config"]) if request.get("workflow_config") else None
    except Exception as exc:
        return _infra(
            rollout_id,
            "workflow",
            f"the workflow could not be loaded inside the trial: {type(exc).__name__}: {exc} "
            f"({traceback.format_exc(limit=-1).strip().splitlines()[-1]})",
        )
    deadline = request.get("deadline")
    timeout = max(0.05, float(deadline) - time.time()) if deadline else None
    execution = ExecutionRequest(
        rollout_id=rollout_id,
        prompt=list(request["prompt"]),
        policy=policy,
        metadata=dict(request.get("metadata") or {}),
        agent_timeout_sec=timeout,
    )
    try:
        result = await run_workflow(workflow, config if config is not None else workflow.config_type(), execution)
    finally:
        await _close_http()
    return result_to_json(result)


async def _grade(request: dict[str, Any], sample_file: str, policy: PolicyEndpoint) -> dict[str, Any]:
    from osmosis_core import ExecutionRequest
    from osmosis_core.wire import result_from_json, result_to_json
    from osmosis_harbor.grading import grade_sample
    from osmosis_harbor.wire import load_object_blob

    rollout_id = str(request["rollout_id"])
    try:
        finished = result_from_json(json.loads(Path(sample_file).read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        return _infra(rollout_id, "grader", f"no workflow sample to grade ({sample_file}: {exc})")
    if not finished.ok or finished.sample is None:
        return _infra(rollout_id, "grader", "no workflow sample to grade: the workflow did not succeed")
    try:
        grader = _load_class(request["grader"], request.get("code_dir"))
        config = load_object_blob(request["grader_config"]) if request.get("grader_config") else None
    except Exception as exc:
        return _infra(rollout_id, "grader", f"the grader could not be loaded inside the trial: {exc!r}")
    timeout = request.get("timeout")
    execution = ExecutionRequest(
        rollout_id=rollout_id,
        prompt=list(request["prompt"]),
        policy=policy,
        label=request.get("label"),
        metadata=dict(request.get("metadata") or {}),
        grader_timeout_sec=float(timeout) if timeout else None,
    )
    try:
        graded = await grade_sample(grader, config, finished.sample, execution)
    finally:
        await _close_http()
    return result_to_json(graded)


def _policy(request: dict[str, Any]) -> PolicyEndpoint:
    """The request's policy endpoint, reached through the trial's socket when it names one."""
    import attrs

    from osmosis_harbor.relay import start_sandbox_forwarder, via_port
    from osmosis_harbor.wire import policy_from_request

    policy = policy_from_request(request["policy"])
    socket = request.get("policy_socket")
    if not socket:
        return policy
    return attrs.evolve(policy, base_url=via_port(policy.base_url, start_sandbox_forwarder(str(socket))))


def main(argv: list[str]) -> int:
    """``run REQUEST RESULT`` or ``grade REQUEST SAMPLE VERIFIER_DIR``; returns the exit status."""
    if len(argv) == 3 and argv[0] == "run":
        request = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
        policy = _policy(request)
        _write_json(argv[2], asyncio.run(_run(request, policy)), policy.secrets())
        return 0
    if len(argv) == 4 and argv[0] == "grade":
        request = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
        policy = _policy(request)
        verifier_dir = Path(argv[3])
        verifier_dir.mkdir(parents=True, exist_ok=True)
        graded = asyncio.run(_grade(request, argv[2], policy))
        graded["nonce"] = request.get("nonce")
        _write_json(verifier_dir / GRADER_RESULT, graded, policy.secrets())
        sample = graded.get("sample") or {}
        if graded.get("status") == "success" and sample.get("reward") is not None:
            _write_json(verifier_dir / "reward.json", {"reward": sample["reward"]})
        return 0
    print("usage: in_trial run REQUEST RESULT | grade REQUEST SAMPLE VERIFIER_DIR", file=sys.stderr)
    return 2
