"""Reaching the Ray cluster: attach to the one already here, connect to one, or start a local one.

Which cluster (``[backend.ray] address``):

* this process is already connected (a verl / SkyRL / NeMo-RL driver, a notebook that called
  ``ray.init``): that one, whatever ``address`` says, and it is never shut down by osmosis;
* ``"auto"`` (or ``$RAY_ADDRESS`` when ``address`` is unset): the running cluster ``ray start``
  made, ``"host:port"``: that GCS, ``"ray://host:10001"``: through Ray Client. osmosis connects
  and, at the end, only disconnects;
* unset and no ``$RAY_ADDRESS``: a new local cluster on this machine, stopped by
  :meth:`ClusterLink.close` (``aclose()`` of the backend). Ray listens on every interface, so
  the cluster keeps Ray's token authentication on; unless the environment chooses an auth mode
  or a token itself, the token is a fresh random one handed to the cluster's processes in their
  environment, instead of the ``~/.ray/auth_token`` file Ray would write otherwise (osmosis
  writes nothing outside the folders the user names).

>>> ClusterLink(address="10.0.0.1:6379", started_cluster=False, connected_here=True).owns_connection
True
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
import os
import secrets
import urllib.parse
from pathlib import Path
from typing import Any

import attrs

from osmosis_core import InfraError
from osmosis_ray.config import RayBackendConfig

__all__ = ["ClusterLink", "connect", "is_loopback_url", "ray_api"]

log = logging.getLogger("osmosis_ray")


def ray_api() -> Any:
    """The ``ray`` module, imported on first use (typed loosely: Ray's own annotations are partial)."""
    import importlib

    return importlib.import_module("ray")


@attrs.define
class ClusterLink:
    """How this process is attached to Ray, and what :meth:`close` must undo."""

    address: str
    started_cluster: bool
    """This backend started the local cluster (and stops it)."""
    connected_here: bool
    """This backend called ``ray.init`` (and calls ``ray.shutdown``, which only disconnects from a
    cluster it did not start)."""
    client: bool = False
    """Connected through Ray Client (``ray://``)."""
    closed: bool = False
    restore_env: dict[str, str | None] = attrs.field(factory=dict, repr=False)
    """Environment variables this link set (the local cluster's auth token), with their old values."""

    @property
    def owns_connection(self) -> bool:
        """True when closing this link ends the process's Ray connection."""
        return self.connected_here

    def alive_nodes(self) -> list[dict[str, Any]]:
        """The cluster's live nodes (Ray's ``ray.nodes()`` entries)."""
        ray = ray_api()

        return [n for n in ray.nodes() if n.get("Alive")]

    def close(self) -> None:
        """Disconnect if this link connected; the local cluster stops with it if this link started it."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.connected_here:
                ray = ray_api()

                if ray.is_initialized():
                    ray.shutdown()
        finally:
            if self.restore_env:
                for name, value in self.restore_env.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
                _reload_ray_config()


def connect(config: RayBackendConfig, config_root: Path | None = None) -> ClusterLink:
    """Attach to Ray as ``config`` says (see the module docstring).

    :raises InfraError: the cluster cannot be reached or started (one line, with what to do).
    """
    ray = ray_api()

    if ray.is_initialized():
        return ClusterLink(address=_current_address(), started_cluster=False, connected_here=False)
    address = config.address or os.environ.get("RAY_ADDRESS") or None
    common: dict[str, Any] = {
        "namespace": config.namespace,
        "log_to_driver": config.log_to_driver,
        "logging_level": logging.WARNING,
        "ignore_reinit_error": False,
    }
    if address is None or address == "local":
        local = config.local_cluster
        temp_dir = local.temp_dir
        if temp_dir is not None and config_root is not None and not Path(temp_dir).is_absolute():
            temp_dir = str(config_root / temp_dir)
        kwargs: dict[str, Any] = {
            "address": "local",
            "num_cpus": local.num_cpus,
            "include_dashboard": local.include_dashboard,
            "object_store_memory": local.object_store_memory,
        }
        if temp_dir is not None:
            Path(temp_dir).mkdir(parents=True, exist_ok=True)
            kwargs["_temp_dir"] = temp_dir
        restore = _token_in_environment()
        try:
            ray.init(**kwargs, **common)
        except Exception as exc:
            ClusterLink("", started_cluster=False, connected_here=False, restore_env=restore).close()
            raise InfraError(f"cannot start a local Ray cluster: {type(exc).__name__}: {_first_line(exc)}") from exc
        return ClusterLink(address=_current_address(), started_cluster=True, connected_here=True, restore_env=restore)
    try:
        ray.init(address=address, **common)
    except Exception as exc:
        hint = (
            "start one with `ray start --head`, or leave [backend.ray] address unset to start a local cluster"
            if address == "auto"
            else "check [backend.ray] address"
        )
        raise InfraError(
            f"cannot connect to the Ray cluster at {address!r}: {type(exc).__name__}: {_first_line(exc)} ({hint})"
        ) from exc
    return ClusterLink(
        address=_current_address() or address,
        started_cluster=False,
        connected_here=True,
        client=address.startswith("ray://"),
    )


_AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _token_in_environment() -> dict[str, str | None]:
    """Token auth for a cluster about to start, with a random token in the environment (inherited
    by the cluster's processes) rather than in ``~/.ray/auth_token``; nothing when the user chose
    (an auth mode, a token, or a token file already at Ray's default path). The old values."""
    if any(os.environ.get(name) for name in _AUTH_VARIABLES) or (Path.home() / ".ray" / "auth_token").exists():
        return {}
    restore = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    _reload_ray_config()
    return restore


def _reload_ray_config() -> None:
    # Ray reads RAY_AUTH_MODE into its config when imported: read it again, as Ray's own
    # token setup does (ray._private.authentication.authentication_token_setup._enable_token_auth)
    importlib.import_module("ray._raylet").Config.initialize("")


def _current_address() -> str:
    ray = ray_api()

    try:
        context = ray.get_runtime_context()
        gcs = getattr(context, "gcs_address", None)
        if gcs:
            return str(gcs)
    except Exception:
        pass
    try:
        worker: Any = importlib.import_module("ray._private.worker").global_worker
        return str(worker.node.address)  # the only other place Ray keeps the address it joined
    except Exception:
        return "unknown"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else ""


def is_loopback_url(url: str) -> bool:
    """True when ``url``'s host is this machine only (``127.0.0.1``, ``::1``, ``localhost``).

    >>> is_loopback_url("http://127.0.0.1:8000/v1"), is_loopback_url("http://10.0.0.5:8000/v1")
    (True, False)
    """
    host = urllib.parse.urlsplit(url).hostname or ""
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
