"""nbt.critical_path on real GPU traces, against HolisticTraceAnalysis 0.5 run live.

- hta_critical_path_alexnet (HTA's own critical-path test trace: AlexNet on an A100, CUDA sync
  events on): the path's work equals HTA's critical path length and holds HTA's events.
- hta_negative_queue_16rank_r0 (rank 0 of 16, with 14 ``cudaGraphLaunch`` per step): every
  kernel of a CUDA graph carries its launch's correlation. HTA links one device event per
  correlation, so most graph kernels are missing from its graph; they are on ours.

HTA 0.5 was written for pandas 2: under pandas 3 its ``DataFrame.drop(axis=1, columns=...)``
raises. The ``hta`` fixture drops the redundant ``axis`` for the duration of a test (the
arguments mean the same in pandas 2); nothing else of HTA is changed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import nbtoolkit as nbt

# HTA's pandas-2 idioms warn under pandas 3 (and some of its in-place fillna calls do nothing
# there; none changes which events are on its path on these traces, as the equality shows).
pytestmark = [pytest.mark.filterwarnings("ignore::Warning:hta"),
              pytest.mark.filterwarnings("ignore:The inplace keyword")]

ALEXNET_WINDOW = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"  # the window HTA's test uses


def _keys(frame: pd.DataFrame, rows) -> set[tuple[str, float, float]]:
    sub = frame.loc[sorted(rows)]
    return set(zip(sub["name"].astype(str), sub["ts"].astype(float), sub["dur"].astype(float), strict=True))


def test_alexnet_path_equals_hta(real_data, hta):
    folder = real_data("traces/hta_critical_path_alexnet")
    graph, ok = hta(trace_dir=str(folder)).critical_path_analysis(
        rank=0, annotation=ALEXNET_WINDOW, instance_id=1
    )
    assert ok
    hta_length = float(graph.get_critical_path_breakdown()["duration"].sum())
    hta_frame = graph.trace_df
    hta_names = graph.symbol_table.get_sym_table()
    hta_rows = hta_frame.loc[sorted(graph.critical_path_events_set)]
    # HTA's frame: integer µs shifted to the trace's first event; compare on (name, dur, offset)
    hta_first = float(hta_rows["ts"].min())
    theirs = {
        (hta_names[int(n)], float(t) - hta_first, float(d))
        for n, t, d in zip(hta_rows["name"], hta_rows["ts"], hta_rows["dur"], strict=True)
    }

    trace = nbt.load_trace(folder)
    path = nbt.critical_path(trace, annotation=ALEXNET_WINDOW, instance=1)
    frame = trace.rank_events(0)
    ours_abs = _keys(frame, path.events)
    our_first = min(t for _, t, _ in ours_abs)
    ours = {(n, t - our_first, d) for n, t, d in ours_abs}

    # The same work: HTA 35,835 µs on this trace; ties between equal chains may differ by a µs.
    assert path.length_us == pytest.approx(hta_length, abs=2.0)
    shared = len(theirs & ours)
    assert shared >= 0.9 * len(theirs), (len(theirs), len(ours), sorted(theirs - ours)[:5])
    # Both say the step is bound by the host: the allocator's cudaMalloc calls inside it.
    hta_cpu = graph.get_critical_path_breakdown().groupby("bound_by")["duration"].sum()["cpu_bound"]
    ours_host = path.segments.loc[path.segments["stream"] < 0, "work_us"].sum()
    assert ours_host == pytest.approx(hta_cpu, rel=0.01)
    assert path.opportunities.iloc[0]["name"] == "cudaMalloc"


def test_cuda_graph_kernels_are_on_our_graph_not_on_htas(real_data, hta):
    folder = real_data("traces/hta_negative_queue_16rank_r0")
    trace = nbt.load_trace(folder)
    frame = trace.rank_events(0)
    first = trace.steps.sort_values("step").iloc[0]
    path = nbt.critical_path(trace, step=int(first["step"]))

    launches = frame[(frame["name"] == "cudaGraphLaunch").to_numpy()
                     & (frame["ts"] >= first["ts"]).to_numpy()
                     & (frame["ts"] <= first["ts"] + first["dur"]).to_numpy()]
    of_launches = frame["correlation"].isin(launches["correlation"]).to_numpy()
    graph_rows = np.flatnonzero((frame["stream"].to_numpy() >= 0) & of_launches)
    per_launch = frame.iloc[graph_rows].groupby("correlation").size()
    assert len(launches) > 0 and per_launch.max() > 1  # graphs of several kernels
    ours_on_path = set(path.events) & set(graph_rows.tolist())

    analysis = hta(trace_dir=str(folder))
    graph, ok = analysis.critical_path_analysis(rank=0, annotation="ProfilerStep", instance_id=0)
    assert ok
    hta_full = graph.t_full.get_trace(0)
    of_launches = hta_full["correlation"].isin(launches["correlation"])
    hta_graph_events = hta_full[(hta_full["stream"] >= 0) & of_launches]
    in_hta_graph = [i for i in hta_graph_events.index if i in graph.event_to_start_node_map]
    # HTA: one device event per launch in its graph; the others are not there at all
    assert len(in_hta_graph) <= len(launches) < len(graph_rows)
    # ours: the graph kernels are there, and more of them bound the step than HTA even sees
    assert len(ours_on_path) > len(in_hta_graph)
    kinds = set(path.segments.loc[path.segments["row"].isin(list(ours_on_path)), "kind"])
    assert kinds <= {"kernel", "memory", "collective", "gpu idle"}


@pytest.mark.parametrize(
    "name", ["hta_critical_path_alexnet", "hta_trace_filter_2rank", "tracelens_h100_bert",
             "hta_negative_queue_16rank_r0", "tracelens_mi300_rccl_r0"]
)
def test_segments_tile_the_step(real_data, name):
    trace = nbt.load_trace(real_data(f"traces/{name}"))
    for rank in trace.ranks[:2]:
        if len(trace.steps[trace.steps["rank"] == rank]):
            path = nbt.critical_path(trace, rank=rank)
        else:  # no ProfilerStep: the whole first top-level annotation
            path = nbt.critical_path(trace, rank=rank, annotation="[param|pytorch.model.alex_net|0|0|0]")
        seg = path.segments
        assert seg["dur_us"].sum() == pytest.approx(path.span_us, rel=1e-9)
        np.testing.assert_allclose(seg["start_us"].iloc[1:], (seg["start_us"] + seg["dur_us"]).iloc[:-1])
        assert seg["start_us"].iloc[0] == pytest.approx(path.start_us)
        assert 0 < path.length_us <= path.span_us + 1e-6
        assert seg["share_pct"].sum() == pytest.approx(100.0)
        assert path.by_kind()["share_pct"].sum() == pytest.approx(100.0)
        # work is only where time passes, and never more than it
        assert (seg["work_us"] <= seg["dur_us"] + 1e-6).all()
        assert path.opportunities["dur_us"].is_monotonic_decreasing
        assert path.opportunities["advice"].str.len().gt(20).all()


@pytest.mark.parametrize(
    "name", ["tracelens_mi300_rccl_r0", "hta_negative_queue_16rank_r0", "tracelens_h100_bert"]
)
def test_launch_delays_are_launches_onto_idle_streams(real_data, name):
    """A launch delay on the path is a kernel launched onto a stream with nothing running or queued.

    Work launched before the step but still running in it is on the graph, so a kernel queued
    behind it is never counted as a launch delay.
    """
    trace = nbt.load_trace(real_data(f"traces/{name}"))
    frame = trace.rank_events(trace.ranks[0])
    device = frame[frame["stream"].to_numpy() >= 0]
    path = nbt.critical_path(trace)
    seg = path.segments.reset_index(drop=True)
    delays = seg.index[seg["kind"] == "launch delay"]
    for i in delays:
        kernel = seg.iloc[i + 1]
        on_stream = device[(device["stream"] == kernel["stream"]).to_numpy()]
        launched_at = seg["start_us"].iat[i]
        busy = (on_stream["ts"] < launched_at) & (on_stream["ts"] + on_stream["dur"] > launched_at)
        assert not busy.any(), (name, seg.iloc[i : i + 2])


def test_a_trace_without_steps_is_one_window(real_data):
    trace = nbt.load_trace(real_data("traces/tracelens_b200_r0"))
    assert not len(trace.steps)
    path = nbt.critical_path(trace)
    assert path.step == "the whole trace" and any("no ProfilerStep" in n for n in path.notes)
    host = trace.rank_events(trace.ranks[0])
    host = host[host["stream"] < 0]
    assert path.start_us == pytest.approx(host["ts"].min())
    assert path.segments["dur_us"].sum() == pytest.approx(path.span_us)
    summary = nbt.critical_path_by_rank(trace)
    assert list(summary["rank"]) == trace.ranks
    assert summary.filter(like="_pct").drop(columns="top_share_pct").sum(axis=1).round(6).eq(100.0).all()
