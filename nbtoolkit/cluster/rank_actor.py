"""The code that runs inside one rank worker: a persistent namespace and a torch.distributed group.

:class:`RankActor` is a plain class; :mod:`nbtoolkit.cluster.ranks` turns it into a Ray
actor (``ray.remote(...)(RankActor)``) with two concurrency groups:

- the default group (one thread) runs the user's cells, one at a time, in the rank's
  namespace, so that state (models, optimizers, the process group) survives across cells;
- the ``control`` group (one more thread) answers while a cell runs: it hands over the
  output the cell printed so far (live, rank-prefixed streaming in the notebook), reports
  the rank's state, and interrupts the running cell (Ctrl-C in the notebook).

Interrupting raises ``KeyboardInterrupt`` in the cell's thread with
``PyThreadState_SetAsyncExc``: Python delivers it at the next bytecode, so a cell looping
in Python (or sleeping in short steps) stops at once; a cell blocked inside one long C call
stops when that call returns. For the common case, a collective waiting for peers that
did stop, the notebook side closes the process group on those peers and has every rank cut
its connections to the others (``tcp_endpoints``/``sever_peers``), which ends the wait at
once whatever holds the group, and forms a new group (:mod:`nbtoolkit.cluster.freeing`).

This module imports neither ray nor torch at import time: Ray imports it on each worker.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import io
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["CellOutcome", "RankActor", "compile_cell"]

# What one run of a cell sends back to the notebook: plain builtins only (cheap to pickle).
CellOutcome = dict[str, Any]

_CELL_FILENAME = "<remote-cell>"


def compile_cell(source: str) -> tuple[Any, Any]:
    """Compile a cell into (body, last-expression) code objects, like IPython runs a cell.

    The value of a trailing expression is the cell's value; everything before it is executed.
    """
    tree = ast.parse(source, filename=_CELL_FILENAME)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last_stmt = tree.body.pop()
        assert isinstance(last_stmt, ast.Expr)
        last = ast.Expression(last_stmt.value)
    body = compile(tree, _CELL_FILENAME, "exec")
    tail = compile(last, _CELL_FILENAME, "eval") if last is not None else None
    return body, tail


class _OutputSink:
    """Collects what a cell prints, as (stream, text) chunks, until the notebook takes them."""

    def __init__(self) -> None:
        self._chunks: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def write(self, stream: str, text: str) -> None:
        if text:
            with self._lock:
                if self._chunks and self._chunks[-1][0] == stream:
                    self._chunks[-1] = (stream, self._chunks[-1][1] + text)
                else:
                    self._chunks.append((stream, text))

    def take(self) -> list[tuple[str, str]]:
        with self._lock:
            chunks, self._chunks = self._chunks, []
        return chunks


class _SinkStream(io.TextIOBase):
    """A text stream standing in for sys.stdout / sys.stderr while a cell runs."""

    def __init__(self, sink: _OutputSink, name: str) -> None:
        super().__init__()
        self._sink = sink
        self._name = name

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._sink.write(self._name, text)
        return len(text)

    def isatty(self) -> bool:
        return False


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _remote_traceback(exc: BaseException) -> str:
    """The traceback of an exception in user code, without nbtoolkit's own frames.

    The rank's machinery and the tools a cell runs under (memory_timeline, the profiler)
    are not the user's code, as IPython hides its own frames. Chained exceptions keep
    their causes, each filtered the same way; an error nbtoolkit raised itself keeps its
    message.
    """
    shown = traceback.TracebackException.from_exception(exc)
    link: traceback.TracebackException | None = shown
    while link is not None:
        link.stack = traceback.StackSummary.from_list(
            [frame for frame in link.stack if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR)]
        )
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return "".join(shown.format()).rstrip()


def _let_pending_interrupt_land() -> None:
    """Give an undelivered KeyboardInterrupt for this thread the chance to be raised, and drop it.

    Python raises an exception set with ``PyThreadState_SetAsyncExc`` when the thread next
    checks for pending work, which it does at the start of every Python function: calling
    one delivers it, here, where it is caught.
    """
    # Not contextlib.suppress: its own __enter__ is a Python function entry, where the
    # exception could land before the suppressing block is set up.
    try:  # noqa: SIM105
        _python_function_entry()
    except KeyboardInterrupt:
        pass


def _python_function_entry() -> None:
    """An empty Python function: entering it is where pending asynchronous exceptions land."""


def _interface_with_address(ip: str) -> str | None:
    """The name of the network interface holding IPv4 address ``ip`` (Linux), else None."""
    import fcntl
    import struct

    siocgifaddr = 0x8915  # ioctl: an interface's IPv4 address
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                request = struct.pack("256s", name.encode()[:15])
                address = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), siocgifaddr, request)[20:24])
                if address == ip:
                    return name
    return None


def _rendezvous_store(host: str, port: int, rank: int, world_size: int, timeout_s: float) -> Any:
    """The torch.distributed rendezvous store; rank 0's listens on ``host`` (its cluster address) only.

    torch's ``tcp://`` init method (and ``TCPStore(is_master=True)``) binds the store's server to
    every interface of rank 0's machine, whatever host name it is given: anyone who can reach
    the machine could read or write the group's keys. torch cannot be told which address to bind
    (``TCPStore`` has no bind-address argument, torch 2.4 to 2.13), but it can be handed a
    socket that is already listening (``master_listen_fd``, POSIX only): rank 0 binds that
    socket to the address the other ranks connect to. Where ``master_listen_fd`` is missing
    (Windows), the store falls back to torch's own (all interfaces).
    """
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if rank != 0 or os.name != "posix":
        return dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(max(128, world_size))
    except BaseException:
        listener.close()
        raise
    # detach(): the store owns the descriptor from here on (closing it is the store's job).
    return dist.TCPStore(
        host, port, world_size, is_master=True, timeout=timeout, master_listen_fd=listener.detach()
    )


class RankActor:
    """One rank: its namespace, its process-group membership, its running cell."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.namespace: dict[str, Any] = {
            "__name__": "__nbt_remote__",
            "rank": rank,
            "world_size": world_size,
        }
        self._sink = _OutputSink()
        self._lock = threading.Lock()
        self._running_thread: int | None = None
        self._running_since: float | None = None
        self._interrupt_sent = False  # interrupt() raised KeyboardInterrupt in the running cell
        self._cells_run = 0
        self._backend: str | None = None
        self._device = "cpu"
        self._master: str | None = None  # the process group's rendezvous (host:port)
        self._timeout_s: float | None = None  # its collective timeout
        self._world_id: int | None = None  # id() of the world group this rank formed last

    # ---- setup ----
    def node_info(self) -> dict[str, Any]:
        """Where this rank lives: pid, host, IP, GPUs Ray gave it, and a free port (for rank 0)."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("", 0))
            free_port = probe.getsockname()[1]
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "free_port": free_port,
            "node_id": ray.get_runtime_context().get_node_id(),
            "world_size": self.world_size,
        }

    def setup_process_group(
        self, master_addr: str, master_port: int, backend: str, timeout_s: float
    ) -> dict[str, Any]:
        """Join the torch.distributed group (all ranks call this at once).

        Sets the variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
        MASTER_PORT) so that DDP, DeepSpeed and user code find them as usual. The collective
        timeout bounds how long a rank waits for a peer that died or hangs.
        """
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        os.environ.update(
            {
                "RANK": str(self.rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": "0",  # Ray gives each rank its own devices: its local device is 0
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
            }
        )
        # Gloo (and NCCL's bootstrap) bind to the address the host name resolves to, which on
        # many hosts is 127.0.x.x or nothing: peers on other nodes then cannot connect and
        # the group never forms. Use the interface of the address Ray knows this node by.
        interface = _interface_with_address(self._node_ip())
        if interface and interface != "lo":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
            os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
        # torch's Flight Recorder (NCCL; gloo too, checked on torch 2.13): each rank's last collectives,
        # for _dump_fr_trace() and nbt.load_flight_recorder. Read when the group forms; 0 turns it off.
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
        if backend == "nccl":
            torch.cuda.set_device(0)
            self._device = "cuda:0"
        holders: list[tuple[str, str]] = []
        regroup = self._backend is not None  # a new group after the old one was closed or broke
        if regroup:  # (shutdown_group may have destroyed the old one already)
            from nbtoolkit.cluster.group_holders import forget_cached_groups, group_holders

            holders = group_holders(self.namespace, self.world_size)  # named to the user
            forget_cached_groups()
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # whatever state the old group is in, leave it
                dist.destroy_process_group()
        dist.init_process_group(
            backend=backend,
            store=_rendezvous_store(master_addr, master_port, self.rank, self.world_size, timeout_s),
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        from nbtoolkit.cluster import hang_recorder

        hang_recorder.install()  # note each collective a cell calls (for the hang diagnosis)
        hang_recorder.recorder.reset_groups()
        rebound: list[str] = []
        if regroup:  # DDP and FSDP2 models follow the new group; what cannot is named
            from nbtoolkit.cluster.group_holders import rebind_ddp, rebind_fsdp2

            holders, rebound = rebind_ddp(self.namespace, holders, self._world_id)
            holders += rebind_fsdp2(self.namespace)
        self._world_id = id(dist.group.WORLD)  # (an id, not a reference: that would keep it open)
        self._backend = backend
        self._master, self._timeout_s = f"{master_addr}:{master_port}", timeout_s
        self.namespace.update({"torch": torch, "dist": dist, "device": torch.device(self._device)})
        return {"backend": backend, "device": self._device, "holders": holders, "rebound": rebound}

    @staticmethod
    def _node_ip() -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    # ---- running code ----
    def run_cell(self, source: str, max_result_bytes: int | None = None) -> CellOutcome:
        """Run a cell's source in the rank's namespace; its last expression is the value."""
        try:
            body, tail = compile_cell(source)
        except SyntaxError as exc:
            return self._outcome(None, "".join(traceback.format_exception_only(type(exc), exc)).rstrip(), 0.0)

        def cell() -> Any:
            exec(body, self.namespace)  # noqa: S102 - running the user's cell is the point
            return eval(tail, self.namespace) if tail is not None else None  # noqa: S307 - same

        return self._run(cell, source, max_result_bytes)

    def run_function(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        max_result_bytes: int | None = None,
    ) -> CellOutcome:
        """Call a function (shipped from the notebook) on this rank."""
        return self._run(lambda: fn(*args, **(kwargs or {})), None, max_result_bytes)

    def run_tool(self, module: str, name: str, payload: Any, kwargs: dict[str, Any]) -> CellOutcome:
        """Call ``module.name(step, **kwargs)`` where step runs the payload (a cell or a function).

        The tools (a profiler capture, a memory timeline, a DeepSpeed sweep step) live in
        nbtoolkit and are imported here, on the rank.
        """
        import importlib

        step = self.as_callable(payload)
        source = payload if isinstance(payload, str) else None
        tool = getattr(importlib.import_module(module), name)
        # model= / optimizer= given by name refer to objects in this rank's namespace.
        for key in ("model", "optimizer"):
            if isinstance(kwargs.get(key), str):
                if kwargs[key] not in self.namespace:
                    return self._outcome(
                        None, f"NameError: rank {self.rank} has no {key} named {kwargs[key]!r}", 0.0
                    )
                kwargs = {**kwargs, key: self.namespace[kwargs[key]]}
        return self._run(lambda: tool(step, **kwargs), source)

    def as_callable(self, payload: Any) -> Callable[[], Any]:
        """A zero-argument callable running a cell source (in the namespace) or a function."""
        if callable(payload):
            return payload
        body, tail = compile_cell(str(payload))

        def cell() -> Any:
            exec(body, self.namespace)  # noqa: S102 - the user's own code
            return eval(tail, self.namespace) if tail is not None else None  # noqa: S307 - same

        return cell

    def _run(
        self, work: Callable[[], Any], source: str | None = None, max_result_bytes: int | None = None
    ) -> CellOutcome:
        from nbtoolkit.cluster.hang_recorder import recorder
        from nbtoolkit.cluster.shipping import ResultTooLarge, shippable

        started = time.perf_counter()
        stdout, stderr = sys.stdout, sys.stderr
        value: Any = None
        error: str | None = None
        tid = threading.get_ident()
        try:
            with self._lock:
                self._running_thread = tid
                self._running_since = time.time()
            recorder.begin_cell(tid, source)
            sys.stdout = _SinkStream(self._sink, "stdout")
            sys.stderr = _SinkStream(self._sink, "stderr")
            try:
                value = shippable(work(), max_result_bytes)
            except KeyboardInterrupt as exc:  # ours (interrupt()), or one the cell raised itself
                error = "KeyboardInterrupt: the cell was interrupted" if self._interrupt_sent else (
                    _remote_traceback(exc)
                )
            except ResultTooLarge as exc:  # the cell ran; its value stays on the rank
                error = str(exc)
            except BaseException as exc:  # the user's exception, whatever it is, goes back as text
                error = _remote_traceback(exc)
            finally:
                recorder.end_cell()
                with self._lock:
                    self._running_thread = None
                    self._running_since = None
                    interrupt_sent, self._interrupt_sent = self._interrupt_sent, False
                if interrupt_sent:
                    # An interrupt sent as the cell ended must not hit Ray's own code: make it
                    # land here. Never clear it with PyThreadState_SetAsyncExc(tid, NULL): on
                    # CPython 3.11 that raises the interpreter's "async exception pending" flag
                    # with no thread to consume it, and every later function entry then checks
                    # for it; with torch's Python tracer on (profiler with_stack=True, which
                    # memory timelines use) the worker spins at a function entry forever.
                    _let_pending_interrupt_land()
                sys.stdout, sys.stderr = stdout, stderr
                self._cells_run += 1
        except KeyboardInterrupt:  # a late interrupt landed in the bookkeeping above
            sys.stdout, sys.stderr = stdout, stderr
            recorder.end_cell()
            error = error or "KeyboardInterrupt: the cell was interrupted"
        if error and self._backend and "Default process group has not been initialized" in error:
            error += (
                "\n(nbtoolkit: a cell destroyed this rank's process group, dist.destroy_process_group(); "
                "run cluster.restart() for fresh ranks in a new group)"
            )
        return self._outcome(value, error, time.perf_counter() - started)

    def _outcome(self, value: Any, error: str | None, elapsed_s: float) -> CellOutcome:
        return {
            "rank": self.rank,
            "value": value,
            "error": error,
            "output": self._sink.take(),
            "elapsed_s": elapsed_s,
        }

    # ---- variables ----
    def push(self, values: dict[str, Any]) -> CellOutcome:
        """Set variables in the namespace (values pushed from the notebook)."""
        return self._run(lambda: self.namespace.update(values))

    def shutdown_group(self) -> None:
        """Leave the process group cleanly (before the actor is killed)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    # ---- control group: answers while a cell runs ----
    def tcp_endpoints(self) -> list[tuple[str, int]]:
        """This process's TCP endpoints (see :mod:`nbtoolkit.cluster.peer_sockets`)."""
        from nbtoolkit.cluster.peer_sockets import tcp_endpoints

        return tcp_endpoints()

    def sever_peers(self, peers: list[tuple[str, int]]) -> int:
        """Cut this rank's connections to the other ranks (not the store's): a blocked collective fails."""
        from nbtoolkit.cluster.peer_sockets import sever

        keep = []
        if self._master:
            host, _, port = self._master.rpartition(":")
            keep.append((host, int(port)))
        return sever(peers, keep)

    def take_output(self) -> list[tuple[str, str]]:
        return self._sink.take()

    def poll(self) -> dict[str, Any]:
        """The output printed since the last poll, and the count of completed collectives (progress)."""
        from nbtoolkit.cluster.hang_recorder import recorder

        return {"output": self._sink.take(), "completed": recorder.completed}

    def hang_state(self) -> dict[str, Any]:
        """Where the running (or last) cell is: its collectives, its state and its stack now."""
        from nbtoolkit.cluster.hang_recorder import flight_recorder_dump, recorder

        state = {"rank": self.rank, **recorder.snapshot()}
        if self._backend == "nccl" or os.environ.get("NBT_HANG_FLIGHT_RECORDER") == "1":
            # NCCL returns from a collective before the GPU ran it: torch's record says what completed.
            state["flight_recorder"] = flight_recorder_dump()
            state["backend"] = self._backend
        return state

    def state(self) -> dict[str, Any]:
        with self._lock:
            busy_for = None if self._running_since is None else time.time() - self._running_since
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "busy_s": busy_for,
            "cells_run": self._cells_run,
            "backend": self._backend,
            "device": self._device,
            "master": self._master,
            "collective_timeout_s": self._timeout_s,
        }

    def interrupt(self) -> bool:
        """Raise KeyboardInterrupt in the running cell; False when no cell is running."""
        with self._lock:
            tid = self._running_thread
            if tid is None:
                return False
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(tid), ctypes.py_object(KeyboardInterrupt)
            )
            self._interrupt_sent = True
        return True
