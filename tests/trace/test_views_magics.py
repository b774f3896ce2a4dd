"""Trace views (timeline, overlap chart, report) and the %nbt overlap / %nbt trace magics."""

from __future__ import annotations

import json

import pytest

import nbtoolkit as nbt
from nbtoolkit.trace.overlap_report import OverlapReport
from nbtoolkit.trace.timeline_figure import timeline
from nbtoolkit.trace.views import TraceReport, overlap_chart


@pytest.fixture(scope="module")
def two_ranks(real_data):
    return nbt.load_trace(real_data("traces/hta_trace_filter_2rank"))


def test_timeline_has_lanes_per_rank_and_stream_and_marks_steps(two_ranks):
    fig = timeline(two_ranks)
    labels = list(fig.layout.yaxis.ticktext)
    assert any(label.startswith("rank 0 · stream") for label in labels)
    assert any(label.startswith("rank 1 · stream") for label in labels)
    kinds = {trace.name for trace in fig.data}
    assert {"compute", "communication", "host"} <= kinds
    assert len(fig.layout.shapes) == 2  # two ProfilerSteps shaded


def test_timeline_is_decimated_on_large_traces(real_data):
    trace = nbt.load_trace(real_data("traces/hta_df_index_resolver"))
    n_events = len(trace.events[1])
    fig = timeline(trace, resolution=500)
    points = sum(sum(x is not None for x in data.x) for data in fig.data)
    lanes = len(fig.layout.yaxis.ticktext)
    kinds = len(fig.data)
    assert n_events > 100_000
    assert points <= 2 * 501 * lanes * kinds  # bounded by the resolution, not by the trace size
    assert points < n_events / 10


def test_overlap_chart(two_ranks):
    fig = overlap_chart(two_ranks)
    assert [bar.name for bar in fig.data] == ["hidden behind compute", "exposed"]
    assert list(fig.data[1].text) == ["11.8 % overlap", "20.1 % overlap"]  # HTA: 11.81, 20.05


def test_report_text_html_and_figures(two_ranks):
    report = TraceReport.of(two_ranks)
    text = repr(report)
    assert "Temporal breakdown" in text and "Communication/computation overlap" in text
    assert "Idle time per stream" in text
    bundle = report._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert len(report._report_figures()) == 2


def test_html_escapes_script_names_in_every_view(tmp_path):
    evil = "<script>alert('x')</script>"
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#0",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 50,
        },
        {"ph": "X", "cat": "cpu_op", "name": evil, "pid": 1, "tid": 1, "ts": 1, "dur": 5},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 2,
            "dur": 1,
            "args": {"correlation": 9},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": evil,
            "pid": 0,
            "tid": 7,
            "ts": 3,
            "dur": 10,
            "args": {"stream": 7, "correlation": 9},
        },
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = nbt.load_trace(path)
    for view in (
        trace,
        TraceReport.of(trace),
        OverlapReport.of(trace),
        nbt.kernel_breakdown(trace),
        nbt.stragglers(trace),
    ):
        html = view._repr_html_()
        assert "<script>" not in html, type(view).__name__
    assert "&lt;script&gt;" in TraceReport.of(trace)._repr_html_()


def test_magic_overlap_from_a_path(shell, real_data):
    folder = real_data("traces/hta_trace_filter_2rank")
    result = shell.run_line_magic("nbt", f"overlap {folder} --name ov")
    assert isinstance(result, OverlapReport)
    assert shell.user_ns["ov"] is result
    assert list(result.table["overlap_pct"].round(2)) == [11.81, 20.05]


def test_magic_trace_from_a_variable(shell, two_ranks):
    shell.user_ns["tr"] = two_ranks
    result = shell.run_line_magic("nbt", "trace tr")
    assert isinstance(result, TraceReport)
    assert result.trace is two_ranks
    assert shell.user_ns["_nbt"] is result


def test_magic_on_a_missing_path_is_one_trace_error(shell):
    result = shell.run_cell("%nbt overlap /no/such/traces")
    assert isinstance(result.error_in_exec, nbt.TraceError)
    assert "no such file or folder" in str(result.error_in_exec)


def test_profiled_cell_feeds_the_same_views(shell):
    import torch

    shell.user_ns["torch"] = torch
    result = shell.run_cell("%%nbt profile --steps 2 --warmup 0 --name p\ntorch.randn(32, 32).sum()\n")
    assert result.success, result.error_in_exec
    report = shell.run_line_magic("nbt", "trace p")
    assert (report.overlap["method"] == "cpu-gloo").all()
    assert len(report.temporal) == 1 and report.temporal["span_us"].iloc[0] > 0
