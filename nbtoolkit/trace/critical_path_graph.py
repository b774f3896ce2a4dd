"""The dependency graph of one iteration and its longest path (the work of ``nbt.critical_path``).

Every selected event ``i`` becomes two nodes, its start ``2*i`` and its end ``2*i + 1``, at
their timestamps. An edge says "the destination cannot happen before the source"; its
``weight`` is the *work* it stands for (µs), its time is ``ts(dest) - ts(src)``. Edges:

==================  ==========================================================  =============
edge kind           from -> to                                                  weight
==================  ==========================================================  =============
``cpu``             on one host thread, down and along the nesting of ops:      time
                    parent start -> first child start, child end -> next
                    sibling start, last child end -> parent end, leaf start ->
                    leaf end
``wait``            the end of a *blocking* call (cudaDeviceSynchronize,        0
                    cudaStreamSynchronize, cudaEventSynchronize, cudaMemcpy...)
``host gap``        end of one top-level op -> start of the next on its thread  0
``kernel``          a device event's start -> end (kernel, memcpy, memset)      time
``launch``          launching runtime call start -> kernel start, when the      time
                    stream was idle at the launch (a launch delay)
``launch order``    the same, when the stream was busy (kept for causality)     0
``stream``          previous device event on the stream end -> next start       time
``sync``            last device event -> end of the host sync call that waited  0
                    for it (per stream for Stream Sync, all streams for
                    Context Sync, the event's kernel for Event Sync); kernel
                    before a cudaEventRecord -> the next kernel launched on a
                    stream that waits for that event (Stream Wait Event);
                    in a trace with no CUDA sync events, an *inferred* wait:
                    see ``_inferred_wait`` (the launch or stream gap it
                    replaces then weighs 0)
``collective``      a host-side collective run by a backend thread (gloo's     time
                    ``gloo:*`` ops): start -> end
``enqueue``         the collective call on the caller's thread (``c10d::*``)   time
                    -> the backend op it enqueued (paired in order), or the
                    backend thread's previous op end -> its start when busy
``sync``            a backend op's end -> the caller thread's next op, when     0
                    that thread sat idle across the end and resumed within
                    ``RESUME_US`` or a quarter of the collective's duration
                    of it, whichever is longer (a loaded host wakes late)
==================  ==========================================================  =============

Waiting is not work: a path through a blocking sync call or a gap weighs nothing there, so
the longest path goes through whatever the host waited *for*. These are the rules of
HolisticTraceAnalysis's critical path (HTA 0.5, with its zero-weight launch edges on), on
which nbtoolkit's result is tested to agree, with one difference: every device event that
shares a launch's correlation is linked to it, so the kernels of a ``cudaGraphLaunch`` (all
of which carry the launch's correlation) are on the graph; HTA links one event per
correlation and leaves the others out. Two more additions apply where HTA has nothing to
say: device work launched before the window but still running in it is on the graph (from
the window's start), so a kernel queued behind the previous step's work is not counted as
a launch delay; and in a trace without CUDA sync events, cross-stream waits are inferred.

The longest path is found by dynamic programming over a topological order (Kahn's
algorithm): ``best[v] = max(best[u] + w(u, v))`` over the edges into ``v``, 0 for a node
with none; the path ends at the node with the largest ``best`` (the latest such node on a
tie) and is read back through the chosen predecessors.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["BLOCKING_CALLS", "Graph", "build_graph", "longest_path"]

BLOCKING_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventQuery",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpyAsync",  # may block (pageable host memory); HTA treats it as blocking too
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
        "hipMemcpyAsync",
    }
)
RESUME_US = 2000.0  # a thread that resumes this soon after a collective ends was waiting for it
_SYNC_EVENTS = ("Context Sync", "Stream Sync", "Event Sync", "Stream Wait Event")


@dataclass
class Graph:
    """Nodes (``ts`` per node; node ``n`` belongs to event ``n // 2``) and edges as lists."""

    events: pd.DataFrame  # the selected events, row i = nodes 2i and 2i+1
    node_ts: np.ndarray
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    weight: list[float] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)  # the event an edge's time belongs to, -1 none

    def add(self, u: int, v: int, kind: str, owner: int, *, work: bool = True) -> None:
        self.src.append(u)
        self.dst.append(v)
        self.weight.append(max(float(self.node_ts[v] - self.node_ts[u]), 0.0) if work else 0.0)
        self.kind.append(kind)
        self.owner.append(owner)


