"""Attach this process to a Ray cluster: start a local one with token authentication, or connect.

Two ways to connect: ``ray://HEAD:10001`` goes through Ray Client (the notebook is not a
Ray node; only the head's client port must be reachable), ``HEAD:6379`` joins the cluster
through its GCS as a driver (a kernel on a cluster node, which can reach every node).

Four things Ray does not do for us:

- **Fail fast on a bad token.** ``ray.init(address=...)`` with a missing or wrong token
  retries for 20-30 s and then says only "Failed to connect". Before calling it we ask the
  cluster's GCS one cheap question (``GetClusterId``) over gRPC with the token in the
  ``authorization`` header, with a 5 s deadline: UNAUTHENTICATED means the token is wrong
  or missing, UNAVAILABLE means nothing answers at that address. For ``ray://`` we ask the
  Ray Client server its cheapest question (a ``ClusterInfo`` PING) the same way; Ray
  Client itself retries for about a minute and then says "connection timeout".
- **Say which versions differ.** Ray refuses a client or driver whose Ray or Python
  version differs from the cluster's, in a multi-line text; we turn it into one sentence
  naming both sides' versions and what to install.
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtoolkit.core.errors import ClusterError, NbtUsageError

__all__ = [
    "Attachment",
    "attach_local",
    "connect",
    "detach",
    "probe",
    "probe_client",
    "read_token_file",
    "remove_stale_current_cluster_file",
    "resolve_token",
]

_PROBE_TIMEOUT_S = 5.0
#: The Ray namespace of the rank actors of connected clusters (named ranks are found there).
RANK_NAMESPACE = "nbtoolkit"
_START_ATTEMPTS = 2
#: Tries of a Ray Client connect whose session the head's proxier failed to start, and the pause between.
_CLIENT_SESSION_ATTEMPTS = 3
_CLIENT_RETRY_PAUSE_S = 1.0
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
            raise ClusterError(_auth_failure(address, token)) from None
        raise ClusterError(
            f"no Ray cluster answers at {address} ({code.name}: {exc.details()}). Check the "
            "address (host:port of the head node's GCS, default port 6379) and that the "
            "cluster is running."
        ) from None
    finally:
        channel.close()


def _auth_failure(address: str, token: str | None) -> str:
    given = "no token was given" if not token else "the token given was rejected"
    return (
        f"authentication failed for the Ray cluster at {address}: {given}. Pass the "
        "cluster's token (Cluster.connect(address, token=...) or "
        "`%nbt cluster connect ADDRESS --token-file FILE`); on the head node "
        "`ray get-auth-token` prints it."
    )


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
    """Attach to the Ray cluster at ``address``, checking the token first (fast).

    ``host:port`` is the head's GCS: this process joins the cluster as a driver, which needs
    it to reach every node (a kernel on a cluster node). ``ray://host:port`` is the head's
    Ray Client server: only that one port must be reachable (a notebook outside the cluster).
    """
    import ray

    token = resolve_token(token)
    client = address.startswith("ray://")
    target = address.removeprefix("ray://")
    if client:
        probe_client(target, token)
    else:
        probe(target, token)
    if ray.is_initialized():
        current = _client_address if _is_client() else ray.get_runtime_context().gcs_address
        if current and _same_address(current.removeprefix("ray://"), target):
            return Attachment(address=address, token=token, started_here=False, saved_env={})
        raise ClusterError(
            f"this notebook is already attached to the Ray cluster at {current}: close that "
            "Cluster (or `%nbt cluster stop`) before connecting to another one"
        )
    saved = _set_token_env(token)
    attempts = _CLIENT_SESSION_ATTEMPTS if client else 1
    for attempt in range(attempts):
        try:
            ray.init(
                address=address,
                namespace=RANK_NAMESPACE,  # where named ranks live (re-attached after a kernel restart)
                log_to_driver=False,
                configure_logging=False,
            )
            break
        except Exception as exc:
            # The Ray Client server starts one server process per client on the head. That start
            # fails now and then: it times out on a busy head ("Starting Ray client server
            # failed"), or the new process exits while the proxier looks at it (psutil's
            # ZombieProcess in start_specific_server, seen after a rejected token). A new
            # ray.init is a new client with a fresh client id and a fresh server process.
            session_failed = client and _client_session_failed(str(exc))
            with contextlib.suppress(Exception):
                ray.shutdown()
            if session_failed and attempt < attempts - 1:
                time.sleep(_CLIENT_RETRY_PAUSE_S)
                continue
            _restore_env(saved)
            if session_failed:
                raise ClusterError(_client_session_failure(address, exc, attempts)) from None
            raise ClusterError(_connect_failure(address, exc)) from None
    if client:
        _remember_client(address)
    return Attachment(address=address, token=token, started_here=False, saved_env=saved)


# Ray Client mode keeps no GCS address: remember which ray:// address this process uses.
_client_address: str | None = None


def _remember_client(address: str | None) -> None:
    global _client_address
    _client_address = address


def _is_client() -> bool:
    with contextlib.suppress(ImportError, AttributeError):
        from ray.util.client import ray as client_ray

        return bool(client_ray.is_connected())
    return False


def _client_session_failed(text: str) -> bool:
    """Whether a Ray Client connect failed while the head's proxier started this client's server."""
    return "Initialization failure from server" in text or "client server failed" in text


def _client_session_failure(address: str, exc: BaseException, attempts: int) -> str:
    """One message for a proxier that failed every try: its last line, never its traceback."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = lines[-1] if lines else type(exc).__name__
    said = said if len(said) <= 200 else said[:200] + "…"
    return (
        f"the Ray Client server at {address} accepted the token but failed to start a session for this "
        f"notebook, {attempts} times (its last words: {said}). Connect again in a few seconds; if it "
        "keeps failing, restart Ray on the head node (`ray stop`, then `ray start --head ...`) and read "
        "ray_client_server*.err in its /tmp/ray/session_latest/logs."
    )


