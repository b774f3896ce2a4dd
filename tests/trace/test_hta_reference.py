"""nbtoolkit's breakdowns and overlap equal HolisticTraceAnalysis 0.5 on every reference set.

References: ../shared/fixtures/reference/hta/<set>/*.csv (HTA defaults: the last ProfilerStep
left out, except in traces with fewer than two steps). HTA rounds percentages to 2
decimals and reports whole microseconds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import nbtoolkit as nbt

SETS = {
    "critical_path_alexnet": "hta_critical_path_alexnet",
    "mtia_trace_single_rank": "hta_mtia_single_rank",
    "nccl_parser_config": "hta_nccl_parser_config",
    "negative_queue_length_values_check": "hta_negative_queue_16rank_r0",
    "trace_filter_2rank": "hta_trace_filter_2rank",
    "tracelens_h100_bert_small": "tracelens_h100_bert",
}


@pytest.fixture(scope="module", params=sorted(SETS))
def case(request, real_data):
    reference = real_data(f"reference/hta/{request.param}")
    trace = nbt.load_trace(real_data(f"traces/{SETS[request.param]}"))
    return trace, reference


def test_temporal_breakdown_equals_hta(case):
    trace, reference = case
    ours = nbt.temporal_breakdown(trace).set_index("rank").sort_index()
    ref = pd.read_csv(reference / "temporal_breakdown.csv").set_index("rank").sort_index()
    assert list(ours.index) == list(ref.index)
    for mine, theirs in [
        ("idle_us", "idle_time(us)"),
        ("compute_us", "compute_time(us)"),
        ("non_compute_us", "non_compute_time(us)"),
        ("span_us", "kernel_time(us)"),
    ]:
        np.testing.assert_allclose(ours[mine], ref[theirs], atol=1.0, err_msg=mine)
    for mine, theirs in [
        ("idle_pct", "idle_time_pctg"),
        ("compute_pct", "compute_time_pctg"),
        ("non_compute_pct", "non_compute_time_pctg"),
    ]:
        np.testing.assert_allclose(ours[mine], ref[theirs], atol=0.1, err_msg=mine)
    total = ours["idle_us"] + ours["compute_us"] + ours["non_compute_us"]
    np.testing.assert_allclose(total, ours["span_us"])


def test_comm_comp_overlap_equals_hta(case):
    trace, reference = case
    ours = nbt.comm_comp_overlap(trace).set_index("rank").sort_index()
    ref = pd.read_csv(reference / "comm_comp_overlap.csv").set_index("rank").sort_index()
    assert list(ours.index) == list(ref.index)
    expected = ref["comp_comm_overlap_pctg"].to_numpy()
    got = ours["overlap_pct"].to_numpy()
    assert (np.isnan(expected) == np.isnan(got)).all()  # NaN: no communication kernels
    np.testing.assert_allclose(got[~np.isnan(got)], expected[~np.isnan(expected)], atol=0.1)
    np.testing.assert_allclose(ours["exposed_comm_us"], ours["comm_time_us"] - ours["overlap_time_us"])


def test_kernel_type_breakdown_equals_hta(case):
    trace, reference = case
    ours = nbt.kernel_breakdown(trace).by_type.set_index("kernel_type")["sum_us"]
    ref = pd.read_csv(reference / "gpu_kernel_type_breakdown.csv").set_index("kernel_type")["sum"]
    assert set(ours.index) == set(ref.index)
    np.testing.assert_allclose(ours.loc[ref.index].to_numpy(), ref.to_numpy(), atol=1.0)


def test_idle_breakdown_equals_hta(case):
    trace, reference = case
    ours = nbt.idle_breakdown(trace).set_index(["rank", "stream", "idle_category"]).sort_index()
    ref = pd.read_csv(reference / "idle_time_breakdown.csv").set_index(["rank", "stream", "idle_category"])
    ref = ref.sort_index()
    assert list(ours.index) == list(ref.index)
    np.testing.assert_allclose(ours["idle_us"], ref["idle_time"], atol=1.0)
    np.testing.assert_allclose(
        ours["idle_ratio"].round(2), ref["idle_time_ratio"], atol=0.011, equal_nan=True
    )


def test_per_iteration_and_per_collective_add_up(case):
    trace, _ = case
    per_rank = nbt.comm_comp_overlap(trace).set_index("rank")
    per_step = nbt.comm_comp_overlap(trace, by="iteration")
    per_call = nbt.comm_comp_overlap(trace, by="collective")
    for rank, row in per_rank.iterrows():
        if row["comm_time_us"] == 0:
            assert per_call[per_call["rank"] == rank].empty
            continue
        steps = per_step[per_step["rank"] == rank]
        if len(steps):
            assert steps["overlap_time_us"].sum() <= row["overlap_time_us"] + 1e-6
        calls = per_call[per_call["rank"] == rank]
        # calls may overlap each other, so their sum bounds the merged time from above
        assert calls["dur_us"].sum() >= row["comm_time_us"] - 1e-6
        assert ((calls["overlap_pct"] >= 0) & (calls["overlap_pct"] <= 100)).all()
