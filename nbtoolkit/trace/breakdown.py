"""Where the time of each rank goes: temporal, kernel and idle-time breakdowns.

All three follow HolisticTraceAnalysis (HTA 0.5) definitions on GPU/accelerator traces
and give its numbers (see ``nbtoolkit.trace._kernels`` for the preprocessing: whole-µs
times, last ProfilerStep left out, kernel types). Times are in microseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from nbtoolkit.trace import _kernels as k
from nbtoolkit.trace import kernel_types as kt
from nbtoolkit.trace._intervals import intersection_length, merge

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
    """Idle, compute and non-compute time per rank of a loaded Trace: the analysis behind
    ``nbt.temporal_breakdown`` (definitions in :func:`nbtoolkit.trace.api.temporal_breakdown`).
    """
    import pandas as pd

    rows = [
        (rank, *temporal_numbers(k.device_view(trace, rank, include_last_step=include_last_step)))
        for rank in trace.ranks
    ]
    return pd.DataFrame(temporal_columns(rows), columns=TEMPORAL_COLUMNS)


def temporal_numbers(view: k.EventView) -> tuple[float, float, float, float]:
    """(idle, compute, non-compute, span) µs of one rank's preprocessed events, no frame built.

    ``view``: a DeviceView, or the lean summarizer's view (:mod:`nbtoolkit.trace.summarize_rank_lean`).
    """
    device = view.device_rows
    if len(device):
        # numpy on positions and category codes, no frame: this runs once per rank at scale
        ts, end = view.values("ts", device), view.values("end", device)
        busy = merge(ts, end)
        if len(busy[0]):
            span = float(busy[1][-1] - busy[0][0])
            run = float((busy[1] - busy[0]).sum())
        else:
            span = run = 0.0
        codes, categories = view.codes("name", device)
        is_compute = kt.kernel_type_table(categories)[codes] == kt.COMPUTATION
        compute = merge(ts[is_compute], end[is_compute])
        compute_us = float((compute[1] - compute[0]).sum())
        idle = span - run
        non_compute = run - compute_us
    else:
        from nbtoolkit.trace.overlap import host_comm_and_compute_of_view

        comm, comp, first, last = host_comm_and_compute_of_view(view)
        span = max(last - first, 0.0)
        compute_us = float((comp[1] - comp[0]).sum())
        comm_total = float((comm[1] - comm[0]).sum())
        non_compute = comm_total - intersection_length(comm, comp)
        idle = span - compute_us - non_compute
    return idle, compute_us, non_compute, span


def temporal_columns(rows: list[tuple[int, float, float, float, float]]) -> dict[str, np.ndarray]:
    """The temporal table's columns (:data:`TEMPORAL_COLUMNS`) from (rank, idle, compute, non-compute,
    span) rows: the percentages of the span added."""
    numbers = np.array([row[1:] for row in rows], dtype=np.float64).reshape(len(rows), 4)
    spans = numbers[:, 3]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = 100.0 * numbers[:, :3] / np.where(spans > 0, spans, np.nan)[:, None]
    columns = {
        "rank": np.array([row[0] for row in rows], dtype=np.int64),
        "idle_us": numbers[:, 0],
        "compute_us": numbers[:, 1],
        "non_compute_us": numbers[:, 2],
        "span_us": spans,
        "idle_pct": share[:, 0],
        "compute_pct": share[:, 1],
        "non_compute_pct": share[:, 2],
    }
    return columns


def kernel_breakdown(
    trace: Trace,
    *,
    include_last_step: bool = False,
    include_memory: bool = True,
) -> KernelBreakdown:
    """Device time per kernel type and per kernel of a loaded Trace: the analysis behind
    ``nbt.kernel_breakdown`` (definitions in :func:`nbtoolkit.trace.api.kernel_breakdown`).
    """
    import pandas as pd

    from nbtoolkit.trace.trace import KernelBreakdown

    types = [kt.COMPUTATION, kt.COMMUNICATION] + ([kt.MEMORY] if include_memory else [])
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
    """Idle time per rank and stream, split by cause, of a loaded Trace: the analysis behind
    ``nbt.idle_breakdown`` (definitions in :func:`nbtoolkit.trace.api.idle_breakdown`).
    """
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
