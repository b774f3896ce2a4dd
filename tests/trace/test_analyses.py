"""Analyses where HTA has no answer (H100 Qwen, CPU-only) and hand-made traces with known answers."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError


def _write(tmp_path, events, name="rank0.json", **top):
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events, **top}))
    return path


def _kernel(name, ts, dur, corr, stream=7):
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "correlation": corr, "device": 0},
    }


def _launch(ts, corr):
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": 1,
        "args": {"correlation": corr},
    }


def test_qwen_h100_is_consistent_where_hta_asserts(real_data):
    trace = nbt.load_trace(real_data("traces/tracelens_h100_qwen"))
    tb = nbt.temporal_breakdown(trace)
    row = tb.iloc[0]
    assert row["idle_us"] >= 0 and row["compute_us"] > 0 and row["non_compute_us"] >= 0
    assert row["idle_us"] + row["compute_us"] + row["non_compute_us"] == pytest.approx(row["span_us"])
    assert row["idle_pct"] + row["compute_pct"] + row["non_compute_pct"] == pytest.approx(100.0)


@pytest.mark.parametrize("folder", ["hta_cpu_only", "hta_rank_non_gpu"])
def test_cpu_only_traces_get_consistent_answers(real_data, folder):
    trace = nbt.load_trace(real_data(f"traces/{folder}"))
    tb = nbt.temporal_breakdown(trace).iloc[0]
    assert tb["span_us"] > 0
    assert tb["idle_us"] + tb["compute_us"] + tb["non_compute_us"] == pytest.approx(tb["span_us"])
    overlap = nbt.comm_comp_overlap(trace).iloc[0]
    assert overlap["method"] == "cpu-gloo"


def test_cpu_gloo_overlap_counts_gloo_time(real_data):
    trace = nbt.load_trace(real_data("traces/hta_cpu_only"))
    row = nbt.comm_comp_overlap(trace).iloc[0]
    assert row["comm_time_us"] > 1e6  # eleven ~170 ms gloo:all_reduce calls
    assert 0 <= row["overlap_pct"] <= 100
    calls = nbt.comm_comp_overlap(trace, by="collective")
    assert set(calls["collective"]) == {"all_reduce"}


@pytest.mark.parametrize(
    "comm_kernel",
    [
        "ncclDevKernel_AllReduce_Sum_f32",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
        "hcclAllReduce",
    ],
)
def test_hand_made_gpu_overlap(tmp_path, comm_kernel):
    # compute kernel [0, 100), nccl kernel [50, 150): overlap 50 of 100 us of communication.
    events = [
        _launch(0, 1),
        _launch(1, 2),
        _kernel("gemm", 10, 100, 1),
        _kernel(comm_kernel, 60, 100, 2, stream=20),
    ]
    trace = nbt.load_trace(_write(tmp_path, events))
    row = nbt.comm_comp_overlap(trace).iloc[0]
    assert row["comm_time_us"] == 100 and row["overlap_time_us"] == 50
    assert row["overlap_pct"] == 50 and row["exposed_comm_us"] == 50
    tb = nbt.temporal_breakdown(trace).iloc[0]
    assert (tb["span_us"], tb["compute_us"], tb["non_compute_us"], tb["idle_us"]) == (150, 100, 50, 0)


def test_last_step_is_left_out_unless_asked(tmp_path):
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 100,
        },
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#2",
            "pid": 1,
            "tid": 1,
            "ts": 100,
            "dur": 100,
        },
        _launch(10, 1),
        _launch(110, 2),
        _kernel("gemm", 20, 50, 1),
        _kernel("gemm", 120, 30, 2),
    ]
    trace = nbt.load_trace(_write(tmp_path, events))
    assert nbt.temporal_breakdown(trace).iloc[0]["compute_us"] == 50
    assert nbt.temporal_breakdown(trace, include_last_step=True).iloc[0]["compute_us"] == 80
    kb = nbt.kernel_breakdown(trace, include_last_step=True)
    assert kb.by_kernel.iloc[0]["calls"] == 2
    assert "COMPUTATION" in repr(kb)


def test_idle_breakdown_categories(tmp_path):
    # stream 7: k1 [0,10), k2 launched at 5 starts 12 (gap 2 -> kernel_wait),
    # k3 launched at 50 (after k2 ended at 20) starts 60 (gap 40 -> host_wait),
    # k4 launched at 55 starts 200 (gap 130 -> other).
    events = [
        _launch(0, 1),
        _launch(5, 2),
        _launch(50, 3),
        _launch(55, 4),
        _kernel("a", 0, 10, 1),
        _kernel("b", 12, 8, 2),
        _kernel("c", 60, 10, 3),
        _kernel("d", 200, 5, 4),
    ]
    trace = nbt.load_trace(_write(tmp_path, events))
    idle = nbt.idle_breakdown(trace).set_index("idle_category")["idle_us"]
    assert idle.to_dict() == {"host_wait": 40.0, "kernel_wait": 2.0, "other": 130.0}


def test_bad_by_option(real_data):
    trace = nbt.load_trace(real_data("traces/hta_cpu_only"))
    with pytest.raises(NbtUsageError, match="by must be"):
        nbt.comm_comp_overlap(trace, by="stream")


def test_public_names():
    for name in [
        "load_trace",
        "Trace",
        "profile",
        "comm_comp_overlap",
        "temporal_breakdown",
        "kernel_breakdown",
        "idle_breakdown",
        "stragglers",
        "compare",
    ]:
        assert callable(getattr(nbt, name)), name
    assert np.isnan(np.nan)


def test_per_collective_rows_carry_message_sizes(real_data):
    trace = nbt.load_trace(real_data("traces/hta_nccl_parser_config"))
    calls = nbt.comm_comp_overlap(trace, by="collective")
    assert set(calls["collective"]) == {"allreduce", "broadcast"}
    allreduce = calls[calls["collective"] == "allreduce"]
    assert (allreduce["in_msg_nelems"] > 0).all() and set(allreduce["dtype"]) == {"Float"}
    total = calls["dur_us"].sum()
    assert calls["exposed_comm_us"].sum() + calls["overlap_time_us"].sum() == pytest.approx(total)
