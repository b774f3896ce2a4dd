"""Synthetic traces and memory timelines of any size, for the timeline widget's tests and benchmark.

Plain numpy/pandas (no torch), so a browser test's kernel can import it from a copied file.
The trace is a real :class:`nbtoolkit.Trace` (the model's columns and dtypes); events are random
but seeded, so sizes and timings are reproducible.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

KERNEL_NAMES = ["gemm_bf16_tn", "elementwise_add", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "Memcpy DtoH"]
HOST_NAMES = ["aten::mm", "aten::add", "cudaLaunchKernel", "aten::copy_"]


def synthetic_trace(
    n_events: int,
    *,
    ranks: int = 1,
    streams: int = 2,
    seed: int = 0,
    special: tuple[str, ...] = (),
) -> object:
    """``n_events`` events per trace, split evenly over ranks x (streams + one host thread).

    Each ``special`` name is given to one long event (a tenth of the span) on the first lane of
    rank 0, centred at (i + 1) / (len(special) + 1) of the span, so a test knows where to hover.
    """
    from nbtoolkit.trace.records import RankInfo, empty_collectives
    from nbtoolkit.trace.trace import Trace

    rng = np.random.default_rng(seed)
    per_lane = max(1, n_events // (ranks * (streams + 1)))
    span = per_lane * 2.0  # µs: on average an event every 2 µs per lane
    events, info = {}, {}
    for rank in range(ranks):
        frames = []
        for lane in range(streams + 1):
            on_device = lane < streams
            ts = np.sort(rng.uniform(0, span, per_lane))
            dur = rng.exponential(0.8, per_lane)
            dur[:: max(1, per_lane // 200)] *= 400  # a few long events that show exactly at full zoom-out
            names = np.array(KERNEL_NAMES if on_device else HOST_NAMES, dtype=object)
            name = names[rng.integers(0, len(names), per_lane)]
            if rank == 0 and lane == 0:
                for i, text in enumerate(special):
                    centre = span * (i + 1) / (len(special) + 1)
                    ts = np.r_[ts, centre - span / 20]
                    dur = np.r_[dur, span / 10]
                    name = np.concatenate([name, np.array([text], dtype=object)])
            n = len(ts)
            frames.append(
                pd.DataFrame(
                    {
                        "ts": ts + 1_000_000.0,
                        "dur": dur,
                        "name": name,
                        "cat": "kernel" if on_device else "cpu_op",
                        "pid": 0 if on_device else 100,
                        "tid": 7 + lane if on_device else 1,
                        "stream": 7 + lane if on_device else -1,
                        "device": 0 if on_device else -1,
                        "correlation": np.arange(n) if on_device else -1,
                        "external_id": -1,
                    }
                )
            )
        frame = pd.concat(frames, ignore_index=True).sort_values("ts", kind="stable", ignore_index=True)
        frame["name"] = frame["name"].astype("category")
        frame["cat"] = frame["cat"].astype("category")
        for column in ("pid", "tid", "stream", "device", "correlation", "external_id"):
            frame[column] = frame[column].astype("int64")
        events[rank] = frame
        info[rank] = RankInfo(rank=rank, world_size=ranks, device_type="cuda", source="synthetic")
    return Trace(events=events, info=info, collectives={r: empty_collectives() for r in events})


def synthetic_memory_events(n: int, *, seed: int = 0) -> pd.DataFrame:
    """``n`` memory events: allocations and frees interleaved (a sawtooth per step), 4 categories."""
    rng = np.random.default_rng(seed)
    half = n // 2
    sizes = rng.integers(256, 1 << 20, half)
    categories = np.array(["parameter", "activation", "gradient", "temporary"])
    category = categories[rng.integers(0, len(categories), half)]
    # Each allocation is freed a little later: alloc i at position 2i - lag, its free at 2i.
    alloc_time = np.sort(rng.uniform(0, 5e6, half))
    free_time = alloc_time + rng.exponential(2e4, half)
    times = np.r_[alloc_time, free_time]
    order = np.argsort(times, kind="stable")
    return pd.DataFrame(
        {
            "time_us": times[order],
            "action": np.repeat(["alloc", "free"], half)[order],
            "delta_bytes": np.r_[sizes, -sizes][order],
            "category": np.r_[category, category][order],
            "tensor": np.r_[np.arange(half), np.arange(half)][order],
            "module": "",
            "phase": "forward",
            "shape": "",
            "source": "",
            "stack_id": -1,
        }
    )


EPOCH_ORIGIN_US = 1_694_128_201_421_221  # the 8-rank DLRM set's first event: Kineto's epoch µs


def write_epoch_traces(
    folder: object,
    *,
    ranks: int = 8,
    streams: int = 5,
    per_lane: int = 400,
    origin_us: int = EPOCH_ORIGIN_US,
    seed: int = 0,
    special: tuple[str, ...] = (),
) -> list[object]:
    """Write one Kineto JSON file per rank whose timestamps are epoch µs, as the profiler writes them.

    Per rank: a ``ProfilerStep#10`` annotation over the whole rank, ``per_lane`` host operators
    on one thread and ``per_lane`` kernels on each of ``streams`` streams, a zero-duration
    instant on the host and one long host operator (``long_host_op``, 40 % of the span) so a
    test knows where something covers the middle of every rank. Each ``special`` name is given
    to one kernel of rank 0. Returns the files written.
    """
    import json
    from pathlib import Path

    rng = np.random.default_rng(seed)
    out = Path(str(folder))
    out.mkdir(parents=True, exist_ok=True)
    span = 20_000  # µs, like the DLRM step
    files = []
    for rank in range(ranks):
        pid, tid = 1000 + rank, 2000 + rank
        events: list[dict[str, object]] = [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#10", "pid": pid, "tid": tid,
             "ts": origin_us + rank, "dur": span - rank},
            {"ph": "X", "cat": "cpu_op", "name": "long_host_op", "pid": pid, "tid": tid,
             "ts": origin_us + span * 3 // 10, "dur": span * 4 // 10},
            {"ph": "X", "cat": "cpu_op", "name": "instant_op", "pid": pid, "tid": tid,
             "ts": origin_us + span // 2, "dur": 0},
        ]  # fmt: skip
        starts = np.sort(rng.integers(1, span - 50, per_lane))
        for i, ts in enumerate(starts.tolist()):
            events.append({"ph": "X", "cat": "cpu_op", "name": HOST_NAMES[i % len(HOST_NAMES)], "pid": pid,
                           "tid": tid, "ts": origin_us + ts, "dur": int(rng.integers(1, 40))})  # fmt: skip
        for s in range(streams):
            starts = np.sort(rng.integers(1, span - 50, per_lane))
            for i, ts in enumerate(starts.tolist()):
                name = KERNEL_NAMES[i % len(KERNEL_NAMES)]
                if rank == 0 and s == 0 and i < len(special):
                    name = special[i]
                args = {"device": 0, "stream": 7 + s, "correlation": 10_000 * s + i}
                dur = float(rng.integers(1, 200)) / 4
                events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7 + s,
                               "ts": origin_us + ts, "dur": dur, "args": args})  # fmt: skip
        document = {
            "schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks},
            "traceEvents": events,
        }
        path = out / f"rank{rank}.{origin_us // 1000}.pt.trace.json"
        path.write_text(json.dumps(document))
        files.append(path)
    return files
