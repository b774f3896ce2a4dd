"""Issue 19, the local path: many rank traces summarized in parallel, equal to the full load and to HTA.

The rank sets are the project's own scale sets (``nbtoolkit.trace.scale_set``) built from the 8
real DLRM ranks (``param_dlrm_8rank``) and, where that artifact is missing, from the 2-rank
gloo job this session records (``gloo_trace_folder``), so the path is always exercised.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import TraceError
from nbtoolkit.trace.scale_set import ScaleSet, write_scale_set
from nbtoolkit.trace.summarize_rank import summarize_trace

RANKS = 12


@pytest.fixture(scope="module")
def dlrm_set(tmp_path_factory: pytest.TempPathFactory, real_data) -> ScaleSet:
    return write_scale_set(
        real_data("traces/param_dlrm_8rank"), tmp_path_factory.mktemp("dlrm") / "set", ranks=RANKS
    )


@pytest.fixture(scope="module")
def gloo_set(tmp_path_factory: pytest.TempPathFactory, gloo_trace_folder: Path) -> ScaleSet:
    # base rank 1 sleeps in every step (conftest): its copies 1, 3, 5 are slow already, and the
    # straggler made from one of them, 1.5x slower still, must stand out among them
    return write_scale_set(gloo_trace_folder, tmp_path_factory.mktemp("gloo") / "set", ranks=6, straggler=3)


def _assert_summary_equals_full_load(summary: nbt.TraceSummary, folder: Path) -> None:
    trace = nbt.load_trace(folder)
    full = nbt.comm_comp_overlap(trace)
    pd.testing.assert_frame_equal(summary.overlap, full, check_dtype=False)
    per_step = nbt.comm_comp_overlap(trace, by="iteration")
    pd.testing.assert_frame_equal(summary.overlap_by_step, per_step, check_dtype=False)
    ours, theirs = nbt.stragglers(summary), nbt.stragglers(trace)
    pd.testing.assert_frame_equal(ours.table, theirs.table, check_dtype=False)
    assert ours.slowest_rank == theirs.slowest_rank


@pytest.mark.parametrize("workers", [1, 2])
def test_summary_equals_full_load_and_finds_the_injected_straggler(dlrm_set: ScaleSet, workers: int) -> None:
    summary = nbt.summarize_traces(dlrm_set.path, workers=workers)
    assert summary.ranks == list(range(RANKS)) and summary.world_size == RANKS
    _assert_summary_equals_full_load(summary, dlrm_set.path)
    report = nbt.stragglers(summary)
    assert report.has_straggler and report.slowest_rank == dlrm_set.straggler
    assert not summary.failed and not summary.missing_ranks
    assert f"{RANKS} rank(s)" in repr(summary)


def test_session_recorded_gloo_ranks_scale_the_same_way(gloo_set: ScaleSet) -> None:
    summary = nbt.summarize_traces(gloo_set.path, workers=2)
    assert summary.ranks == list(range(6))
    assert set(summary.overlap["method"]) == {"cpu-gloo"}
    _assert_summary_equals_full_load(summary, gloo_set.path)
    assert nbt.stragglers(summary).slowest_rank == gloo_set.straggler


def test_overlap_of_every_rank_equals_hta_live(dlrm_set: ScaleSet) -> None:
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis (hta) is not installed")
    summary = nbt.summarize_traces(dlrm_set.path)
    theirs = hta.TraceAnalysis(trace_dir=str(dlrm_set.path)).get_comm_comp_overlap(visualize=False)
    theirs = theirs.set_index("rank")["comp_comm_overlap_pctg"].sort_index()
    ours = summary.overlap.set_index("rank")["overlap_pct"]
    assert list(ours.index) == list(theirs.index)
    np.testing.assert_allclose(ours.to_numpy(), theirs.to_numpy(), atol=0.1)


def test_the_scale_set_is_deterministic(dlrm_set: ScaleSet, tmp_path: Path, real_data) -> None:
    again = write_scale_set(real_data("traces/param_dlrm_8rank"), tmp_path / "again", ranks=RANKS)
    for name in ("rank00000.json", f"rank{dlrm_set.straggler:05d}.json"):
        assert (again.path / name).read_bytes() == (dlrm_set.path / name).read_bytes()
    assert ScaleSet.read(dlrm_set.path).straggler == dlrm_set.straggler


def test_a_second_summary_reads_the_cache_not_the_traces(
    dlrm_set: ScaleSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbtoolkit.trace.kineto as kineto

    first = nbt.summarize_traces(dlrm_set.path, cache_dir=tmp_path / "cache", workers=1)

    def no_parsing(path: Path) -> None:
        raise AssertionError(f"{path} parsed again despite the cache")

    monkeypatch.setattr(kineto, "load_rank_file", no_parsing)
    second = nbt.summarize_traces(dlrm_set.path, cache_dir=tmp_path / "cache", workers=1)
    pd.testing.assert_frame_equal(first.overlap, second.overlap)
    lanes = second.load_ranks([dlrm_set.straggler])  # events from the Parquet cache
    assert lanes.ranks == [dlrm_set.straggler] and len(lanes.events[dlrm_set.straggler]) > 1000
    # a changed file is read again
    changed = dlrm_set.path / "rank00003.json"
    os.utime(changed, ns=(changed.stat().st_atime_ns, changed.stat().st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match=r"rank00003\.json parsed again"):
        nbt.summarize_traces(dlrm_set.path, cache_dir=tmp_path / "cache", workers=1)


def test_one_corrupt_rank_is_named_and_skipped_missing_ranks_listed(tmp_path: Path, real_data) -> None:
    made = write_scale_set(
        real_data("traces/param_dlrm_8rank"), tmp_path / "bad", ranks=16, corrupt=[5], missing=[11, 12]
    )
    (made.path / "notes.json").write_text('{"not": "a trace"}')
    summary = nbt.summarize_traces(made.path, workers=2)
    assert summary.ranks == [r for r in range(16) if r not in (5, 11, 12)]
    assert list(summary.failed) == [str(made.path / "rank00005.json")]
    assert "truncated" in next(iter(summary.failed.values()))
    assert summary.missing_ranks == [11, 12]
    text = repr(summary)
    assert "skipped rank00005.json" in text and "missing ranks" in text and "notes.json" in text
    assert nbt.stragglers(summary).slowest_rank == made.straggler  # nothing else lost
    with pytest.raises(TraceError, match=r"rank00005\.json.*truncated"):
        nbt.summarize_traces(made.path, on_error="raise", workers=1)


def test_job_wide_step_labels_reach_a_rank_read_alone(real_data) -> None:
    trace = nbt.load_trace(real_data("traces/param_dlrm_8rank"))
    alone = nbt.Trace(events={0: trace.events[0]}, info={0: trace.info[0]}, collectives=trace.collectives)
    # another rank of the job labels a second step: HTA's rule then leaves the last step out
    other = trace.events[1].assign(name=trace.events[1]["name"].cat.add_categories(["ProfilerStep#11"]))
    job = nbt.Trace(events={0: trace.events[0], 1: other}, info=trace.info, collectives=trace.collectives)
    expected = nbt.comm_comp_overlap(job).iloc[[0]]
    told = summarize_trace(alone, step_labels=["ProfilerStep#11"]).overlap
    pd.testing.assert_frame_equal(told, expected.reset_index(drop=True))
    assert not np.isclose(summarize_trace(alone).overlap["comm_time_us"][0], told["comm_time_us"][0])


def test_comm_comp_overlap_takes_a_summary(dlrm_set: ScaleSet) -> None:
    summary = nbt.summarize_traces(dlrm_set.path, workers=1)
    pd.testing.assert_frame_equal(nbt.comm_comp_overlap(summary), summary.overlap)
    pd.testing.assert_frame_equal(nbt.comm_comp_overlap(summary, by="iteration"), summary.overlap_by_step)
    with pytest.raises(nbt.NbtUsageError, match="load_ranks"):
        nbt.comm_comp_overlap(summary, by="collective")
    with pytest.raises(nbt.NbtUsageError, match="include_last_step=False"):
        nbt.comm_comp_overlap(summary, include_last_step=True)


def test_bad_arguments_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file or folder"):
        nbt.summarize_traces(tmp_path / "absent")
    with pytest.raises(TraceError, match=r"holds no \.json"):
        nbt.summarize_traces(tmp_path)
    with pytest.raises(nbt.NbtUsageError, match="on_error"):
        nbt.summarize_traces([tmp_path / "x.json"], on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(nbt.NbtUsageError, match="workers"):
        nbt.summarize_traces([tmp_path / "x.json"], workers=0)
