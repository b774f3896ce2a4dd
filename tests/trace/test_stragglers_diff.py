"""nbt.stragglers and nbt.compare on real multi-rank and before/after traces."""

from __future__ import annotations

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError


@pytest.fixture(scope="module")
def dlrm(real_data):
    return nbt.load_trace(real_data("traces/param_dlrm_8rank"))


def test_stragglers_on_eight_ranks(dlrm):
    report = nbt.stragglers(dlrm)
    table = report.table
    assert list(table["rank"]) == list(range(8))
    assert report.slowest_rank == int(table.loc[table["work_ms"].idxmax(), "rank"])
    assert report.slowdown_pct == pytest.approx(table["slowdown_pct"].max())
    assert (table["work_ms"] == table["step_time_ms"] - table["exposed_comm_ms"]).all()
    assert f"rank {report.slowest_rank}" in repr(report)
    assert "<table" in report._repr_html_()


def test_stragglers_threshold(dlrm):
    report = nbt.stragglers(dlrm, threshold_pct=1000.0)
    assert not report.has_straggler
    assert "No straggler" in repr(report)


def test_compare_before_after(real_data):
    before = nbt.load_trace(real_data("traces/hta_trace_diff/control"))
    after = nbt.load_trace(real_data("traces/hta_trace_diff/test"))
    diff = nbt.compare(before, after)
    summary = diff.summary.set_index("metric")
    step = summary.loc["step time (ms, median)"]
    assert step["before"] == pytest.approx(before.steps["dur"].median() / 1e3)
    assert step["after"] == pytest.approx(after.steps["dur"].median() / 1e3)
    assert diff.step_time_change_pct == pytest.approx(100 * (step["after"] / step["before"] - 1))
    assert len(diff.operators) == 15
    deltas = diff.operators["delta_ms"].abs().to_numpy()
    assert (deltas[:-1] >= deltas[1:]).all()  # the biggest changes first
    assert diff.kernels is not None and len(diff.kernels)
    assert "Trace comparison" in repr(diff)


def test_compare_same_trace_changes_nothing(real_data):
    trace = nbt.load_trace(real_data("traces/hta_trace_compare/base"))
    diff = nbt.compare(trace, trace)
    assert (diff.summary["delta"] == 0).all()
    assert (diff.operators["delta_ms"] == 0).all()


def test_compare_needs_traces(real_data):
    trace = nbt.load_trace(real_data("traces/hta_trace_compare/base"))
    with pytest.raises(NbtUsageError, match=r"compare\(\) \(after\) takes a Trace .* or the path"):
        nbt.compare(trace, 5)
    with pytest.raises(nbt.TraceError, match=r"after\.json: no such file"):  # a path is loaded
        nbt.compare(trace, "after.json")
