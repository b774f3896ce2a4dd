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


def test_a_large_jobs_report_lists_its_slowest_ranks_first(tmp_path, gloo_trace_folder):
    """Above 32 ranks the text and the HTML list the 12 slowest ranks, slowest first: in rank order
    a straggler past row 64 was missing from the HTML table, and 4,096 rows of text bury it."""
    from nbtoolkit.trace.scale_set import write_scale_set

    made = write_scale_set(gloo_trace_folder, tmp_path / "set", ranks=40, straggler=37)
    report = nbt.stragglers(nbt.load_trace(made.path, workers=1))
    table = report.table
    assert list(table["rank"]) == list(range(40))  # the frame keeps every rank, in rank order
    assert report.slowest_rank == 37 and report.has_straggler
    text = repr(report).splitlines()
    assert "the 12 slowest of 40 ranks, slowest first" in text[1]
    assert len(text) == 3 + 12 and text[3].split()[0] == "37"  # headline, which, header, 12 rows
    listed = [int(line.split()[0]) for line in text[3:]]
    expected = table.sort_values(["slowdown_pct", "rank"], ascending=[False, True])["rank"].head(12)
    assert listed == list(expected)
    html = report._repr_html_()
    assert "12 slowest of 40 ranks" in html and html.count("<tr>") == 1 + 12
    assert html.index(">37<") < html.index(f">{listed[1]}<")
    # a small job still lists every rank, in rank order
    small = nbt.stragglers(nbt.load_trace(gloo_trace_folder))
    assert "slowest of" not in repr(small) and len(repr(small).splitlines()) == 2 + len(small.table)
