"""``nbt.roofline``: what each class of kernels achieves against the device's compute and memory roofs.

Definitions:

- **Work of an op** (FLOPs and bytes): from the shapes the trace recorded
  (``record_shapes=True``), with the formulas of :mod:`nbtoolkit.trace.op_costs`. When the
  trace came from ``nbt.profile(step, metrics=True)`` (torch's FLOP counter ran on the live
  step), ``flop_check`` compares those FLOPs with the counter's per aten op, and ops the
  shapes cannot cost take the counter's FLOPs per call.
- **Time of an op**: on a GPU, the summed duration of the kernels it launched (kernels carry
  the launching op's ``External id``); on a CPU, the op's duration, counting only the
  innermost op of a class (``addmm``, not the ``linear`` around it); an op's time includes
  the small ops of other classes inside it (an ``addmm``'s ``copy_``).
- **Achieved rate**: FLOPs / time and bytes / time. **Arithmetic intensity**: FLOPs / byte.
- **Roofs**: the dense peak FLOP/s of the op's precision (:mod:`nbtoolkit.metrics.device_peaks`;
  an FP32 op whose kernel names say ``tf32`` uses the TF32 peak) and the DRAM bandwidth
  (:mod:`nbtoolkit.metrics.device_bandwidth`). **Ridge point** = peak FLOP/s / bandwidth:
  an op whose intensity is below it is *memory-bound* (its roof is intensity x bandwidth),
  above it *compute-bound* (its roof is the peak). ``pct_of_roof`` = achieved / roof; for ops
  with no FLOPs (copies), achieved bytes/s over the bandwidth.
- **Modules**: an op belongs to the innermost ``nn.Module: ...`` annotation around it on its
  thread (``with_modules=True``/``with_stack=True``); backward ops run outside them.
- **Collectives**: :mod:`nbtoolkit.trace.collective_bandwidth` (algbw and busbw).

On a CPU the tables have no memory roof and no ridge point (neither is known for the part);
when the trace came from ``nbt.profile(..., metrics=True)``, the peak the live step measured
(matrix products in the step's dtype) is the compute roof, and ``pct_of_roof`` is of that peak.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from nbtoolkit.core.errors import TraceError
from nbtoolkit.metrics.device_bandwidth import lookup_bandwidth
from nbtoolkit.metrics.device_peaks import lookup_peak, precision_of
from nbtoolkit.trace.collective_bandwidth import collective_bandwidth
from nbtoolkit.trace.op_costs import op_class, op_cost
from nbtoolkit.trace.roofline import RATE_COLUMNS, Roofline

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import Trace

__all__ = ["roofline"]

_MODULE_PREFIX = "nn.Module: "


def roofline(trace: Trace, rank: int | None = None, step: int | None = None, *,
             device: str | None = None) -> Roofline:
    """Roofline figures of one rank (see the module docstring for the definitions).

    Args:
        trace: a Trace; its file is read again for the recorded shapes.
        rank: the rank (default: the first).
        step: only this ProfilerStep (default: every event of the trace).
        device: the device name to look the roofs up by (default: the trace's device properties).
    """
    import pandas as pd

    rank = trace.ranks[0] if rank is None else rank
    frame = trace.rank_events(rank)
    device_name = device if device is not None else _device_name(trace, rank)
    window = _window(trace, rank, step)
    ops = _costed_ops(trace, rank, frame, window)
    notes: list[str] = []
    if not len(ops):
        notes.append("no op has recorded shapes: profile with record_shapes=True (nbt.profile(..., "
                     "record_shapes=True)) or metrics=True to count FLOPs")
    on_gpu = bool((frame["stream"].to_numpy() >= 0).any())
    ops = _timed(ops, frame, on_gpu=on_gpu)
    ops["module"] = _modules(frame, ops, window)
    bandwidth = lookup_bandwidth(device_name) if device_name else None
    sources = [bandwidth[1]] if bandwidth else []
    if on_gpu and device_name and bandwidth is None:
        notes.append(f"no memory bandwidth known for {device_name!r}: no memory roof")
    peaks: dict[str, float] = {}
    for precision in sorted({p for p in ops["precision"] if p}):
        found = lookup_peak(device_name, precision) if device_name and on_gpu else None
        if found:
            peaks[precision] = found[0]
            sources.append(found[1])
    metrics = trace.step_metrics
    if not on_gpu and metrics is not None and metrics.peak_flops:
        # the live step measured this CPU's peak (matmul FLOP/s in the step's dtype): a compute roof
        precision = precision_of(metrics.dtype) or ""
        peaks[precision] = float(metrics.peak_flops)
        sources.append(f"{precision} peak from the live step: {metrics.peak_source}")
    bw = bandwidth[0] if bandwidth else None
    flop_check = _flop_check(trace, ops)
    table = _rates(ops.assign(calls=1), peaks, bw)
    by_class = _rates(_sum(ops, ["op_class", "precision"]), peaks, bw)
    with_module = ops[ops["module"] != ""]
    by_module = _rates(_sum(with_module, ["module", "precision"]), peaks, bw) if len(with_module) else \
        pd.DataFrame(columns=["module", "precision", *RATE_COLUMNS])
    if len(ops) and not len(with_module):
        notes.append("no nn.Module annotations: profile with with_modules=True for the table by module")
    return Roofline(rank=rank, device=device_name, bandwidth=bw, ops=table, by_class=by_class,
                    by_module=by_module, collectives=collective_bandwidth(trace, rank),
                    flop_check=flop_check, sources=sources, notes=notes)


def _device_name(trace: Trace, rank: int) -> str:
    props = trace.info[rank].device_properties
    return str(props[0].get("name", "")) if props else ""


def _window(trace: Trace, rank: int, step: int | None) -> tuple[float, float]:
    if step is None:
        return -np.inf, np.inf
    steps = trace.steps[(trace.steps["rank"] == rank) & (trace.steps["step"] == step)]
    if not len(steps):
        raise TraceError(f"rank {rank}: no ProfilerStep#{step}; steps present: "
                         f"{list(trace.steps.loc[trace.steps['rank'] == rank, 'step'])}")
    return float(steps["ts"].iloc[0]), float(steps["ts"].iloc[0] + steps["dur"].iloc[0])


def _costed_ops(trace: Trace, rank: int, frame: pd.DataFrame, window: tuple[float, float]) -> pd.DataFrame:
    """Host ops with FLOPs/bytes: from the recorded shapes, else from the live FLOP counter."""
    import pandas as pd

    shapes = trace.event_args(rank).shapes
    shapes = shapes[(shapes["ts"] >= window[0]) & (shapes["ts"] <= window[1])]
    records = []
    for name, ext, dims, types, concrete in zip(shapes["name"], shapes["external_id"], shapes["input_dims"],
                                               shapes["input_types"], shapes["concrete"], strict=True):
        cost = op_cost(str(name), dims, types, concrete)
        if cost is not None:
            records.append((str(name), int(ext), cost.op_class, cost.flops, cost.bytes, cost.precision))
    ops = pd.DataFrame(records, columns=["name", "external_id", "op_class", "flops", "bytes", "precision"])
    if not len(ops):
        ops = _counter_ops(trace, frame, window)
    return ops.drop_duplicates("external_id", keep="last").reset_index(drop=True)


def _counter_ops(trace: Trace, frame: pd.DataFrame, window: tuple[float, float]) -> pd.DataFrame:
    """Without shapes: each aten op the FLOP counter counted, its FLOPs per step shared by its calls."""
    import pandas as pd

    metrics = trace.step_metrics
    columns = ["name", "external_id", "op_class", "flops", "bytes", "precision"]
    if metrics is None or not len(metrics.by_op):
        return pd.DataFrame(columns=columns)
    counted = zip(metrics.by_op["op"], metrics.by_op["hardware_flops"], strict=True)
    per_step = {_aten(str(op)): float(f) for op, f in counted}
    steps = max(len(trace.steps), 1)
    host = frame[(frame["stream"].to_numpy() < 0) & (frame["ts"] >= window[0]).to_numpy()
                 & (frame["ts"] <= window[1]).to_numpy()]
    host = host[host["name"].astype(str).isin(list(per_step)).to_numpy()]
    calls = host["name"].astype(str).value_counts()
    precision = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(metrics.dtype, "")
    rows = [(n, int(e), op_class(n), per_step[n] * steps / calls[n], 0.0, precision)
            for n, e in zip(host["name"].astype(str), host["external_id"], strict=True)]
    return pd.DataFrame(rows, columns=columns)


def _aten(op: str) -> str:
    """``aten.mm.default`` / ``aten.mm`` (FLOP counter) -> ``aten::mm`` (profiler)."""
    parts = op.split(".")
    return f"aten::{parts[1]}" if len(parts) >= 2 and parts[0] == "aten" else op


def _timed(ops: pd.DataFrame, frame: pd.DataFrame, *, on_gpu: bool) -> pd.DataFrame:
    """Add ``time_us``, ``ts``, ``tid``: the op's kernels' time (GPU) or its own time (CPU leaf)."""
    host = frame[(frame["stream"].to_numpy() < 0) & (frame["cat"] == "cpu_op").to_numpy()]
    host = host.drop_duplicates("external_id")[["external_id", "ts", "dur", "pid", "tid"]]
    ops = ops.merge(host, on="external_id", how="inner")
    if on_gpu:
        device = frame[(frame["stream"].to_numpy() >= 0) & (frame["external_id"].to_numpy() >= 0)
                       & (frame["cat"] == "kernel").to_numpy()]
        names = device["name"].astype(str)
        kernel_time = device.groupby("external_id")["dur"].sum()
        says_tf32 = names.str.contains("tf32", case=False).to_numpy()
        tf32 = device.assign(tf32=says_tf32).groupby("external_id")["tf32"].any()
        ops["time_us"] = ops["external_id"].map(kernel_time).fillna(0.0).to_numpy()
        uses_tf32 = ops["external_id"].map(tf32).fillna(False).astype(bool).to_numpy()
        ops.loc[uses_tf32 & (ops["precision"] == "fp32").to_numpy(), "precision"] = "tf32"
        return ops[ops["time_us"] > 0].reset_index(drop=True)
    keep = _innermost_of_class(ops) & (ops["dur"].to_numpy() > 0)
    return ops[keep].assign(time_us=lambda f: f["dur"]).reset_index(drop=True)


def _innermost_of_class(ops: pd.DataFrame) -> np.ndarray:
    """False for an op that has an op of its own class inside it on its thread (``linear`` around
    ``addmm``, ``relu`` around ``clamp_min``): the inner one is the op; counting both counts twice."""
    keep = np.ones(len(ops), dtype=bool)
    ts = ops["ts"].to_numpy(dtype=float)
    end = ts + ops["dur"].to_numpy(dtype=float)
    for _, group in ops.groupby(["op_class", "pid", "tid"], sort=False):
        rows = group.index.to_numpy()
        stack: list[int] = []
        for i in rows[np.lexsort((-(end[rows] - ts[rows]), ts[rows]))].tolist():
            while stack and end[stack[-1]] <= ts[i]:
                stack.pop()
            if stack:
                keep[stack[-1]] = False
            stack.append(i)
    return keep


def _modules(frame: pd.DataFrame, ops: pd.DataFrame, window: tuple[float, float]) -> list[str]:
    """The innermost ``nn.Module: X`` annotation around each op on its thread, "" when none."""
    names = frame["name"].astype(str)
    mods = frame[names.str.startswith(_MODULE_PREFIX).to_numpy() & (frame["stream"].to_numpy() < 0)]
    mods = mods[(mods["ts"] >= window[0]).to_numpy() & (mods["ts"] <= window[1]).to_numpy()]
    out = [""] * len(ops)
    if not len(mods) or not len(ops):
        return out
    for tid, group in mods.groupby("tid"):
        starts = group["ts"].to_numpy()
        ends = starts + group["dur"].to_numpy()
        labels = group["name"].astype(str).str.removeprefix(_MODULE_PREFIX).to_numpy()
        for i in np.flatnonzero(ops["tid"].to_numpy() == tid):
            t = float(ops["ts"].iat[i])
            inside = np.flatnonzero((starts <= t) & (ends >= t))
            if len(inside):
                out[i] = str(labels[inside[np.argmax(starts[inside])]])
    return out


def _sum(ops: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return ops.groupby(keys, as_index=False, observed=True).agg(
        calls=("flops", "size"), time_us=("time_us", "sum"), flops=("flops", "sum"), bytes=("bytes", "sum"))


def _rates(table: pd.DataFrame, peaks: dict[str, float], bw: float | None) -> pd.DataFrame:
    seconds = table["time_us"].to_numpy(dtype=float) * 1e-6
    flops = table["flops"].to_numpy(dtype=float)
    nbytes = table["bytes"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(nbytes > 0, flops / nbytes, np.nan)
        achieved = np.where(seconds > 0, flops / seconds, np.nan)
        traffic = np.where(seconds > 0, nbytes / seconds, np.nan)
    precisions = table["precision"] if "precision" in table else [""] * len(table)
    peak = np.array([peaks.get(str(p), np.nan) for p in precisions], dtype=float)
    ridge = peak / bw if bw else np.full(len(table), np.nan)
    compute = intensity >= ridge
    bound = np.where(np.isnan(ridge) | np.isnan(intensity), "", np.where(compute, "compute", "memory"))
    # without a memory roof (a CPU) the compute peak is the only roof
    roof = np.where(compute, peak, intensity * bw) if bw else peak
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(flops > 0, 100.0 * achieved / roof, 100.0 * traffic / (bw or np.nan))
    out = table.assign(intensity=intensity, tflops_per_s=achieved / 1e12, gb_per_s=traffic / 1e9,
                       peak_tflops=peak / 1e12, ridge=ridge, bound=bound, pct_of_roof=pct)
    return out.sort_values("time_us", ascending=False, ignore_index=True)


def _flop_check(trace: Trace, ops: pd.DataFrame) -> pd.DataFrame | None:
    """Per aten op: FLOPs per step from the shapes against torch's FLOP counter on the live step."""
    import pandas as pd

    metrics = trace.step_metrics
    if metrics is None or not len(metrics.by_op):
        return None
    steps = max(len(trace.steps), 1)
    ours = ops.groupby("name")["flops"].sum() / steps
    rows = [{"op": _aten(str(op)), "counter_flops": float(f),
             "shape_flops": float(ours.get(_aten(str(op)), 0.0))}
            for op, f in zip(metrics.by_op["op"], metrics.by_op["hardware_flops"], strict=True)]
    return pd.DataFrame(rows, columns=["op", "counter_flops", "shape_flops"])
