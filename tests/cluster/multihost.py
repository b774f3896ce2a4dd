"""A test bed of three "hosts" on one machine: Linux network namespaces joined by a bridge.

    with MultiHostBed.start() as bed:          # as root, inside a private network namespace
        bed.client_address                      # "ray://10.77.0.1:10001" (Ray Client on the head)
        bed.gcs_address, bed.token              # "10.77.0.1:6379" and its auth token
        bed.python(2, "print(1)")               # run Python on host 2
        bed.kill_host(2)                        # every process of host 2 dies (a node is lost)

Layout (nothing reaches outside; there is no route out of 10.77.0.0/24):

- a bridge ``br0`` in a network namespace of its own (``<prefix>br``);
- host 1 (``<prefix>h1``, 10.77.0.1): the Ray head (``ray start --head``, token auth, Ray
  Client server on port 10001, 3 CPUs);
- host 2 (``<prefix>h2``, 10.77.0.2): a Ray worker node (3 CPUs);
- host 3 (10.77.0.3): the network namespace of the process that starts the bed (the test
  or benchmark process, i.e. the notebook), joined to the bridge by a veth pair. It is not
  a Ray node. This is why the bed needs the caller to be in a *private* network namespace
  (``unshare --net``, as ``make test`` runs the suite): the bed adds an address and a link
  to the caller's namespace, and must never do that to the machine's real one.

Hosts 1 and 2 run every process in a mount namespace of their own with a private tmpfs on
``/tmp`` and ``/dev/shm`` (Ray's session folders, logs, object store) and ``HOME=/tmp/home``,
and a UTS namespace with hostname ``host1``/``host2``: they share nothing but the network
(and the read-only code: the virtual environment and this checkout, through PYTHONPATH).

Every wait has a deadline; a failure says which step failed with the command's output.
:meth:`close` always removes the namespaces and kills every process in them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests._python import run_python

__all__ = ["BedUnavailable", "MultiHostBed", "bed_unavailable_reason"]

SUBNET = "10.77.0"
HEAD_IP = f"{SUBNET}.1"
GCS_PORT = 6379
CLIENT_PORT = 10001
START_TIMEOUT_S = 90.0
_NODE_ATTEMPTS = 3
CPUS_PER_HOST = 3  # the notebook's 2 ranks (one per host) leave room to pack 2 more on one host
_ROOT = Path(__file__).resolve().parents[2]


def _paths_under_tmp() -> list[str]:
    """The code the hosts run (this checkout, the Python environment) where it lies under /tmp."""
    paths = sorted({str(Path(p).resolve()) for p in (_ROOT, sys.prefix, Path(sys.executable).parent)})
    under = [p for p in paths if p == "/tmp" or p.startswith("/tmp/")]
    # keep only the outermost: a venv inside the checkout comes with it
    return [p for p in under if not any(p != q and p.startswith(q + "/") for q in under)]


class BedUnavailable(RuntimeError):
    """The bed cannot be built here (not root, no private network namespace, no `ip`)."""


def _in_private_network_namespace() -> bool:
    # /proc/net/dev lists the interfaces of this process's network namespace.
    lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    names = {line.split(":")[0].strip() for line in lines}
    return all(name == "lo" or name.startswith("nbt") for name in names)


def bed_unavailable_reason() -> str | None:
    """Why the bed cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "the multi-host bed needs root (network namespaces, mounts): run the suite as root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"the multi-host bed needs the `{tool}` command (iproute2 / util-linux), not found"
    if not _in_private_network_namespace():
        return (
            "the multi-host bed joins this process's network namespace to its bridge, so it runs only "
            "inside a private one: `unshare --net sh -c 'ip link set lo up && python -m pytest ...'` "
            "(make test does this as root)"
        )
    return None


