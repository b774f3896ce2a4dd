"""Issue 38: ranks x iterations heatmaps with HoloViews (the ``views`` extra), linked to the timeline.

On a scale set made from the 2-rank gloo job this session records. Skips naming HoloViews where
the extra is not installed (the message test runs without it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import nbtoolkit as nbt
from nbtoolkit.trace.scale_heatmaps import cell_timeline, heatmap_layout, rank_heatmaps
from nbtoolkit.trace.scale_set import write_scale_set
from nbtoolkit.trace.scale_views import rank_step_table


@pytest.fixture(scope="module")
def folder_trace(tmp_path_factory: pytest.TempPathFactory, gloo_trace_folder: Path) -> nbt.Trace:
    made = write_scale_set(gloo_trace_folder, tmp_path_factory.mktemp("heat") / "set", ranks=6, straggler=3)
    return nbt.load_trace(made.path, hold_events=False, workers=1)


def test_each_heatmap_holds_the_summary_numbers_and_a_click_opens_that_rank(folder_trace: nbt.Trace) -> None:
    hv = pytest.importorskip(
        "holoviews", reason="HoloViews (pip install 'nbtoolkit[views]') is not installed"
    )
    chosen: list[tuple[int, int]] = []
    layout = heatmap_layout(folder_trace, on_select=lambda r, s: chosen.append((r, s)))
    images = list(layout)
    assert len(images) == 3 and all(isinstance(i, hv.Image) for i in images)
    summary = folder_trace.summary  # type: ignore[attr-defined]
    for image, value in zip(images, ("step_time_ms", "exposed_comm_ms", "overlap_pct"), strict=True):
        expected = rank_step_table(summary, value).to_numpy()
        drawn = image.dimension_values(2, flat=False)  # rows by y, bottom up: row i is ranks[i]
        np.testing.assert_allclose(drawn, expected, equal_nan=True)
    hv.render(layout, backend="bokeh")  # a bokeh document builds
    plot = hv.render(images[0], backend="bokeh")  # its axes name the steps and ranks, not cell positions
    first = rank_step_table(summary, "step_time_ms")
    steps, ranks = [int(step) for step in first.columns], [int(rank) for rank in first.index]
    assert plot.xaxis[0].major_label_overrides == {j: str(step) for j, step in enumerate(steps)}
    assert set(plot.yaxis[0].major_label_overrides.values()) <= {str(rank) for rank in ranks}
    assert plot.yaxis[0].major_label_overrides[0] == str(ranks[0])
    layout.streams[1].event(x=1, y=3)  # click: step column 1, rank row 3
    assert chosen == [(layout.cells["ranks"][3], layout.cells["steps"][1])]
    assert folder_trace.rank_reads == 0  # type: ignore[attr-defined]
    shown: list[object] = []
    widget = cell_timeline(folder_trace, shown)(3, layout.cells["steps"][0])
    assert shown == [widget] and widget.index.ranks == [3]
    assert folder_trace.rank_reads == 1  # type: ignore[attr-defined]  # that rank only


def test_without_holoviews_the_error_names_the_extra(
    folder_trace: nbt.Trace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "holoviews", None)  # import holoviews now raises ImportError
    with pytest.raises(nbt.NbtUsageError, match=r"nbtoolkit\[views\]"):
        rank_heatmaps(folder_trace)
