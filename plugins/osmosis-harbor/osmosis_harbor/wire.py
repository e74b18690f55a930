"""What crosses a trial's boundary besides the records: the policy's secrets and the configs.

Records (requests' policy endpoints, results, samples) cross as JSON files in the trial's ``/logs``,
written and read by the core's one converter (``osmosis_core.wire.result_to_json`` and friends),
so a result with an invalid reward or an unknown category is refused, not taken in quietly.

Secrets never go into a file: the policy's API key and extra header *values* travel in the
environment of the one command that needs them (:func:`secret_env`), and the runner inside the
trial reads them back (:func:`policy_from_request`).

>>> from osmosis_core import PolicyEndpoint
>>> env = secret_env(PolicyEndpoint("http://127.0.0.1:8000/v1", "m", "sk-1", {"X-Token": "t-1"}))
>>> sorted(env)
['OSMOSIS_POLICY_API_KEY', 'OSMOSIS_POLICY_HEADERS']
"""

from __future__ import annotations

import base64
import importlib
import io
import json
import os
import pickle
import sys
from collections.abc import MutableMapping
from pathlib import Path
from types import ModuleType
from typing import Any

from osmosis_core import PolicyEndpoint
from osmosis_core.plugin import moved_names
from osmosis_core.wire import policy_from_json

__all__ = ["API_KEY_ENV", "HEADERS_ENV", "dump_object", "load_object_blob", "policy_from_request", "secret_env"]

# deprecated since 0.2.0 (CHANGELOG): the record codecs moved to the core's one converter
__getattr__ = moved_names(
    __name__,
    {
        name: (f"osmosis_core.wire:{name}", "0.2.0")
        for name in ("policy_to_json", "result_from_json", "result_to_json", "sample_from_json", "sample_to_json")
    },
)

API_KEY_ENV = "OSMOSIS_POLICY_API_KEY"
"""The variable that carries the policy's API key into the trial (never a file)."""

HEADERS_ENV = "OSMOSIS_POLICY_HEADERS"
"""The variable that carries the policy's extra headers (JSON) into the trial (never a file)."""


def secret_env(policy: PolicyEndpoint) -> dict[str, str]:
    """The environment that carries ``policy``'s secrets into the trial's command (empty without any)."""
    env: dict[str, str] = {}
    if policy.api_key:
        env[API_KEY_ENV] = policy.api_key
    if policy.headers:
        env[HEADERS_ENV] = json.dumps(dict(policy.headers))
    return env


def policy_from_request(data: Any, environ: MutableMapping[str, str] = os.environ) -> PolicyEndpoint:
    """The endpoint a request file names, with the secrets its command's environment carries.

    The variables are taken out of ``environ``: a process the agent starts (a tool, a shell) does
    not inherit them.
    """
    raw_headers = environ.pop(HEADERS_ENV, None)
    headers = json.loads(raw_headers) if raw_headers else {}
    return policy_from_json(data, environ.pop(API_KEY_ENV, None) or None, headers)


_PLAIN = (str, bytes, int, float, complex, bool, type(None), tuple, frozenset)


def _module_globals(modules: list[ModuleType]) -> dict[int, tuple[str, str]]:
    """id(object) -> (module, name) for the module-level objects of ``modules`` (not plain values)."""
    found: dict[int, tuple[str, str]] = {}
    for module in modules:
        for name, value in vars(module).items():
            if not name.startswith("__") and not isinstance(value, (*_PLAIN, ModuleType)):
                found.setdefault(id(value), (module.__name__, name))
    return found


class _ConfigPickler(pickle.Pickler):
    """Pickles the rollout's module-level objects it meets (a Strands ``@tool``, a client, a nested
    config) by reference, as ``(module, name)``: the trial imports the same code, and such objects are
    often not picklable by value."""

    def __init__(self, file: io.BytesIO, refs: dict[int, tuple[str, str]]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._refs = refs

    def persistent_id(self, obj: Any) -> tuple[str, str] | None:
        return self._refs.get(id(obj))


class _ConfigUnpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        module, name = pid
        return getattr(importlib.import_module(module), name)


def dump_object(obj: Any, code_dir: Path | None = None) -> str:
    """A config object as base64 pickle (it may be any attrs class of the rollout's own code).

    Objects defined at module level in the rollout's code (``code_dir``) travel by reference.
    Only the host writes these and only the trial reads them, with the same code on its path.
    """
    modules = []
    if code_dir is not None:
        root = Path(code_dir).resolve()
        for module in list(sys.modules.values()):
            file = getattr(module, "__file__", None)
            if file and Path(file).resolve().is_relative_to(root):
                modules.append(module)
    buffer = io.BytesIO()
    _ConfigPickler(buffer, _module_globals(modules)).dump(obj)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def load_object_blob(blob: str) -> Any:
    """The object :func:`dump_object` wrote (its references imported from the rollout's code)."""
    return _ConfigUnpickler(io.BytesIO(base64.b64decode(blob))).load()  # the host wrote it for this trial