def _connect_failure(address: str, exc: BaseException) -> str:
    """One message for a failed ``ray.init``; a version mismatch names both sides' versions."""
    import re
    import sys

    import ray

    text = str(exc)
    if "Version mismatch" in text:
        versions = re.findall(r"Ray: (\S+)\s+Python: (\S+)", text)
        if len(versions) == 2:
            (cluster_ray, cluster_py), (here_ray, here_py) = versions
        else:  # Ray changed its wording: still name what we know
            cluster_ray = cluster_py = "?"
            here_ray, here_py = ray.__version__, sys.version.split()[0]
        return (
            f"the Ray cluster at {address} runs Ray {cluster_ray} on Python {cluster_py}, but this "
            f"notebook has Ray {here_ray} on Python {here_py}: Ray needs the same Ray version and "
            f"Python {cluster_py.rsplit('.', 1)[0]} on both sides. Install them in the notebook's "
            f"environment (pip install 'ray=={cluster_ray}', Python {cluster_py.rsplit('.', 1)[0]})."
        )
    return f"could not connect to the Ray cluster at {address}: {type(exc).__name__}: {text}"


def probe_client(address: str, token: str | None, *, timeout_s: float = _PROBE_TIMEOUT_S) -> None:
    """Check in one gRPC call that a Ray Client server answers at ``address`` and accepts ``token``.

    The same question Ray Client asks first (a ``ClusterInfo`` PING), with a deadline:
    Ray's own connect retries for about a minute and then says "connection timeout".
    """
    import grpc
    from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else []
    channel = grpc.insecure_channel(address)
    try:
        stub = ray_client_pb2_grpc.RayletDriverStub(channel)
        request = ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING)  # type: ignore[attr-defined]  # generated protobuf
        stub.ClusterInfo(request, metadata=metadata, timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise ClusterError(_auth_failure(f"ray://{address}", token)) from None
        raise ClusterError(
            f"no Ray Client server answers at ray://{address} ({code.name}: {exc.details()}). Check "
            "the address (host:port of the head node's Ray Client server, default port 10001, "
            "`ray start --head --ray-client-server-port 10001`), that the cluster is running and "
            "that this port is reachable from here."
        ) from None
    finally:
        channel.close()


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
        _remember_client(None)
    _restore_env(attachment.saved_env)
    _reset_ray_token_cache()


def cluster_resources() -> dict[str, Any]:
    import ray

    return dict(ray.cluster_resources())