def build_graph(events: pd.DataFrame, wait_args: pd.DataFrame | None = None) -> Graph:
    """The graph of ``events`` (one rank's selected rows, ``end`` column added); see the module doc."""
    ts = events["ts"].to_numpy(dtype=np.float64)
    end = events["end"].to_numpy(dtype=np.float64)
    node_ts = np.empty(2 * len(events))
    node_ts[0::2], node_ts[1::2] = ts, end
    graph = Graph(events=events, node_ts=node_ts)
    stream = events["stream"].to_numpy()
    backend = events["name"].astype(str).str.startswith(BACKEND_PREFIXES).to_numpy() & (stream < 0)
    _add_host_edges(graph, np.flatnonzero((stream < 0) & ~backend))
    _add_device_edges(graph, wait_args)
    _add_backend_collectives(graph, np.flatnonzero(backend))
    return graph


BACKEND_PREFIXES = ("gloo:",)  # collectives a backend runs on threads of its own
_CALLER_PREFIXES = ("c10d::",)


def _add_backend_collectives(graph: Graph, rows: np.ndarray) -> None:
    """Edges of host collectives run on backend threads (see the table in the module docstring)."""
    if not len(rows):
        return
    ev = graph.events
    ts, end = graph.node_ts[0::2], graph.node_ts[1::2]
    names = ev["name"].astype(str).to_numpy()
    stream = ev["stream"].to_numpy()
    lane = ev["pid"].to_numpy().astype(np.int64) * (1 << 32) + ev["tid"].to_numpy().astype(np.int64)
    host = np.flatnonzero((stream < 0) & ~np.isin(np.arange(len(ev)), rows))
    callers = host[np.char.startswith(names[host].astype(str), _CALLER_PREFIXES)]
    callers = callers[np.argsort(ts[callers], kind="stable")]
    outer: list[int] = []
    for c in callers.tolist():  # the outermost call only (c10d ops nest record_param_comms & co)
        if not outer or ts[c] >= end[outer[-1]] or lane[c] != lane[outer[-1]]:
            outer.append(c)
    rows = rows[np.argsort(ts[rows], kind="stable")]
    last_on_thread: dict[int, int] = {}
    next_caller = 0
    for r in rows.tolist():
        graph.add(2 * r, 2 * r + 1, "collective", r)
        before = last_on_thread.get(int(lane[r]))
        caller = None
        if next_caller < len(outer) and ts[outer[next_caller]] <= ts[r]:
            caller = outer[next_caller]
            next_caller += 1
        if caller is not None and (before is None or end[before] < ts[caller]):
            graph.add(2 * caller, 2 * r, "enqueue", caller)
        elif before is not None:
            graph.add(2 * before + 1, 2 * r, "enqueue", before)
            if caller is not None:
                graph.add(2 * caller, 2 * r, "launch order", -1, work=False)
        last_on_thread[int(lane[r])] = r
        if caller is not None:
            _add_resume_edge(graph, r, host[lane[host] == lane[caller]])


def _add_resume_edge(graph: Graph, r: int, thread_rows: np.ndarray) -> None:
    ts, end = graph.node_ts[0::2], graph.node_ts[1::2]
    done = end[r]
    if ((ts[thread_rows] < done) & (end[thread_rows] > done)).any():
        return  # the thread was busy when the collective ended: it did not wait for it
    after = thread_rows[ts[thread_rows] >= done]
    if len(after):
        first = after[np.argmin(ts[after])]
        if ts[first] - done <= max(RESUME_US, 0.25 * (end[r] - ts[r])):
            graph.add(2 * r + 1, 2 * first, "sync", -1, work=False)