def _run(*args: str, timeout: float = 20.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise BedUnavailable(f"bed setup failed: `{' '.join(args)}` -> {(done.stdout + done.stderr).strip()}")
    return done


@dataclass
class MultiHostBed:
    """Three hosts on a bridge, a Ray head on host 1 and a worker node on host 2; see the module."""

    prefix: str
    token: str
    env: dict[str, str]
    nodes: dict[int, subprocess.Popen[str]] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    host3_link: str | None = None

    gcs_address = f"{HEAD_IP}:{GCS_PORT}"
    client_address = f"ray://{HEAD_IP}:{CLIENT_PORT}"

    @staticmethod
    def host_ip(host: int) -> str:
        return f"{SUBNET}.{host}"

    def netns(self, host: int) -> str:
        return f"{self.prefix}h{host}"

    # ---- building ----
    @classmethod
    def start(
        cls, *, node_env: dict[str, str] | None = None, timeout_s: float = START_TIMEOUT_S
    ) -> MultiHostBed:
        """Build the network, start the head and the worker node, wait until both are alive."""
        reason = bed_unavailable_reason()
        if reason:
            raise BedUnavailable(reason)
        prefix = f"nbt{os.getpid() % 100000}"
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RAY_", "MASTER_", "WORLD_SIZE", "RANK"))
        }
        env.update(
            {
                "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
                "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p),
                "RAY_AUTH_MODE": "token",
                "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
                **(node_env or {}),
            }
        )
        bed = cls(prefix=prefix, token=secrets.token_urlsafe(32), env=env)
        atexit.register(bed.close)  # a notebook kernel that exits without closing leaves nothing behind
        try:
            bed._build_network()
            bed._start_node(1, timeout_s)
            bed._start_node(2, timeout_s)
        except BaseException:
            bed.close()
            raise
        return bed

    def _build_network(self) -> None:
        bridge_ns = f"{self.prefix}br"
        for ns in (bridge_ns, self.netns(1), self.netns(2)):
            _run("ip", "netns", "add", ns)
            self.namespaces.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", bridge_ns, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", bridge_ns, "link", "set", "br0", "up")
        for host in (1, 2, 3):
            inner, outer = f"{self.prefix}a{host}", f"{self.prefix}b{host}"
            _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
            _run("ip", "link", "set", outer, "netns", bridge_ns)
            _run("ip", "-n", bridge_ns, "link", "set", outer, "master", "br0", "up")
            if host == 3:  # this process's own namespace is host 3 (the notebook)
                self.host3_link = inner
                _run("ip", "addr", "add", f"{self.host_ip(3)}/24", "dev", inner)
                _run("ip", "link", "set", inner, "up")
                continue
            ns = self.netns(host)
            _run("ip", "link", "set", inner, "netns", ns)
            _run("ip", "-n", ns, "link", "set", inner, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{self.host_ip(host)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")

    def host_command(self, host: int, command: str) -> list[str]:
        """argv running the shell ``command`` on ``host`` (its network, /tmp, /dev/shm, HOME, hostname)."""
        # A checkout or virtual environment that lives under /tmp (a CI clone, say) would vanish
        # under the host's private /tmp: bind it aside on the new /dev/shm first, then back.
        keep = _paths_under_tmp()
        aside = "".join(
            f"mkdir -p /dev/shm/nbt-keep/{i}; mount --bind {shlex.quote(path)} /dev/shm/nbt-keep/{i}; "
            for i, path in enumerate(keep)
        )
        back = "".join(
            f"mkdir -p {shlex.quote(path)}; mount --bind /dev/shm/nbt-keep/{i} {shlex.quote(path)}; "
            for i, path in enumerate(keep)
        )
        setup = (
            f"set -e; mount -t tmpfs tmpfs /dev/shm; {aside}mount -t tmpfs tmpfs /tmp; {back}"
            f"mkdir -p /tmp/home; export HOME=/tmp/home; hostname host{host}; "
        )
        return [
            "ip", "netns", "exec", self.netns(host),
            "unshare", "--mount", "--uts", "--propagation", "private",
            "bash", "-c", setup + command,
        ]  # fmt: skip

    def _start_node(self, host: int, timeout_s: float) -> None:
        """Start Ray on ``host`` and wait until the GCS lists it; once more if Ray timed out starting.

        ``ray start`` gives its raylet a fixed 30 s to register with the GCS; on a busy 2-core
        machine that can pass. Each new try starts from a clean host (fresh /tmp).
        """
        for attempt in range(_NODE_ATTEMPTS):
            self._launch_node(host)
            try:
                self.wait_for_nodes(host, timeout_s=timeout_s)
                return
            except BedUnavailable as exc:
                if attempt == _NODE_ATTEMPTS - 1 or "timed out during startup" not in str(exc):
                    raise
                self.kill_host(host)
                self.nodes.pop(host).wait(timeout=10)

    def _launch_node(self, host: int) -> None:
        common = (
            f"--node-ip-address {self.host_ip(host)} --num-cpus {CPUS_PER_HOST} --num-gpus 0 "
            "--object-store-memory 100000000 --disable-usage-stats --block"
        )
        if host == 1:
            role = (
                f"--head --port {GCS_PORT} --ray-client-server-port {CLIENT_PORT} "
                "--include-dashboard false"
            )
        else:
            role = f"--address {self.gcs_address}"
        log = Path(f"/tmp/{self.prefix}-host{host}.log")
        self.nodes[host] = subprocess.Popen(
            self.host_command(host, f"exec ray start {role} {common}"),
            env={**self.env, "RAY_AUTH_TOKEN": self.token},
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def alive_nodes(self, timeout_s: float = 3.0) -> list[str]:
        """IPs of the nodes the head's GCS lists as alive (asked over gRPC with the token)."""
        import grpc
        from ray.core.generated import gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc

        channel = grpc.insecure_channel(self.gcs_address)
        try:
            stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
            reply = stub.GetAllNodeInfo(
                gcs_service_pb2.GetAllNodeInfoRequest(),
                metadata=[("authorization", f"Bearer {self.token}")],
                timeout=timeout_s,
            )
        finally:
            channel.close()
        alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
        return sorted(n.node_manager_address for n in reply.node_info_list if n.state == alive)

    def wait_for_nodes(self, count: int, *, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        seen: list[str] = []
        while time.monotonic() < deadline:
            for host, proc in self.nodes.items():
                if proc.poll() is not None:
                    raise BedUnavailable(f"Ray on host {host} exited ({proc.returncode}):\n{self.log(host)}")
            with contextlib.suppress(Exception):  # not up yet
                seen = self.alive_nodes()
                if len(seen) >= count:
                    return
            time.sleep(0.5)
        logs = "\n".join(self.log(h) for h in self.nodes)
        raise BedUnavailable(f"{count} Ray nodes not alive within {timeout_s:.0f} s (alive: {seen}):\n{logs}")

    def log(self, host: int) -> str:
        path = Path(f"/tmp/{self.prefix}-host{host}.log")
        return f"--- host {host} ---\n" + (path.read_text()[-3000:] if path.exists() else "(no log)")

    # ---- using ----
    def python(self, host: int, code: str, *, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``python -c code`` on ``host`` (3: this namespace, a fresh process); assert it succeeded."""
        if host == 3:
            return run_python("-c", code, env=self.env, timeout=timeout)
        argv = self.enter(host, sys.executable, "-c", code)
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert done.returncode == 0, f"python on host {host} failed:\n{(done.stdout + done.stderr)[-3000:]}"
        return done

    def enter(self, host: int, *argv: str) -> list[str]:
        """argv running ``argv`` inside the running ``host``: its network, mounts (/tmp) and hostname."""
        proc = self.nodes.get(host)
        if proc is None or proc.poll() is not None:
            raise BedUnavailable(f"host {host} is not running")
        return ["nsenter", "--target", str(proc.pid), "--mount", "--uts", "--net", "--", *argv]

    def pids(self, host: int) -> list[int]:
        done = _run("ip", "netns", "pids", self.netns(host), check=False)
        return [int(p) for p in done.stdout.split()]

    def kill_host(self, host: int) -> None:
        """SIGKILL every process of ``host`` (its Ray node and the rank workers on it)."""
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    # ---- teardown ----
    def close(self) -> None:
        """Kill every process of the bed and remove its namespaces and links (safe to call twice)."""
        for host in (1, 2):
            if self.netns(host) in self.namespaces:
                self.kill_host(host)
        for proc in self.nodes.values():
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(timeout=10)
        self.nodes.clear()
        if self.host3_link:
            _run("ip", "link", "del", self.host3_link, check=False)
            self.host3_link = None
        for ns in self.namespaces:
            _run("ip", "netns", "del", ns, check=False)
        self.namespaces.clear()
        for host in (1, 2):
            Path(f"/tmp/{self.prefix}-host{host}.log").unlink(missing_ok=True)

    def __enter__(self) -> MultiHostBed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def multihost_bed(**options: object) -> Iterator[MultiHostBed]:
    """The bed for a ``with`` block (benchmarks); tests use the ``multihost`` fixture."""
    bed = MultiHostBed.start(**options)  # type: ignore[arg-type]
    try:
        yield bed
    finally:
        bed.close()
