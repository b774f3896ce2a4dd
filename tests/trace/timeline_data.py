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
    from nbtoolkit.model.trace import RankInfo, Trace, empty_collectives

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
