"""Attach this process to a Ray cluster: start a local one with token authentication, or connect.

Three things Ray does not do for us:

- **Fail fast on a bad token.** ``ray.init(address=...)`` with a missing or wrong token
  retries for 20-30 s and then says only "Failed to connect". Before calling it we ask the
  cluster's GCS one cheap question (``GetClusterId``) over gRPC with the token in the
  ``authorization`` header, with a 5 s deadline: UNAUTHENTICATED means the token is wrong
  or missing, UNAVAILABLE means nothing answers at that address.
- **Ignore a stale "current cluster" file.** ``ray start`` records its address in
  ``<temp>/ray/ray_current_cluster``; after that cluster stops, the file stays, and a plain
  ``ray.init()`` tries to join the dead address. We always start local clusters with
  ``address="local"`` (which never reads the file) and remove the file when the address in
  it does not answer.
- **Keep token state consistent.** Ray caches the token in a process-wide loader; when
  the token changes (a new cluster, another address) we reset that cache before ``ray.init``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtoolkit.errors import ClusterError, NbtUsageError

__all__ = [
    "Attachment",
    "attach_local",
    "connect",
    "detach",
    "probe",
    "read_token_file",
    "remove_stale_current_cluster_file",
    "resolve_token",
]

_PROBE_TIMEOUT_S = 5.0
_START_ATTEMPTS = 2
_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")

# One token per notebook process for the clusters it starts: Ray's C++ side caches the token,
# so reusing it across start/stop cycles keeps every client of this process consistent.
_local_token: str | None = None


@dataclass
class Attachment:
    """This process's link to a Ray cluster."""

    address: str
    token: str | None
    started_here: bool
    saved_env: dict[str, str | None]


def _current_cluster_file() -> Path:
    return Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"


