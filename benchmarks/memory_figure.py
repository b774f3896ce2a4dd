"""Memory timeline figure on 1M synthetic events: build time and bytes added to a notebook.

Targets (issue 6): the figure builds in <= 2 s and adds <= 2 MB to the notebook.
For scale it also builds, side by side in the same run, the naive figure (every event
of the total as one plotly line, no decimation) and prints the ratios.

    .venv/bin/python benchmarks/memory_figure.py [--events 1000000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd


def synthetic_events(n: int, *, seed: int = 0) -> pd.DataFrame:
    """n/2 allocations then their frees in shuffled order, over 24 modules and 3 phases."""
    rng = np.random.default_rng(seed)
    half = n // 2
    sizes = rng.integers(256, 1 << 20, half)
    order = rng.permutation(half)
    categories = np.array(["activation", "temporary", "gradient", "optimizer_state", "autograd_detail"])
    category = categories[rng.integers(0, len(categories), half)]
    modules = np.array([f"layers.{i}.mlp" for i in range(24)])
    position = np.arange(n)
    return pd.DataFrame(
        {
            "time_us": np.sort(rng.uniform(0, 5e6, n)),
            "action": np.repeat(["alloc", "free"], half),
            "delta_bytes": np.r_[sizes, -sizes[order]],
            "category": np.r_[category, category[order]],
            "tensor": np.r_[np.arange(half), order],
            "module": modules[position * 24 // n],
            "phase": np.where(
                position < n // 3, "forward", np.where(position < 2 * n // 3, "backward", "optimizer")
            ),
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import plotly.graph_objects as go

    from nbtoolkit.memory.figures import timeline_figure
    from nbtoolkit.memory.timeline import MemoryTimeline
    from nbtoolkit.memory.timeline_analysis import running_total

    frame = synthetic_events(args.events)
    start = time.perf_counter()
    timeline = MemoryTimeline(events=frame)
    model_s = time.perf_counter() - start

    build_times = []
    figure = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        figure = timeline_figure(timeline)
        build_times.append(time.perf_counter() - start)
    assert figure is not None
    notebook_bytes = len(figure.to_json().encode())

    start = time.perf_counter()
    naive = go.Figure(go.Scatter(x=timeline.events["time_us"].to_numpy(), y=running_total(timeline.events)))
    naive_bytes = len(naive.to_json().encode())
    naive_s = time.perf_counter() - start

    build_s = statistics.median(build_times)
    print(f"events: {args.events:,}")
    print(f"MemoryTimeline from the frame: {model_s:.2f} s")
    print(f"timeline_figure build (median of {args.repeat}): {build_s:.2f} s  (target <= 2 s)")
    print(f"figure JSON stored in the notebook: {notebook_bytes / 1024**2:.2f} MiB  (target <= 2 MB)")
    print(
        f"naive 1-line figure of every event: {naive_s:.2f} s to build+serialize, "
        f"{naive_bytes / 1024**2:.1f} MiB"
    )
    print(f"ratio naive/decimated bytes: {naive_bytes / notebook_bytes:.1f}x")
    print("targets met:", build_s <= 2.0 and notebook_bytes <= 2_000_000)


if __name__ == "__main__":
    main()
