"""Algorithmic and bus bandwidth of each collective, as nccl-tests defines them.

For a collective of ``size`` bytes that took ``t`` seconds on a group of ``n`` ranks:

- ``algbw = size / t``; ``size`` is the buffer nccl-tests reports: the data of one rank for
  all_reduce, broadcast, reduce and all_to_all, the gathered output for all_gather, the
  scattered input for reduce_scatter; i.e. the larger of the recorded ``In msg nelems`` and
  ``Out msg nelems`` times the element size;
- ``busbw = algbw * factor``, the factor making it comparable with the link's bandwidth:
  all_reduce ``2(n-1)/n``; all_gather, reduce_scatter, all_to_all ``(n-1)/n``; broadcast,
  reduce, send/recv ``1``.

Time: on a GPU trace the NCCL/RCCL kernel's duration; on a CPU trace the gloo op the backend
thread ran (paired in order with the ``c10d::`` calls that carry the metadata). Either time
includes waiting for the last rank to arrive, so the bandwidths are lower bounds of what the
links delivered; a low ``busbw`` on one rank only points at a straggler (``nbt.stragglers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import Trace

__all__ = ["COLLECTIVE_COLUMNS", "bus_factor", "collective_bandwidth", "normalize_collective"]

COLLECTIVE_COLUMNS = ("rank", "collective", "group_size", "dtype", "size_bytes", "calls", "time_us",
                      "median_us", "algbw_gbps", "busbw_gbps")
_DTYPE_BYTES = {"float": 4, "float32": 4, "bfloat16": 2, "half": 2, "float16": 2, "double": 8,
                "float64": 8, "long": 8, "int64": 8, "int": 4, "int32": 4, "byte": 1, "char": 1,
                "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
                "float32 (assumed)": 4}


def normalize_collective(name: str) -> str:
    """``_allgather_base``, ``all_gather_into_tensor`` ... -> ``all_gather`` (nccl-tests' names)."""
    flat = name.lower().replace("_", "").replace("coalesced", "")
    for key, label in (("allreduce", "all_reduce"), ("allgather", "all_gather"),
                       ("reducescatter", "reduce_scatter"), ("alltoall", "all_to_all"),
                       ("broadcast", "broadcast"), ("reduce", "reduce"), ("send", "send_recv"),
                       ("recv", "send_recv"), ("barrier", "barrier")):
        if key in flat:
            return label
    return name


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth factor of a (normalised) collective on ``ranks`` ranks."""
    if ranks <= 1:
        return 1.0 if collective in ("broadcast", "reduce", "send_recv") else 0.0
    if collective == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


def collective_bandwidth(trace: Trace, rank: int | None = None) -> pd.DataFrame:
    """One row per rank, collective, group size, dtype and message size (``COLLECTIVE_COLUMNS``).

    ``time_us`` is the total, ``median_us`` the median of one call; ``algbw_gbps`` and
    ``busbw_gbps`` (GB/s, 1e9 bytes) are computed from the median call.
    """
    import pandas as pd

    rows: list[dict[str, object]] = []
    for r in trace.ranks if rank is None else [rank]:
        calls = _calls(trace, r)
        if not len(calls):
            continue
        keys = ["collective", "group_size", "dtype", "size_bytes"]
        for key, group in calls.groupby(keys, sort=True):
            name, n, dtype, size = key
            median = float(np.median(group["dur"]))
            algbw = float(size) / (median * 1e-6) / 1e9 if median > 0 else float("nan")
            rows.append({"rank": r, "collective": name, "group_size": int(n), "dtype": dtype,
                         "size_bytes": int(size), "calls": len(group), "time_us": float(group["dur"].sum()),
                         "median_us": median, "algbw_gbps": algbw,
                         "busbw_gbps": algbw * bus_factor(str(name), int(n))})
    return pd.DataFrame(rows, columns=list(COLLECTIVE_COLUMNS))


def _calls(trace: Trace, rank: int) -> pd.DataFrame:
    """The rank's collectives with metadata: collective, group_size, dtype, size_bytes, dur (µs)."""

    frame = trace.rank_events(rank)
    world = trace.info[rank].world_size or 1
    meta = trace.collectives.get(rank)
    meta = meta.dropna(subset=["collective"]) if meta is not None and len(meta) else None
    if meta is not None and (frame["stream"].to_numpy()[meta["row"].to_numpy()] >= 0).any():
        meta = meta[frame["stream"].to_numpy()[meta["row"].to_numpy()] >= 0]  # the kernels: their time
        calls = _metadata_calls(meta, world).assign(dur=frame["dur"].to_numpy()[meta["row"].to_numpy()])
    else:
        calls = _backend_calls(trace, rank, frame, meta, world)
    width = np.array([_DTYPE_BYTES.get(d.lower().removeprefix("torch.").removeprefix("c10::"), 0)
                      for d in calls["dtype"]], dtype="int64")
    out = calls.assign(size_bytes=calls["elements"].to_numpy(dtype="int64") * width)
    return out[(out["collective"] != "barrier") & (out["size_bytes"] > 0)]


def _metadata_calls(meta: pd.DataFrame, world: int) -> pd.DataFrame:
    """collective, group_size, dtype, elements (the larger of in and out) of each metadata row."""
    import pandas as pd

    return pd.DataFrame({
        "collective": [normalize_collective(str(c)) for c in meta["collective"]],
        "group_size": meta["group_size"].fillna(world).astype("int64").to_numpy(),
        "dtype": meta["dtype"].fillna("").astype(str).to_numpy(),
        "elements": np.maximum(meta["in_msg_nelems"].fillna(0).astype("int64").to_numpy(),
                               meta["out_msg_nelems"].fillna(0).astype("int64").to_numpy()),
    })


def _backend_calls(trace: Trace, rank: int, frame: pd.DataFrame, meta: pd.DataFrame | None,
                   world: int) -> pd.DataFrame:
    """gloo: the i-th host call of a collective ran as the i-th ``gloo:`` op of that collective.

    The call's size comes from its collective metadata when the trace has it, else from the
    shapes recorded for ``c10d::`` ops (``record_shapes=True``): a TensorList's dims with no
    dtype, so float32 (DDP's gradient buckets) is assumed; the ``dtype`` column says so.
    """
    import pandas as pd

    columns = ["collective", "group_size", "dtype", "elements", "ts"]
    if meta is not None and len(meta):
        calls = _metadata_calls(meta, world).assign(ts=frame["ts"].to_numpy()[meta["row"].to_numpy()])
        calls = calls.drop_duplicates(subset=["ts", "collective"])
    else:
        shapes = trace.event_args(rank).shapes
        shapes = shapes[shapes["name"].astype(str).str.startswith("c10d::")]
        calls = pd.DataFrame([
            (normalize_collective(str(n).removeprefix("c10d::").rstrip("_")), world, "float32 (assumed)",
             _list_elements(dims), float(t))
            for n, dims, t in zip(shapes["name"], shapes["input_dims"], shapes["ts"], strict=True)
        ], columns=columns)
    names = frame["name"].astype(str)
    backend = frame[names.str.startswith("gloo:").to_numpy()].sort_values("ts", kind="stable")
    kinds = [normalize_collective(n.removeprefix("gloo:")) for n in backend["name"].astype(str)]
    backend_kind = np.array(kinds)
    parts = []
    for kind, group in calls.sort_values("ts", kind="stable").groupby("collective", sort=False):
        runs = backend["dur"].to_numpy()[backend_kind == kind]
        n = min(len(group), len(runs))
        parts.append(group.iloc[:n].assign(dur=runs[:n]))
    if not parts:
        return pd.DataFrame(columns=[*columns, "dur"])
    return pd.concat(parts, ignore_index=True)


def _list_elements(dims: object) -> int:
    """Elements of the first input of a c10d op: a tensor's dims or a TensorList's list of them."""
    first = dims[0] if isinstance(dims, list) and dims else []
    if isinstance(first, list) and first and all(isinstance(d, list) for d in first):
        return int(sum(int(np.prod(d)) if d else 1 for d in first))
    return int(np.prod(first)) if isinstance(first, list) and first else 0