def probe(address: str, token: str | None, *, timeout_s: float = _PROBE_TIMEOUT_S) -> None:
    """Check in one gRPC call that a Ray GCS answers at ``address`` and accepts ``token``.

    Raises ClusterError saying "authentication failed" (wrong or missing token) or
    "no Ray cluster answers" (nothing listening, or not Ray).
    """
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else []
    channel = grpc.insecure_channel(address)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        request = gcs_service_pb2.GetClusterIdRequest()  # type: ignore[attr-defined]  # generated protobuf
        stub.GetClusterId(request, metadata=metadata, timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            given = "no token was given" if not token else "the token given was rejected"
            raise ClusterError(
                f"authentication failed for the Ray cluster at {address}: {given}. Pass the "
                "cluster's token (Cluster.connect(address, token=...) or "
                "`%nbt cluster connect ADDRESS --token-file FILE`); on the head node "
                "`ray get-auth-token` prints it."
            ) from None
        raise ClusterError(
            f"no Ray cluster answers at {address} ({code.name}: {exc.details()}). Check the "
            "address (host:port of the head node's GCS, default port 6379) and that the "
            "cluster is running."
        ) from None
    finally:
        channel.close()


def resolve_token(token: str | None) -> str | None:
    """The token to use: the argument, else RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token."""
    if token:
        return token.strip()
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    for candidate in (os.environ.get("RAY_AUTH_TOKEN_PATH"), str(Path.home() / ".ray" / "auth_token")):
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_text().strip() or None
    return None


def read_token_file(path: str | Path) -> str:
    """The auth token stored in ``path`` (what ``Cluster.save_token`` or ``ray get-auth-token`` wrote)."""
    source = Path(path).expanduser()
    if not source.is_file():
        raise NbtUsageError(
            f"token file {str(source)!r} does not exist: on the head node `ray get-auth-token` prints "
            "the token; save it to a file readable only by you"
        )
    token = source.read_text().strip()
    if not token:
        raise NbtUsageError(f"token file {str(source)!r} is empty: it should hold the cluster's auth token")
    return token


def remove_stale_current_cluster_file() -> str | None:
    """Delete ``ray_current_cluster`` when the address in it does not answer; return that address."""
    path = _current_cluster_file()
    try:
        address = path.read_text().strip()
    except OSError:
        return None
    if address and _answers(address):
        return None
    with contextlib.suppress(OSError):
        path.unlink()
    return address or "(empty)"


def _answers(address: str) -> bool:
    """True when something accepts TCP connections at host:port (within 1 s)."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def _set_token_env(token: str | None) -> dict[str, str | None]:
    """Point this process (and the Ray processes it starts) at ``token``; return the old values."""
    saved = {name: os.environ.get(name) for name in _AUTH_ENV}
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    if token:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token
    else:
        os.environ.pop("RAY_AUTH_TOKEN", None)
    _reset_ray_token_cache()
    return saved


def _restore_env(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _reset_ray_token_cache() -> None:
    # Private Ray API (the same calls Ray's own auth tests make): refresh the config and
    # the cached token so that the next ray.init sees the environment we just set.
    with contextlib.suppress(ImportError, AttributeError):
        from ray._raylet import (  # type: ignore[attr-defined]  # Cython module without stubs
            AuthenticationTokenLoader,
            Config,
        )

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def attach_local(*, num_cpus: int, num_gpus: int | None, object_store_bytes: int) -> Attachment:
    """Use the Ray cluster this process is already attached to, or start a local one.

    A started cluster has token authentication on (a random token, kept for the life of
    the process) and no dashboard, and listens on loopback only when the machine has
    no other address (tests run in a private network namespace).
    """
    import ray

    global _local_token
    if ray.is_initialized():
        ctx = ray.get_runtime_context()
        return Attachment(
            address=ctx.gcs_address, token=resolve_token(None), started_here=False, saved_env={}
        )
    remove_stale_current_cluster_file()
    if _local_token is None:
        _local_token = secrets.token_urlsafe(32)
    saved = _set_token_env(_local_token)
    for attempt in range(_START_ATTEMPTS):
        try:
            info = ray.init(
                address="local",  # never join the address in a (possibly stale) ray_current_cluster file
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                include_dashboard=False,
                log_to_driver=False,  # rank output reaches the notebook through nbtoolkit, prefixed
                object_store_memory=object_store_bytes,
                configure_logging=False,
            )
            break
        except Exception as exc:
            # Ray gives its raylet a fixed 30 s to register; on an overloaded machine that can
            # pass. Clean up what the failed start left behind, then try once more.
            with contextlib.suppress(Exception):
                ray.shutdown()
            _kill_own_ray_children()
            overloaded = "timed out during startup" in str(exc)
            if not overloaded or attempt == _START_ATTEMPTS - 1:
                _restore_env(saved)
                raise ClusterError(
                    f"could not start a local Ray cluster: {type(exc).__name__}: {exc}"
                    + (" (the machine is overloaded: try again when it is quieter)" if overloaded else "")
                ) from exc
    address = info.address_info["gcs_address"]  # type: ignore[attr-defined]  # ray.init gives a RayContext
    return Attachment(address=address, token=_local_token, started_here=True, saved_env=saved)


def _kill_own_ray_children() -> None:
    """Kill Ray server processes that this process started (its direct children) and left running."""
    import signal

    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = stat.rsplit(")", 1)[1].split()[1]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if parent == me and ("gcs_server" in command or "raylet" in command or "ray/_private" in command):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def connect(address: str, token: str | None) -> Attachment:
    """Attach to the Ray cluster at ``address`` (host:port), checking the token first (fast)."""
    import ray

    token = resolve_token(token)
    probe(address, token)
    if ray.is_initialized():
        current = ray.get_runtime_context().gcs_address
        if _same_address(current, address):
            return Attachment(address=current, token=token, started_here=False, saved_env={})
        raise ClusterError(
            f"this notebook is already attached to the Ray cluster at {current}: close that "
            "Cluster (or `%nbt cluster stop`) before connecting to another one"
        )
    saved = _set_token_env(token)
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except Exception as exc:
        _restore_env(saved)
        raise ClusterError(
            f"could not connect to the Ray cluster at {address}: {type(exc).__name__}: {exc}"
        ) from exc
    return Attachment(address=address, token=token, started_here=False, saved_env=saved)


def _same_address(a: str, b: str) -> bool:
    def norm(addr: str) -> str:
        host, _, port = addr.rpartition(":")
        host = "127.0.0.1" if host in {"localhost", "", "0.0.0.0"} else host  # noqa: S104 - comparing, not binding
        return f"{host}:{port}"

    return norm(a) == norm(b)


def detach(attachment: Attachment) -> None:
    """Disconnect (which also stops a cluster this process started) and restore the token env."""
    import ray

    if ray.is_initialized() and (attachment.started_here or attachment.saved_env):
        ray.shutdown()
    _restore_env(attachment.saved_env)
    _reset_ray_token_cache()


def cluster_resources() -> dict[str, Any]:
    import ray

    return dict(ray.cluster_resources())
