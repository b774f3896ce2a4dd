"""%nbt trace shows the report of load_trace's Trace, %nbt overlap the table of comm_comp_overlap.

%%nbt profile shows what profile gives.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.trace.overlap_report import OverlapReport
from nbtoolkit.trace.views import TraceReport


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
         "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 40},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 60, "dur": 20},
    ]  # fmt: skip
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_trace_and_overlap_magics_on_a_file_show_the_api_views(
    shell: InteractiveShell, trace_file: Path, assert_same_display: Callable[..., None]
) -> None:
    trace = nbt.load_trace(trace_file)
    report = shell.run_line_magic("nbt", f"trace {trace_file}")
    assert_same_display(report, TraceReport.of(trace))
    assert "aten::mm" in repr(report)
    overlap = shell.run_line_magic("nbt", f"overlap {trace_file}")
    assert_same_display(overlap, OverlapReport.of(trace_file))
    pd.testing.assert_frame_equal(overlap.table, nbt.comm_comp_overlap(trace_file))


def test_overlap_magic_takes_a_summary_the_way_comm_comp_overlap_does(
    shell: InteractiveShell, trace_file: Path, assert_same_display: Callable[..., None]
) -> None:
    summary = nbt.summarize_traces(trace_file.parent, workers=1)
    shell.user_ns["summary"] = summary
    overlap = shell.run_line_magic("nbt", "overlap summary")
    assert isinstance(overlap, nbt.OverlapReport)
    assert_same_display(overlap, OverlapReport.of(summary))
    pd.testing.assert_frame_equal(overlap.table, nbt.comm_comp_overlap(summary))


def test_trace_magic_on_a_trace_variable_goes_through_load_trace(
    shell: InteractiveShell, trace_file: Path, assert_same_display: Callable[..., None]
) -> None:
    trace = nbt.load_trace(trace_file)
    shell.user_ns["tr"] = trace
    report = shell.run_line_magic("nbt", "trace tr")
    assert report.trace is trace
    assert_same_display(report, TraceReport.of(nbt.load_trace(trace)))


def test_profile_magic_shows_the_trace_profile_gives(
    shell: InteractiveShell, assert_same_display: Callable[..., None]
) -> None:
    import torch

    shell.user_ns["torch"] = torch
    cell = "torch.ones(32, 32).mm(torch.ones(32, 32)).sum()\n"
    from_magic = shell.run_cell_magic("nbt", "profile --steps 2 --warmup 0", cell)
    from_api = nbt.profile(lambda: eval(cell, shell.user_ns), steps=2, warmup=0)
    assert type(from_magic) is type(from_api)
    # Timings differ between two runs; which operators ran, and how often, does not.
    def calls(trace: nbt.Trace) -> dict[str, int]:
        table = trace.top_operators(1000)
        return dict(zip(table["name"], table["calls"].astype(int), strict=True))

    assert calls(from_api) and calls(from_magic) == calls(from_api)


def test_help_shows_the_api_defaults(shell: InteractiveShell) -> None:
    import inspect

    # nbt.profile's steps/warmup default to None: MeasureConfig's defaults, which the help shows
    assert inspect.signature(nbt.profile).parameters["steps"].default is None
    defaults = nbt.MeasureConfig()
    text = " ".join(str(shell.run_line_magic("nbt", "help profile")).split())  # argparse wraps lines
    assert f"profiled runs of the cell (default {defaults.steps})" in text
    assert f"(default {defaults.warmup})" in text
