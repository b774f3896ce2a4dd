"""``nbt.critical_path``: which chain of host ops, launches, kernels and waits bounds one iteration.

Algorithm (the graph rules are in :mod:`nbtoolkit.trace.critical_path_graph`):

1. The iteration is a ProfilerStep (``step=N``) or the ``instance``-th host annotation whose
   name contains ``annotation`` (HolisticTraceAnalysis's way to pick a window). Its events
   are the host ops and runtime calls (``cpu_op``, ``cuda_runtime``, ``cuda_driver``) that
   start inside it and last longer than 0, the collectives a backend ran on its own threads
   (gloo's ``gloo:*`` ops), and the device events launched by them (same correlation; every
   kernel of a ``cudaGraphLaunch`` shares the launch's correlation).
2. A dependency graph over their start and end points: nesting and order of ops on each host
   thread, launch -> kernel, stream order, host syncs waiting for kernels, kernels waiting
   for events recorded on other streams (how a compute stream waits for an NCCL stream).
   Edges carry the work they stand for; waiting weighs 0.
3. The longest (heaviest) path of that DAG. Its length (``length_us``) is the work the step
   cannot do without; every other chain has slack.
4. The path's edges, read in time order, tile the time from its first to its last point;
   before and after it, the step's span is filled with gaps. So the ``segments`` add up to
   the iteration's span: ``max(step end, end of the last device event it launched) - start``.

Segment kinds:

- ``cpu``: host op time; ``allocator``: cudaMalloc/cudaFree called by the caching allocator;
- ``kernel``, ``memory`` (memcpy/memset), ``collective`` (NCCL/RCCL/HCCL kernels; on a CPU
  trace the gloo ops a backend thread runs: their time includes waiting for the slowest peer);
- ``collective queue``: a gloo collective waiting to start behind its caller or the backend
  thread's previous collective;
- ``launch delay``: from a launch call until its kernel starts on an idle stream;
- ``gpu idle``: a gap between kernels on a stream;
- ``sync wait``: the host blocked in a sync call or copy, waiting for the device;
- ``host gap``: host time between two top-level ops that no op covers (Python, the data
  loader, the profiler, a sleep).

Shortening a segment by ``x`` shortens the step by at most ``x``: once the path is shorter
than another chain, that chain bounds the step. ``opportunities`` groups the path's work by
kind and name and says in plain words what shortening it means.

On the HTA critical-path reference trace nbtoolkit's path has HTA's length and events
(tests/trace/test_critical_path_hta.py runs HTA live).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from nbtoolkit.core.errors import TraceError
from nbtoolkit.trace.critical_path import SEGMENT_COLUMNS, CriticalPath
from nbtoolkit.trace.critical_path_graph import BACKEND_PREFIXES, Graph, build_graph, longest_path
from nbtoolkit.trace.kernel_types import COMMUNICATION, MEMORY, kernel_types
from nbtoolkit.trace.overlap import COMM_PREFIXES

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import Trace

__all__ = ["critical_path", "critical_path_by_rank"]

WHOLE_TRACE = "the whole trace"
_NODE_CATS = ("cpu_op", "cuda_runtime", "cuda_driver")
_ALLOCATOR_CALLS = frozenset(
    {"cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaFreeHost", "hipMalloc", "hipFree"}
)
_EDGE_KIND = {"cpu": "cpu", "collective": "collective", "enqueue": "collective queue", "wait": "sync wait",
              "host gap": "host gap", "launch": "launch delay", "stream": "gpu idle", "sync": "sync wait",
              "launch order": "sync wait"}
_ADVICE = {
    "kernel": "GPU kernel {name} takes {pct} of the step on the critical path: a faster kernel "
              "(fusion with torch.compile, a better dtype or layout, a larger tile) shortens the step",
    "memory": "copy {name} takes {pct} of the step on the critical path: keep the data on the "
              "device, copy from pinned memory with non_blocking=True, or overlap it with compute",
    "collective": "collective {name} takes {pct} of the step on the critical path: overlap it "
                  "with compute (bucketing, async ops), send less, or fix a slower rank it waits for",
    "cpu": "host op {name} takes {pct} of the step on the critical path: the device waits for the "
           "host; cut Python and dispatch overhead (torch.compile, CUDA graphs, fewer small ops)",
    "cpu-only": "op {name} takes {pct} of the step on the critical path (the step runs on the CPU): "
                "make it cheaper or do less of it (torch.compile fuses small ops; larger ops amortise "
                "per-op overhead)",
    "allocator": "the caching allocator called {name} on the critical path for {pct} of the step: "
                 "measure after warm-up steps, keep tensor sizes stable, or set "
                 "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "collective queue": "collectives waited {pct} of the step to start on the backend's thread "
                        "({name}): fewer, larger buckets, or overlap them with compute",
    "launch delay": "kernel launches ({name}) take {pct} of the step: the stream sat idle while the "
                    "host launched; launch fewer, larger kernels (fusion, CUDA graphs)",
    "gpu idle": "gaps between kernels on {name} take {pct} of the step: the stream waited for its "
                "next kernel (launched late, or held by an event of another stream or a collective "
                "the trace does not record); many short gaps: fuse kernels or use CUDA graphs",
    "sync wait": "the host waited for the device ({name}) during {pct} of the step: remove the "
                 "synchronisation (.item(), .cpu(), printing a tensor) or move it out of the step",
    "host gap": "the host ran unprofiled code between ops during {pct} of the step: Python, "
                "the data loader or logging; move it off the training thread",
}


def critical_path(
    trace: Trace,
    rank: int | None = None,
    step: int | None = None,
    *,
    annotation: str | None = None,
    instance: int = 0,
) -> CriticalPath:
    """The critical path of one iteration of one rank; see the module docstring for the algorithm.

    Args:
        trace: a Trace (``nbt.load_trace``, ``nbt.profile``).
        rank: the rank (default: the first).
        step: the ProfilerStep number (default: the step of median duration, a typical step).
        annotation, instance: instead of a step, the ``instance``-th (0-based, in time order)
            host annotation whose name contains ``annotation``, as HTA's
            ``critical_path_analysis(rank, annotation, instance_id)`` takes it.

    Raises:
        TraceError: the rank or step is not in the trace, no annotation matches, or the window
            holds no host operator.
    """
    rank = trace.ranks[0] if rank is None else rank
    frame = trace.rank_events(rank)
    start, stop, label = _window(trace, rank, frame, step, annotation=annotation, instance=instance)
    selected = _select(frame, start, stop)
    if not (selected["stream"].to_numpy() < 0).any():
        raise TraceError(_no_host_operator(frame, start, stop, f"rank {rank}, {label}"))
    extras = trace.event_args(rank)
    graph = build_graph(selected, extras.syncs)
    path = longest_path(graph)
    span_end = max(stop, float(selected["end"].max()))
    segments = _segments(graph, path, start, span_end)
    notes: list[str] = []
    if label == WHOLE_TRACE:
        notes.append("the trace has no ProfilerStep#N annotations: the path spans the whole trace; "
                     "pass annotation='...' to pick one iteration")
    if not len(extras.syncs) and selected["name"].astype(str).isin(["Stream Wait Event", "Event Sync"]).any():
        notes.append("the trace has no file behind it, so waits on CUDA events are not on the graph")
    rows = sorted({int(graph.events["row"].iat[int(n) // 2]) for e in path
                   for n in (graph.src[e], graph.dst[e])})
    return CriticalPath(
        rank=rank,
        step=label if step is None and annotation is not None else _step_number(label),
        span_us=span_end - start,
        length_us=float(sum(graph.weight[e] for e in path)),
        start_us=start,
        segments=segments,
        opportunities=_opportunities(segments, span_end - start,
                                     on_device=bool((selected["stream"].to_numpy() >= 0).any())),
        events=rows,
        notes=notes,
    )


def critical_path_by_rank(trace: Trace, step: int | None = None) -> pd.DataFrame:
    """What bounds the step on each rank: one row per rank, from :func:`critical_path`.

    Columns: ``rank``, ``step``, ``span_us``, ``length_us``, ``top_kind``, ``top_name``,
    ``top_share_pct`` (the largest opportunity), then ``<kind>_pct`` for every kind on any
    rank's path (0 where absent). ``step`` as in :func:`critical_path` (per rank when None).
    A trace loaded with ``critical_path=True`` answers from its per-rank summaries (no event read).
    """
    import pandas as pd

    found = getattr(getattr(trace, "summary", None), "critical_path", None)
    if step is None and found is not None:
        return found.copy()

    rows: list[dict[str, object]] = []
    for rank in trace.ranks:
        path = critical_path(trace, rank, step)
        top = path.opportunities.head(1)
        row: dict[str, object] = {
            "rank": rank, "step": path.step, "span_us": path.span_us, "length_us": path.length_us,
            "top_kind": str(top["kind"].iat[0]) if len(top) else "",
            "top_name": str(top["name"].iat[0]) if len(top) else "",
            "top_share_pct": float(top["share_pct"].iat[0]) if len(top) else 0.0,
        }
        kinds = path.by_kind()
        row.update({f"{k}_pct": float(v) for k, v in zip(kinds["kind"], kinds["share_pct"], strict=True)})
        rows.append(row)
    return pd.DataFrame(rows).fillna(0.0)


def _step_number(label: str) -> int | str:
    return int(label.removeprefix("step ")) if label.startswith("step ") else label


def _window(trace: Trace, rank: int, frame: pd.DataFrame, step: int | None, *, annotation: str | None,
            instance: int) -> tuple[float, float, str]:
    if annotation is not None:
        host = frame[(frame["stream"].to_numpy() < 0)]
        names = host["name"].astype(str)
        hits = host[names.str.contains(annotation, regex=False).to_numpy()].sort_values("ts")
        if not len(hits):
            raise TraceError(f"rank {rank}: no host annotation contains {annotation!r}")
        if not 0 <= instance < len(hits):
            raise TraceError(f"rank {rank}: {annotation!r} occurs {len(hits)} times; instance "
                             f"{instance} is out of range (0 to {len(hits) - 1})")
        hit = hits.iloc[instance]
        return float(hit["ts"]), float(hit["ts"] + hit["dur"]), annotation
    steps = trace.steps
    steps = steps[steps["rank"] == rank]
    if not len(steps) and step is None:  # no steps recorded: the whole trace is the window
        host = frame[frame["stream"].to_numpy() < 0]
        if not len(host):
            raise TraceError(f"rank {rank}: no host events; the critical path starts on the host")
        return float(host["ts"].min()), float((host["ts"] + host["dur"]).max()), WHOLE_TRACE
    if not len(steps):
        raise TraceError(f"rank {rank}: the trace has no ProfilerStep#N annotations; pass "
                         "annotation='...' to pick the window (e.g. a record_function label)")
    if step is None:
        ordered = steps.sort_values(["dur", "step"], ignore_index=True)
        row = ordered.iloc[(len(ordered) - 1) // 2]
    else:
        match = steps[steps["step"] == step]
        if not len(match):
            raise TraceError(f"rank {rank}: no ProfilerStep#{step}; steps present: {list(steps['step'])}")
        row = match.iloc[0]
    return float(row["ts"]), float(row["ts"] + row["dur"]), f"step {int(row['step'])}"


def _no_host_operator(frame: pd.DataFrame, start: float, stop: float, where: str) -> str:
    """Why the window has no host operator to start a path from: say what is there instead."""
    ts, dur = frame["ts"].to_numpy(), frame["dur"].to_numpy()
    host = (frame["stream"].to_numpy() < 0) & frame["cat"].isin(_NODE_CATS).to_numpy()
    inside = host & (ts >= start) & (ts <= stop)
    zero = int((inside & (dur <= 0)).sum())
    span = f"it lasts {stop - start:,.3f} us"
    if stop <= start:
        span = "it lasts 0 us (its annotation has no duration)"
    if zero:
        return (
            f"{where}: {zero:,} host operator(s) start inside it, all of zero duration ({span}); "
            "operators without duration carry no time, so there is no path to find. The profiler "
            "recorded no durations: record again with torch.profiler (a trace converted or edited "
            "may have lost them)"
        )
    return (
        f"{where}: no host operator starts inside it ({span}); profile with torch.profiler's CPU "
        "activity on"
    )


def _select(frame: pd.DataFrame, start: float, stop: float) -> pd.DataFrame:
    ts = frame["ts"].to_numpy()
    dur = frame["dur"].to_numpy()
    stream = frame["stream"].to_numpy()
    corr = frame["correlation"].to_numpy()
    names = frame["name"]
    backend = np.array([str(c).startswith(BACKEND_PREFIXES) for c in names.cat.categories] + [False])
    is_node = frame["cat"].isin(_NODE_CATS).to_numpy() | backend[names.cat.codes.to_numpy()]
    host = (stream < 0) & is_node & (ts >= start) & (ts <= stop) & (dur > 0)
    launched = np.unique(corr[host & (corr >= 0)])
    annotation = (frame["cat"] == "gpu_user_annotation").to_numpy()
    on_device = (stream >= 0) & (corr >= 0) & ~annotation
    device = on_device & np.isin(corr, launched)
    # launched before the window, running (or queued to run) in it: the streams are busy with it
    backlog = on_device & ~device & (ts < stop) & (ts + dur > start)
    rows = np.flatnonzero(host | device | backlog)
    selected = frame.iloc[rows].reset_index(drop=True)
    begin = np.where(backlog[rows], np.maximum(ts[rows], start), ts[rows])  # only its part in the window
    return selected.assign(ts=begin, dur=ts[rows] + dur[rows] - begin, end=ts[rows] + dur[rows], row=rows)


def _kind(graph_kind: str, row: int, events: pd.DataFrame, ktypes: np.ndarray, is_comm: np.ndarray) -> str:
    if graph_kind == "kernel":
        return {COMMUNICATION: "collective", MEMORY: "memory"}.get(str(ktypes[row]), "kernel")
    if graph_kind == "cpu" and row >= 0 and is_comm[row]:
        return "collective"
    if graph_kind == "cpu" and row >= 0 and str(events["name"].iat[row]) in _ALLOCATOR_CALLS:
        return "allocator"
    return _EDGE_KIND[graph_kind]


def _segments(graph: Graph, path: list[int], start: float, span_end: float) -> pd.DataFrame:
    """The path's edges in time order, consecutive edges of one event and kind merged, with the
    time before and after the path as gaps, so that the rows tile ``[start, span_end]``."""
    import pandas as pd

    ev = graph.events
    names = ev["name"].astype(str).to_numpy()
    ktypes = kernel_types(ev["name"])
    is_comm = np.array([n.startswith(COMM_PREFIXES) for n in names], dtype=bool)
    streams = ev["stream"].to_numpy()
    records: list[list[Any]] = []  # kind, name, start_us, dur_us, work_us, row, stream
    if path:
        first = float(graph.node_ts[graph.src[path[0]]])
        if first > start:
            records.append(["host gap", "before the path", start, first - start, 0.0, -1, -1])
    for e in path:
        u, v, owner = graph.src[e], graph.dst[e], graph.owner[e]
        kind = _kind(graph.kind[e], owner, ev, ktypes, is_comm)
        dur = float(graph.node_ts[v] - graph.node_ts[u])
        if kind == "sync wait" and owner < 0:
            name = "the device"
        elif kind == "host gap":
            name = "between host ops"
        elif kind == "gpu idle":
            name = f"stream {int(streams[owner])}"
        else:
            name = names[owner] if owner >= 0 else kind
        row = int(ev["row"].iat[owner]) if owner >= 0 else -1
        stream = int(streams[owner]) if owner >= 0 else -1
        if records and records[-1][0] == kind and records[-1][1] == name and records[-1][5] == row:
            records[-1][3] += dur
            records[-1][4] += graph.weight[e]
            continue
        records.append([kind, name, float(graph.node_ts[u]), dur, graph.weight[e], row, stream])
    last = float(graph.node_ts[graph.dst[path[-1]]]) if path else start
    if span_end > last:
        records.append(["host gap", "after the path", last, span_end - last, 0.0, -1, -1])
    frame = pd.DataFrame(records, columns=["kind", "name", "start_us", "dur_us", "work_us", "row", "stream"])
    span = span_end - start
    frame["share_pct"] = 100.0 * frame["dur_us"] / span if span > 0 else 0.0
    return frame[list(SEGMENT_COLUMNS)]


def _opportunities(segments: pd.DataFrame, span: float, *, on_device: bool) -> pd.DataFrame:
    """The path's time grouped by (kind, name), largest first, each with its advice in words."""
    grouped = (
        segments.groupby(["kind", "name"], as_index=False, observed=True)
        .agg(dur_us=("dur_us", "sum"), segments=("dur_us", "size"))
        .sort_values(["dur_us", "name"], ascending=[False, True], ignore_index=True)
    )
    grouped = grouped[grouped["dur_us"] > 0].reset_index(drop=True)
    grouped["share_pct"] = 100.0 * grouped["dur_us"] / span if span > 0 else 0.0
    grouped["advice"] = [
        _ADVICE["cpu-only" if k == "cpu" and not on_device else k].format(name=_short(n), pct=f"{p:.1f} %")
        for k, n, p in zip(grouped["kind"], grouped["name"], grouped["share_pct"], strict=True)
    ]
    return grouped[["kind", "name", "dur_us", "share_pct", "segments", "advice"]]


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."
