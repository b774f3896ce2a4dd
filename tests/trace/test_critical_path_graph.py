"""The critical path's graph rules on small traces built here in the shape Kineto records them.

Each trace is one rank's events frame as ``load_trace`` makes it (host ops, runtime calls with
a correlation, kernels on streams carrying the same correlation), inside a ``window`` annotation.
"""

from __future__ import annotations

import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.trace.records import RankInfo, empty_collectives
from nbtoolkit.trace.trace import Trace


def _trace(rows: list[tuple[str, str, float, float, int, int]]) -> Trace:
    """rows: (name, cat, ts, dur, stream, correlation); host rows on thread 1, kernels on their stream."""
    frame = pd.DataFrame(
        {
            "ts": [float(r[2]) for r in rows],
            "dur": [float(r[3]) for r in rows],
            "name": pd.Categorical([r[0] for r in rows]),
            "cat": pd.Categorical([r[1] for r in rows]),
            "pid": [1 if r[4] < 0 else 0 for r in rows],
            "tid": [1 if r[4] < 0 else r[4] for r in rows],
            "stream": [r[4] for r in rows],
            "device": [-1 if r[4] < 0 else 0 for r in rows],
            "correlation": [r[5] for r in rows],
            "external_id": [-1] * len(rows),
        }
    ).sort_values("ts", kind="stable", ignore_index=True)
    return Trace(events={0: frame}, info={0: RankInfo(rank=0, device_type="cuda")},
                 collectives={0: empty_collectives()})


WINDOW = ("window", "user_annotation", 0.0, 1000.0, -1, -1)


def test_cuda_graph_kernels_all_hang_off_their_launch():
    trace = _trace([
        WINDOW,
        ("step_op", "cpu_op", 0.0, 20.0, -1, -1),
        ("cudaGraphLaunch", "cuda_runtime", 2.0, 10.0, -1, 7),
        # three kernels of one graph, one correlation, back to back on stream 7
        ("graph_kernel_a", "kernel", 30.0, 100.0, 7, 7),
        ("graph_kernel_b", "kernel", 131.0, 300.0, 7, 7),
        ("graph_kernel_c", "kernel", 432.0, 200.0, 7, 7),
    ])
    path = nbt.critical_path(trace, annotation="window")
    names = list(path.segments["name"])
    for kernel in ("graph_kernel_a", "graph_kernel_b", "graph_kernel_c"):
        assert kernel in names
    kernels = path.segments[path.segments["kind"] == "kernel"]
    assert kernels["work_us"].sum() == pytest.approx(600.0)
    assert path.segments["dur_us"].sum() == pytest.approx(path.span_us) == pytest.approx(1000.0)


def test_a_wait_for_another_stream_is_inferred_without_sync_events():
    # k2 was launched at t=6 onto an idle stream 2, but started only as k1 (stream 1) ended:
    # it waited for k1 (a recorded-event wait the trace has no sync events for)
    trace = _trace([
        WINDOW,
        ("op", "cpu_op", 0.0, 12.0, -1, -1),
        ("cudaLaunchKernel", "cuda_runtime", 1.0, 3.0, -1, 1),
        ("cudaLaunchKernel", "cuda_runtime", 6.0, 3.0, -1, 2),
        ("k1", "kernel", 10.0, 400.0, 1, 1),
        ("k2", "kernel", 411.0, 100.0, 2, 2),
    ])
    path = nbt.critical_path(trace, annotation="window")
    seg = path.segments
    assert list(seg.loc[seg["kind"] == "kernel", "name"]) == ["k1", "k2"]  # the chain runs through k1
    delays = seg.loc[seg["kind"] == "launch delay", "dur_us"]
    assert delays.sum() < 20  # only k1's own launch; k2's 400 µs wait is not a launch delay
    assert path.length_us == pytest.approx(400.0 + 100.0 + 9.0, abs=2.0)  # k1, k2, the launch before k1


def test_a_kernel_queued_behind_earlier_work_is_not_a_launch_delay():
    trace = _trace([
        ("cudaLaunchKernel", "cuda_runtime", -50.0, 3.0, -1, 1),  # launched before the step
        WINDOW,
        ("op", "cpu_op", 0.0, 10.0, -1, -1),
        ("cudaLaunchKernel", "cuda_runtime", 2.0, 3.0, -1, 2),
        ("earlier", "kernel", -40.0, 500.0, 3, 1),  # still running when the step starts
        ("queued", "kernel", 461.0, 100.0, 3, 2),
    ])
    path = nbt.critical_path(trace, annotation="window")
    seg = path.segments
    assert "launch delay" not in set(seg["kind"])
    earlier = seg[seg["name"] == "earlier"].iloc[0]
    assert earlier["start_us"] == pytest.approx(0.0) and earlier["dur_us"] == pytest.approx(460.0)
    assert seg["dur_us"].sum() == pytest.approx(path.span_us)
