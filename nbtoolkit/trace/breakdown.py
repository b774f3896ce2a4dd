"""Where the time of each rank goes: temporal, kernel and idle-time breakdowns.

All three follow HolisticTraceAnalysis (HTA 0.5) definitions on GPU/accelerator traces
and give its numbers (see ``nbtoolkit.trace._kernels`` for the preprocessing: whole-µs
times, last ProfilerStep left out, kernel types). Times are in microseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from nbtoolkit.core.inputs import as_trace
from nbtoolkit.trace import _kernels as k
from nbtoolkit.trace._intervals import intersection_length, self_times

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import KernelBreakdown, Trace

__all__ = ["idle_breakdown", "kernel_breakdown", "temporal_breakdown"]

TEMPORAL_COLUMNS = [
    "rank",
    "idle_us",
    "compute_us",
    "non_compute_us",
    "span_us",
    "idle_pct",
    "compute_pct",
    "non_compute_pct",
]


def temporal_breakdown(trace: Trace, *, include_last_step: bool = False) -> pd.DataFrame:
    """Idle, compute and non-compute time per rank (HTA's ``get_temporal_breakdown``).

    On a rank with device kernels (GPU, MTIA ...):

    - ``span_us``: from the start of the first kernel to the end of the last (HTA's
      ``kernel_time``), kernels of the analysed steps only;
    - ``idle_us``: time in the span when no kernel of any type runs on any stream;
    - ``compute_us``: time when at least one COMPUTATION kernel runs (union of intervals);
    - ``non_compute_us``: the rest of the busy time: only communication, memory copies
      or sync events run. ``idle + compute + non_compute = span``.

    HTA computes the same three numbers; it rounds percentages to 2 decimals, we give them
    unrounded. Where HTA trips its own ``non_compute_time >= 0`` assertion (sub-µs events
    whose rounded end falls before their rounded start, e.g. ns-resolution H100 traces)
    nbtoolkit clips those events to zero length and stays consistent.

    On a rank without device kernels (a CPU/gloo run), the same identity is computed on
    the host: ``span_us`` from the first to the last host operator or collective,
    ``compute_us`` = union of the rank's own operators (see :func:`comm_comp_overlap`
    for which events count), ``non_compute_us`` = collective time not covered by
    compute, ``idle_us`` = the rest of the span.

    Args:
        include_last_step: keep the last ProfilerStep (HTA's ``include_last_profiler_step``).
            Traces with fewer than two ProfilerStep labels are never filtered.
    """
    trace = as_trace(trace, what="temporal_breakdown()")
    import pandas as pd

    rows = []
    for rank in trace.ranks:
        view = k.device_view(trace, rank, include_last_step=include_last_step)
        if len(view.device):
            busy = k.merged(view.device)
            if len(busy[0]):
                span = float(busy[1][-1] - busy[0][0])
                run = float((busy[1] - busy[0]).sum())
            else:
                span = run = 0.0
            compute = k.merged(view.device, k.COMPUTATION)
            compute_us = float((compute[1] - compute[0]).sum())
            idle = span - run
            non_compute = run - compute_us
        else:
            from nbtoolkit.trace.overlap import host_comm_and_compute

            comm, comp, first, last = host_comm_and_compute(trace, rank, include_last_step=include_last_step)
            span = max(last - first, 0.0)
            compute_us = float((comp[1] - comp[0]).sum())
            comm_total = float((comm[1] - comm[0]).sum())
            non_compute = comm_total - intersection_length(comm, comp)
            idle = span - compute_us - non_compute
        rows.append((rank, idle, compute_us, non_compute, span))
    frame = pd.DataFrame(rows, columns=["rank", "idle_us", "compute_us", "non_compute_us", "span_us"])
    span = frame["span_us"].where(frame["span_us"] > 0)
    for part in ("idle", "compute", "non_compute"):
        frame[f"{part}_pct"] = 100.0 * frame[f"{part}_us"] / span
    return frame[TEMPORAL_COLUMNS]


def kernel_breakdown(
    trace: Trace,
    *,
    include_last_step: bool = False,
    include_memory: bool = True,
) -> KernelBreakdown:
    """Device time per kernel type and per kernel (HTA's ``get_gpu_kernel_breakdown``).

    ``by_type`` (summed over ranks): for every combination of kernel types running at the
    same moment, how long it ran, e.g. ``COMPUTATION``, ``COMMUNICATION``,
    ``COMPUTATION overlapping COMMUNICATION``; each kernel type's intervals are merged
    first, so a moment is counted once. Columns ``kernel_type, sum_us, percentage``
    (HTA's numbers; HTA rounds the percentage to 1 decimal).

    ``by_kernel``: one row per rank, kernel type and kernel name: ``calls``, ``sum_us``,
    ``mean_us``, ``max_us``, ``min_us``, ``std_us`` (every kernel; HTA folds the tail into
    "others", we keep all names).
    """
    trace = as_trace(trace, what="kernel_breakdown()")
    import pandas as pd

    from nbtoolkit.trace.trace import KernelBreakdown

    types = [k.COMPUTATION, k.COMMUNICATION] + ([k.MEMORY] if include_memory else [])
    totals: dict[str, float] = {}
    per_kernel = []
    for rank in trace.ranks:
        view = k.device_view(trace, rank, include_last_step=include_last_step)
        device = view.device
        if not len(device):
            continue
        for label, length in _type_combinations(device, types).items():
            totals[label] = totals.get(label, 0.0) + length
        chosen = device[device["kernel_type"].isin(types)]
        if len(chosen):
            grouped = (
                chosen.assign(name=chosen["name"].astype(str), dur=chosen["end"] - chosen["ts"])
                .groupby(["kernel_type", "name"], sort=False)["dur"]
                .agg(calls="size", sum_us="sum", mean_us="mean", max_us="max", min_us="min", std_us="std")
                .reset_index()
            )
            grouped.insert(0, "rank", rank)
            per_kernel.append(grouped)
    by_type = pd.DataFrame({"kernel_type": list(totals), "sum_us": list(totals.values())})
    by_type = by_type[by_type["sum_us"] > 0].sort_values(["sum_us", "kernel_type"], ascending=[False, True])
    total = by_type["sum_us"].sum()
    by_type["percentage"] = 100.0 * by_type["sum_us"] / total if total else np.nan
    columns = ["rank", "kernel_type", "name", "calls", "sum_us", "mean_us", "max_us", "min_us", "std_us"]
    by_kernel = pd.concat(per_kernel, ignore_index=True) if per_kernel else pd.DataFrame(columns=columns)
    by_kernel["std_us"] = by_kernel["std_us"].fillna(0.0)
    by_kernel = by_kernel.sort_values(
        ["rank", "kernel_type", "sum_us", "name"], ascending=[True, True, False, True]
    )
    return KernelBreakdown(by_type=by_type.reset_index(drop=True), by_kernel=by_kernel.reset_index(drop=True))


def _type_combinations(device: pd.DataFrame, types: list[str]) -> dict[str, float]:
    """Length of time each combination of kernel types runs together (a sweep over merged intervals)."""
    times, deltas = [], []
    for bit, kind in enumerate(types):
        starts, ends = k.merged(device, kind)
        times += [starts, ends]
        deltas += [np.full(len(starts), 1 << bit), np.full(len(ends), -(1 << bit))]
    if not times:
        return {}
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    state = np.cumsum(d)
    lengths = np.diff(t)  # state[i] holds from t[i] to t[i+1]
    state = state[:-1]
    out: dict[str, float] = {}
    for value in np.unique(state[state > 0]):
        label = " overlapping ".join(kind for bit, kind in enumerate(types) if value & (1 << bit))
        out[label] = out.get(label, 0.0) + float(lengths[state == value].sum())
    return out


def idle_breakdown(
    trace: Trace,
    *,
    include_last_step: bool = False,
    consecutive_kernel_delay_us: float = 30.0,
) -> pd.DataFrame:
    """Idle time per rank and stream, split by cause (HTA's ``get_idle_time_breakdown``).

    Per stream, the kernels (kernel, memcpy, memset and MTIA events) sorted by start; each
    gap before a kernel (its start minus the previous kernel's end) is:

    - ``host_wait`` if the host launched the kernel after the previous one had ended
      (the runtime call with the same ``correlation`` started later than that end):
      the CPU did not enqueue work fast enough;
    - ``kernel_wait`` otherwise, if the gap is under ``consecutive_kernel_delay_us``
      (launch overhead between back-to-back kernels);
    - ``other`` otherwise (e.g. waiting on an event from another stream).

    Columns: ``rank, stream, idle_category, idle_us, idle_ratio`` (share of the stream's
    idle time). Categories that never occur on a stream are absent, as in HTA.
    """
    trace = as_trace(trace, what="idle_breakdown()")
    import pandas as pd

    kernel_cats = ["kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events"]
    frames = []
    for rank in trace.ranks:
        view = k.device_view(trace, rank, include_last_step=include_last_step)
        device = view.device[view.device["cat"].isin(kernel_cats)]
        if not len(device):
            continue
        host = view.host[view.host["correlation"].to_numpy() >= 0]
        launch = host.drop_duplicates("correlation", keep="last").set_index("correlation")["ts"]
        runtime_ts = device["correlation"].map(launch).to_numpy(dtype=np.float64)
        for stream in sorted(device["stream"].unique()):
            on = (device["stream"] == stream).to_numpy()
            ts = device["ts"].to_numpy()[on]
            order = np.argsort(ts, kind="stable")
            ts = ts[order]
            end = device["end"].to_numpy()[on][order]
            launched = runtime_ts[on][order]
            prev_end = np.r_[np.nan, end[:-1]]
            gap = ts - prev_end
            host_wait = launched > prev_end
            kernel_wait = ~host_wait & (gap < consecutive_kernel_delay_us)
            category = np.where(host_wait, "host_wait", np.where(kernel_wait, "kernel_wait", "other"))
            part = pd.DataFrame({"idle_category": category, "gap": gap})
            sums = part.groupby("idle_category")["gap"].sum()  # NaN gap of the first kernel adds nothing
            total = sums.sum()
            for category_name, value in sums.items():
                frames.append(
                    (rank, int(stream), category_name, float(value), value / total if total else np.nan)
                )
    return pd.DataFrame(frames, columns=["rank", "stream", "idle_category", "idle_us", "idle_ratio"])


def _top_by_name(
    rows: list[pd.DataFrame], n: int, rank_by: str, **aggregates: tuple[str, str]
) -> pd.DataFrame:
    """Events of several ranks grouped by name, the ``n`` highest by ``rank_by`` (ties by name)."""
    import pandas as pd

    if not rows:
        return pd.DataFrame(columns=["name", *aggregates])
    events = pd.concat(rows, ignore_index=True)
    events["name"] = events["name"].astype(str)
    table = events.groupby("name", sort=False).agg(**aggregates).reset_index()
    table = table.sort_values([rank_by, "name"], ascending=[False, True], kind="stable")
    return table.head(n).reset_index(drop=True)


def top_operators(trace: Trace, n: int = 10, *, rank: int | None = None) -> pd.DataFrame:
    """Host operators (``cpu_op``) by self CPU time: name, calls, self_us, total_us."""
    rows = []
    for r in [rank] if rank is not None else trace.ranks:
        frame = trace.rank_events(r)
        host = frame[frame["stream"].to_numpy() < 0]
        ops = host.assign(self_us=self_times(host))
        rows.append(ops.loc[ops["cat"] == "cpu_op", ["name", "dur", "self_us"]])
    return _top_by_name(
        rows, n, "self_us", calls=("dur", "size"), self_us=("self_us", "sum"), total_us=("dur", "sum")
    )


def top_kernels(trace: Trace, n: int = 10, *, rank: int | None = None) -> pd.DataFrame:
    """GPU/accelerator kernels by total time: name, calls, total_us, mean_us."""
    rows = []
    for r in [rank] if rank is not None else trace.ranks:
        frame = trace.rank_events(r)
        rows.append(frame.loc[frame["stream"].to_numpy() >= 0, ["name", "dur"]])
    return _top_by_name(
        rows, n, "total_us", calls=("dur", "size"), total_us=("dur", "sum"), mean_us=("dur", "mean")
    )