def _add_host_edges(graph: Graph, rows: np.ndarray) -> None:
    ev = graph.events
    ts, end = graph.node_ts[0::2], graph.node_ts[1::2]
    names = ev["name"].astype(str).to_numpy()
    blocking = np.isin(names, list(BLOCKING_CALLS))
    lane = ev["pid"].to_numpy().astype(np.int64) * (1 << 32) + ev["tid"].to_numpy().astype(np.int64)
    order = rows[np.lexsort((-(end[rows] - ts[rows]), ts[rows], lane[rows]))]
    current_lane: int | None = None
    stack: list[int] = []  # open ops on this thread, innermost last
    last: int | None = None  # the node the thread's chain reached (None: between top-level ops)
    last_top: int | None = None

    def close(i: int) -> None:
        nonlocal last, last_top
        stack.pop()
        # leaf start -> end, or last child end -> end: the op's own time (a blocking call's is waiting)
        graph.add(last if last is not None else 2 * i, 2 * i + 1, "wait" if blocking[i] else "cpu", i,
                  work=not blocking[i])
        if stack:
            last = 2 * i + 1
        else:
            last, last_top = None, 2 * i + 1

    for i in order.tolist():
        if lane[i] != current_lane:
            while stack:
                close(stack[-1])
            current_lane, last, last_top = int(lane[i]), None, None
        while stack and end[stack[-1]] <= ts[i]:
            close(stack[-1])
        if stack:
            assert last is not None
            # start -> start: the parent's time; end -> start: the time between siblings (parent's)
            graph.add(last, 2 * i, "cpu", last // 2 if last % 2 == 0 else stack[-1])
        elif last_top is not None:
            graph.add(last_top, 2 * i, "host gap", -1, work=False)
        stack.append(i)
        last = 2 * i
    while stack:
        close(stack[-1])


def _add_device_edges(graph: Graph, wait_args: pd.DataFrame | None) -> None:
    ev = graph.events
    ts, end = graph.node_ts[0::2], graph.node_ts[1::2]
    stream = ev["stream"].to_numpy()
    corr = ev["correlation"].to_numpy()
    names = ev["name"].astype(str).to_numpy()
    on_host = stream < 0
    host_rows = np.flatnonzero(on_host & (corr >= 0))
    runtime_of = dict(zip(corr[host_rows].tolist(), host_rows.tolist(), strict=True))
    device = np.flatnonzero(~on_host)
    is_sync = np.isin(names, _SYNC_EVENTS)
    # syncs are ordered by their end (a Stream Sync overlaps the copy it waits for), the rest by start
    key = np.where(is_sync, end, ts)
    device = device[np.argsort(key[device], kind="stable")]

    # Launch order per stream on the host, for the event-record / stream-wait lookups.
    launches = [(float(ts[runtime_of[int(corr[d])]]), int(stream[d]), int(d))
                for d in device if not is_sync[d] and int(corr[d]) in runtime_of]
    launches.sort()
    state = _DeviceState(launches=launches, waits=_wait_table(wait_args), runtime_of=runtime_of)
    last, gpu_wait = state.last, state.gpu_wait
    infer = not is_sync.any()  # no CUDA sync events recorded: cross-stream waits are inferred
    for d in device.tolist():
        runtime = runtime_of.get(int(corr[d]))
        if is_sync[d]:
            _add_sync(graph, d, names[d], runtime, state)
            continue
        graph.add(2 * d, 2 * d + 1, "kernel", d)
        before = last.get(int(stream[d]))
        waited = gpu_wait.pop(d, None)
        if waited is None and infer:
            waited = _inferred_wait(d, stream=int(stream[d]), before=before, runtime=runtime, ts=ts,
                                    end=end, last=last)
            inferred = waited is not None
        else:
            inferred = False
        if waited is not None:
            graph.add(2 * waited + 1, 2 * d, "sync", -1, work=False)
        launched = False
        if runtime is not None and (before is None or end[before] < ts[runtime]) and (
            waited is None or end[waited] < ts[runtime]
        ):
            # an inferred wait means the delay was waiting, not launching: no work on this edge
            graph.add(2 * runtime, 2 * d, "launch", runtime, work=not inferred)
            launched = True
        elif before is not None and (waited is None or end[waited] < end[before] or inferred):
            graph.add(2 * before + 1, 2 * d, "stream", before, work=not inferred)
        if runtime is not None and not launched:
            graph.add(2 * runtime, 2 * d, "launch order", -1, work=False)
        last[int(stream[d])] = d


WAIT_MATCH_US = 5.0  # a kernel starting this soon after another stream's kernel ended waited for it


def _inferred_wait(d: int, *, stream: int, before: int | None, runtime: int | None, ts: np.ndarray,
                   end: np.ndarray, last: dict[int, int]) -> int | None:
    """Without recorded CUDA events: the kernel of another stream that ``d`` evidently waited for.

    ``d`` started later than both its launch and its stream's previous kernel allowed (by more
    than ``WAIT_MATCH_US``), and within ``WAIT_MATCH_US`` of the end of a kernel on another stream:
    the pattern of a cross-stream event wait (a compute stream waiting for an NCCL stream, or the
    reverse). Without it, the wait would be counted as launch delay or idle time.
    """
    ready = max(end[before] if before is not None else -np.inf,
                ts[runtime] if runtime is not None else -np.inf)
    if ts[d] - ready <= WAIT_MATCH_US:
        return None
    # within WAIT_MATCH_US either side: device clocks of two streams disagree by a few µs
    candidates = [k for s, k in last.items() if s != stream and abs(ts[d] - end[k]) <= WAIT_MATCH_US]
    return max(candidates, key=lambda k: end[k]) if candidates else None


def _wait_table(wait_args: pd.DataFrame | None) -> dict[int, tuple[int, int]]:
    if wait_args is None or not len(wait_args):
        return {}
    return {
        int(c): (int(r), int(s))
        for c, r, s in zip(wait_args["correlation"], wait_args["wait_record_correlation"],
                           wait_args["wait_stream"], strict=True)
    }


@dataclass
class _DeviceState:
    launches: list[tuple[float, int, int]]  # (host launch ts, stream, device row), by launch time
    waits: dict[int, tuple[int, int]]  # sync correlation -> (recorded event's correlation, its stream)
    runtime_of: dict[int, int]  # correlation -> host runtime row
    last: dict[int, int] = field(default_factory=dict)  # stream -> last device event row so far
    gpu_wait: dict[int, int] = field(default_factory=dict)  # device row -> row it waits for


def _add_sync(graph: Graph, d: int, name: str, runtime: int | None, state: _DeviceState) -> None:
    last, launches, runtime_of = state.last, state.launches, state.runtime_of
    stream = int(graph.events["stream"].iat[d])
    if name in ("Context Sync", "Stream Sync"):
        if runtime is None:
            return
        sources = list(last.values()) if name == "Context Sync" else [last.get(stream)]
        for s in sources:
            if s is not None:
                graph.add(2 * s + 1, 2 * runtime + 1, "sync", -1, work=False)
        return
    wait = state.waits.get(int(graph.events["correlation"].iat[d]))
    if wait is None or wait[0] not in runtime_of:
        return  # no record of which event it waited for (no file behind the trace)
    record_ts = graph.node_ts[2 * runtime_of[wait[0]]]
    # the last launch on the recorded stream before cudaEventRecord: what the event marks
    source = next((k for t, s, k in reversed(launches) if t < record_ts and s == wait[1]), None)
    if source is None:
        return
    if name == "Event Sync":
        if runtime is not None:
            graph.add(2 * source + 1, 2 * runtime + 1, "sync", -1, work=False)
        return
    if runtime is None:
        return
    wait_ts = graph.node_ts[2 * runtime]
    target = next((k for t, s, k in launches if t > wait_ts and s == stream), None)
    if target is not None:
        state.gpu_wait[target] = source


def longest_path(graph: Graph) -> list[int]:
    """Edge indices of the heaviest path (see the module docstring), in time order."""
    n_nodes = len(graph.node_ts)
    out_edges: list[list[int]] = [[] for _ in range(n_nodes)]
    indegree = np.zeros(n_nodes, dtype=np.int64)
    for e, (u, v) in enumerate(zip(graph.src, graph.dst, strict=True)):
        out_edges[u].append(e)
        indegree[v] += 1
    best = np.zeros(n_nodes)
    via = np.full(n_nodes, -1, dtype=np.int64)
    ready = deque(np.flatnonzero(indegree == 0).tolist())
    seen = 0
    weight, dst = graph.weight, graph.dst
    while ready:
        u = ready.popleft()
        seen += 1
        for e in out_edges[u]:
            v = dst[e]
            if via[v] < 0 or best[u] + weight[e] > best[v]:
                best[v], via[v] = best[u] + weight[e], e
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    if seen != n_nodes:  # a cycle: events whose times contradict each other
        raise ValueError(f"{n_nodes - seen} nodes are on a cycle")
    top = best.max() if n_nodes else 0.0
    ends = np.flatnonzero(best >= top)
    node = int(ends[np.argmax(graph.node_ts[ends])]) if len(ends) else -1
    path: list[int] = []
    while node >= 0 and via[node] >= 0:
        e = int(via[node])
        path.append(e)
        node = graph.src[e]
    path.reverse()
    return path
