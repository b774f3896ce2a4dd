"""A real 2-rank CPU run: DDP over a gloo group on loopback, each rank profiled with nbt.profile.

The run is recorded once per session by the ``gloo_trace_folder`` fixture (tests/trace/conftest.py).
"""

from __future__ import annotations

import math

import pytest

import nbtoolkit as nbt


@pytest.mark.distributed
@pytest.mark.slow
def test_two_gloo_ranks_have_collectives_and_a_finite_overlap(gloo_trace_folder):
    trace = nbt.load_trace(gloo_trace_folder)
    assert trace.ranks == [0, 1]
    for rank in (0, 1):
        info = trace.info[rank]
        assert info.backend == "gloo" and info.world_size == 2
        assert info.notes == []  # the rank came from distributedInfo
        assert list(trace.steps.query("rank == @rank")["step"]) == [0, 1, 2]
    assert any("worker.py.txt" in note for note in trace.notes)

    overlap = nbt.comm_comp_overlap(trace)
    assert list(overlap["rank"]) == [0, 1]
    assert (overlap["method"] == "cpu-gloo").all()
    assert (overlap["comm_time_us"] > 0).all()
    for pct in overlap["overlap_pct"]:
        assert math.isfinite(pct) and 0 <= pct <= 100
    calls = nbt.comm_comp_overlap(trace, by="collective")
    for rank in (0, 1):
        assert "all_reduce" in set(calls.loc[calls["rank"] == rank, "collective"])

    breakdown = nbt.temporal_breakdown(trace)
    total = breakdown["idle_us"] + breakdown["compute_us"] + breakdown["non_compute_us"]
    assert (abs(total - breakdown["span_us"]) < 1e-6).all()
    assert (breakdown["compute_us"] > 0).all()

    report = nbt.stragglers(trace)
    assert report.slowest_rank in (0, 1)
