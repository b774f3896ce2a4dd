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

    from nbtoolkit.model.trace import Trace

__all__ = ["COLLECTIVE_COLUMNS", "bus_factor", "collective_bandwidth", "normalize_collective"]

COLLECTIVE_COLUMNS = ("rank", "collective", "group_size", "dtype", "size_bytes", "calls", "time_us",
                      "median_us", "algbw_gbps", "busbw_gbps")
_DTYPE_BYTES = {"float": 4, "float32": 4, "bfloat16": 2, "half": 2, "float16": 2, "double": 8,
                "float64": 8, "long": 8, "int64": 8, "int": 4, "int32": 4, "byte": 1, "char": 1,
                "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


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
    import pandas as pd

    meta = trace.collectives.get(rank)
    frame = trace.rank_events(rank)
    if meta is None or not len(meta):
        return pd.DataFrame(columns=["collective", "group_size", "dtype", "size_bytes", "dur"])
    meta = meta.dropna(subset=["collective"])
    rows = meta["row"].to_numpy()
    on_device = frame["stream"].to_numpy()[rows] >= 0
    if on_device.any():  # the kernels' time; the host op only enqueued them
        meta, durs = meta[on_device], frame["dur"].to_numpy()[rows[on_device]]
    else:
        meta, durs = _paired_backend_times(frame, meta)
    elems = np.maximum(meta["in_msg_nelems"].fillna(0).astype("int64").to_numpy(),
                       meta["out_msg_nelems"].fillna(0).astype("int64").to_numpy())
    dtypes = meta["dtype"].fillna("").astype(str)
    width = np.array([_DTYPE_BYTES.get(d.lower().removeprefix("torch."), 0) for d in dtypes])
    world = trace.info[rank].world_size or 1
    out = pd.DataFrame({
        "collective": [normalize_collective(str(c)) for c in meta["collective"]],
        "group_size": meta["group_size"].fillna(world).astype("int64").to_numpy(),
        "dtype": dtypes.to_numpy(),
        "size_bytes": elems * width,
        "dur": durs,
    })
    return out[(out["collective"] != "barrier") & (out["size_bytes"] > 0)]


def _paired_backend_times(frame: pd.DataFrame, meta: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """gloo: the i-th call with metadata ran as the i-th ``gloo:`` op on a backend thread."""
    names = frame["name"].astype(str)
    backend = frame[names.str.startswith("gloo:").to_numpy()].sort_values("ts", kind="stable")
    # one metadata row per call: the outermost host op carrying it (record_param_comms nests)
    calls = meta.assign(ts=frame["ts"].to_numpy()[meta["row"].to_numpy()]).sort_values("ts", kind="stable")
    calls = calls.drop_duplicates(subset=["ts", "collective"], keep="first")
    n = min(len(calls), len(backend))
    return calls.iloc[:n], backend["dur"].to_numpy()[:n]
