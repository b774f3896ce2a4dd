"""Issue 19, the views of a large job: heatmaps, overlap distribution, straggler ranking, chosen lanes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import nbtoolkit as nbt
from nbtoolkit.trace import scale_views as views
from nbtoolkit.trace.scale_set import ScaleSet, write_scale_set
from nbtoolkit.trace.timeline_figure import timeline


@pytest.fixture(scope="module")
def scale_set(tmp_path_factory: pytest.TempPathFactory, gloo_trace_folder: Path) -> ScaleSet:
    # session-recorded gloo ranks (3 ProfilerSteps each): always available
    return write_scale_set(gloo_trace_folder, tmp_path_factory.mktemp("views") / "set", ranks=10, straggler=7)


@pytest.fixture(scope="module")
def summary(scale_set: ScaleSet) -> nbt.TraceSummary:
    return nbt.summarize_traces(scale_set.path, cache=True, workers=1)


def test_heatmap_has_one_row_per_rank_and_the_summary_numbers(summary: nbt.TraceSummary) -> None:
    fig = views.rank_step_heatmap(summary)
    z = np.asarray(fig.data[0].z, dtype=float)
    steps = sorted(summary.overlap_by_step["step"].unique())
    assert z.shape == (len(summary.ranks), len(steps))
    row = summary.overlap_by_step[summary.overlap_by_step["rank"] == 3].sort_values("step")
    np.testing.assert_allclose(z[3], row["exposed_comm_us"].to_numpy() / 1e3)
    times = np.asarray(views.rank_step_heatmap(summary, "step_time_ms").data[0].z, dtype=float)
    assert times.shape[0] == len(summary.ranks) and np.nanmin(times) > 0
    with pytest.raises(nbt.NbtUsageError, match="value must be one of"):
        views.rank_step_table(summary, "nonsense")  # type: ignore[arg-type]


def test_ranking_puts_the_injected_straggler_first_and_lanes_show_only_chosen_ranks(
    summary: nbt.TraceSummary, scale_set: ScaleSet
) -> None:
    bars = views.straggler_ranking(summary, top=3)
    assert bars.data[0].x[0] == str(scale_set.straggler)
    assert list(bars.data[0].marker.color).count("#E45756") == 3
    lanes = views.straggler_lanes(summary, top=1)
    shown = {int(label.split()[1]) for label in lanes.layout.yaxis.ticktext}  # "rank N ..." lanes
    assert scale_set.straggler in shown and len(shown) <= 2
    with pytest.raises(nbt.TraceError, match="pick a few"):
        timeline(summary.load_ranks([0]), ranks=[0, 999])


def test_overlap_distribution_counts_every_rank(summary: nbt.TraceSummary) -> None:
    fig = views.overlap_distribution(summary)
    assert len(fig.data[0].x) == len(summary.overlap["overlap_pct"].dropna()) == len(summary.ranks)


def test_figures_bundle_text_and_a_note_when_the_traces_are_elsewhere(
    summary: nbt.TraceSummary, scale_set: ScaleSet
) -> None:
    view = summary.figures(top=2)
    assert len(view.figures) == 5
    assert f"Slowest ranks: [{scale_set.straggler}" in repr(view)
    # a summary made on a cluster names files of the nodes: no lanes here, a note instead
    elsewhere = nbt.TraceSummary.from_records([summary.to_records()])
    for info in elsewhere.info.values():
        info.source = "/on/a/node/" + Path(info.source).name
    view = elsewhere.figures()
    assert len(view.figures) == 4 and "lanes of the slowest ranks not drawn" in repr(view)
