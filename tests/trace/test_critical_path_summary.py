"""The per-rank critical path in the summaries of a many-rank load (``critical_path=True``).

On the 8 real DLRM ranks (param_dlrm_8rank): computed in the worker processes, it equals
``nbt.critical_path_by_rank`` of the held trace, and each rank's path length equals
HolisticTraceAnalysis 0.5's per-rank critical path (run live) within 1 %.

HTA 0.5 was written for pandas 2 (see tests/trace/test_critical_path_hta.py): the ``hta``
fixture drops the redundant ``axis`` of its ``DataFrame.drop`` calls for the test's duration.
"""

from __future__ import annotations

import pandas as pd
import pytest

import nbtoolkit as nbt

pytestmark = [
    pytest.mark.filterwarnings("ignore::Warning:hta"),
    pytest.mark.filterwarnings("ignore:The inplace keyword"),
]


@pytest.fixture(scope="module")
def dlrm_paths():
    from nbtoolkit.core.datasets import locate_data
    from nbtoolkit.core.errors import DataUnavailableError

    try:  # (module scope: the real_data fixture is per test)
        folder = locate_data("traces/param_dlrm_8rank")
    except DataUnavailableError as exc:
        pytest.skip(f"needs the real traces/param_dlrm_8rank (NBT_DATA): {exc}")
    held = nbt.load_trace(folder)
    summarized = nbt.load_trace(folder, hold_events=False, workers=2, critical_path=True)
    return folder, held, summarized


def test_summary_paths_equal_the_held_traces(dlrm_paths):
    _, held, summarized = dlrm_paths
    assert type(summarized).__name__ == "RankFolderTrace"
    ours = nbt.critical_path_by_rank(summarized)
    assert summarized.rank_reads == 0  # answered from the summaries: no rank read again
    expected = nbt.critical_path_by_rank(held)
    assert list(ours["rank"]) == list(range(8))
    pd.testing.assert_frame_equal(
        ours[sorted(ours.columns)], expected[sorted(expected.columns)], check_dtype=False, atol=1e-9
    )


def test_summary_paths_equal_htas_per_rank_paths(dlrm_paths, hta):
    folder, held, summarized = dlrm_paths
    ours = nbt.critical_path_by_rank(summarized).set_index("rank")
    first_step = int(held.steps["step"].min())
    assert set(ours["step"]) == {first_step}  # the first ProfilerStep: HTA's instance 0
    analysis = hta(trace_dir=str(folder))
    for rank in range(8):
        graph, ok = analysis.critical_path_analysis(rank=rank, annotation="ProfilerStep", instance_id=0)
        assert ok
        theirs = float(graph.get_critical_path_breakdown()["duration"].sum())
        # equal on ranks 0, 2, 6, 7 to 2 µs; ranks 1, 3, 4, 5 differ by ~40 µs of ~6-9 ms
        assert ours.loc[rank, "length_us"] == pytest.approx(theirs, rel=0.01), rank


def test_summary_paths_equal_the_held_traces_of_the_recorded_gloo_job(gloo_trace_folder):
    """The same equality on data this session records (a clone without the DLRM ranks runs it too)."""
    held = nbt.load_trace(gloo_trace_folder)
    summarized = nbt.load_trace(gloo_trace_folder, hold_events=False, workers=2, critical_path=True)
    ours = nbt.critical_path_by_rank(summarized)
    assert summarized.rank_reads == 0
    expected = nbt.critical_path_by_rank(held)
    assert list(ours["rank"]) == [0, 1] and (ours["length_us"] > 0).all()
    pd.testing.assert_frame_equal(
        ours[sorted(ours.columns)], expected[sorted(expected.columns)], check_dtype=False, atol=1e-9
    )
