"""Issue 38: the rank heatmaps as one widget box, a click showing that rank and step under them.

No browser: the Tap stream's event stands for the click (tests/browser/test_rank_heatmap_in_jupyterlab.py
clicks the drawn heatmap in JupyterLab). On a 6-rank scale set made from the recorded gloo job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import nbtoolkit as nbt
from nbtoolkit.trace.scale_heatmaps import rank_heatmaps
from nbtoolkit.trace.scale_set import write_scale_set


@pytest.fixture(scope="module")
def folder_trace(tmp_path_factory: pytest.TempPathFactory, gloo_trace_folder: Path) -> nbt.Trace:
    made = write_scale_set(gloo_trace_folder, tmp_path_factory.mktemp("view") / "set", ranks=6, straggler=3)
    return nbt.load_trace(made.path, hold_events=False, workers=1)


def test_a_click_shows_that_rank_and_step_under_the_heatmaps(folder_trace: nbt.Trace) -> None:
    pytest.importorskip("holoviews", reason="HoloViews (pip install 'nbtoolkit[views]') is not installed")
    import ipywidgets

    chosen: list[tuple[int, int]] = []
    view = rank_heatmaps(folder_trace, on_select=lambda r, s: chosen.append((r, s)))
    assert isinstance(view, ipywidgets.VBox)
    assert list(view.children) == [view.heatmaps, view.cell_line] and view.timeline is None
    assert folder_trace.rank_reads == 0  # type: ignore[attr-defined]  # nothing read before a click
    ranks, steps = view.cells["ranks"], view.cells["steps"]
    view.streams[0].event(x=len(steps) - 1, y=4)  # last step column, rank row 4
    rank, step = ranks[4], steps[-1]
    assert view.selected == (rank, step) and chosen == [(rank, step)]
    assert f"rank {rank}, step {step}" in view.cell_line.value
    assert view.children[-1] is view.timeline and view.timeline.index.ranks == [rank]
    assert view.timeline.chosen_step == step
    # the timeline opens zoomed to that step: its ProfilerStep span (2% margin), not the whole trace
    (start, end), = [(a, b) for r, s, a, b in view.timeline.index.steps if (r, s) == (rank, step)]
    t0, t1 = view.timeline.window
    pad = (end - start) * 0.02
    assert t0 == pytest.approx(start - pad) and t1 == pytest.approx(end + pad)
    assert t1 - t0 < 0.9 * view.timeline.span[1]  # a step of several: narrower than the whole
    assert folder_trace.rank_reads == 1  # type: ignore[attr-defined]  # that rank only
    # Another cell, another image: the box shows the new one only.
    view.streams[2].event(x=0, y=1)
    assert view.selected == (ranks[1], steps[0]) and view.timeline.index.ranks == [ranks[1]]
    assert f"rank {ranks[1]}, step {steps[0]}" in view.cell_line.value
    (start, end), = [(a, b) for r, s, a, b in view.timeline.index.steps if (r, s) == (ranks[1], steps[0])]
    assert view.timeline.window[0] <= start < end <= view.timeline.window[1]
    assert len(view.children) == 3
    view.streams[1].event(x=99, y=99)  # outside the cells: nothing changes
    assert view.selected == (ranks[1], steps[0]) and len(chosen) == 2
    # Each image maps a click through its own columns (step time has a column for a step that
    # has no communication, and so no overlap column): its last column is its own last step.
    for stream, cells in zip(view.streams, view.hv_layout.cells_per_image, strict=True):
        stream.event(x=len(cells["steps"]) - 1, y=0)
        assert view.selected == (cells["ranks"][0], cells["steps"][-1])


def test_from_a_summary_the_line_says_there_are_no_events(folder_trace: nbt.Trace) -> None:
    pytest.importorskip("holoviews", reason="HoloViews (pip install 'nbtoolkit[views]') is not installed")
    view = rank_heatmaps(folder_trace.summary)  # type: ignore[attr-defined]
    view.streams[0].event(x=0, y=0)
    assert view.timeline is None and len(view.children) == 2
    assert "rank 0, step" in view.cell_line.value and "nbt.load_trace" in view.cell_line.value
