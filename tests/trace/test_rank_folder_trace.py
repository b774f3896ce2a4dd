"""Issue 38: one API at every scale, linear in ranks.

``nbt.load_trace(folder)`` of many ranks gives a RankFolderTrace (per-rank summaries made in
worker processes, events read per rank when asked for); its overlap, temporal breakdown,
stragglers and step times equal those of the Trace that holds every event. The sets are the
project's scale sets, made from the 2-rank gloo job this session records and, where the
artifact is present, from the 8 real DLRM ranks.

Linear work is asserted by counting, not timing: how many rank frames an analysis reads at N
and at 2N ranks (quadratic work, as ``count_step_labels`` looping over every rank per rank
did, reads four times as many).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.trace.rank_folder_trace import RankFolderTrace
from nbtoolkit.trace.scale_set import ScaleSet, write_scale_set
from nbtoolkit.trace.trace import Trace


@pytest.fixture(scope="module")
def gloo_set(tmp_path_factory: pytest.TempPathFactory, gloo_trace_folder: Path) -> ScaleSet:
    return write_scale_set(gloo_trace_folder, tmp_path_factory.mktemp("gloo") / "set", ranks=6, straggler=3)


@pytest.fixture(scope="module")
def dlrm_set(tmp_path_factory: pytest.TempPathFactory, real_data) -> ScaleSet:
    return write_scale_set(
        real_data("traces/param_dlrm_8rank"), tmp_path_factory.mktemp("dlrm") / "s", ranks=10
    )


def _assert_same_answers(lazy: Trace, full: Trace) -> None:
    assert isinstance(lazy, RankFolderTrace) and not isinstance(full, RankFolderTrace)
    for by in ("rank", "iteration", "collective"):
        pd.testing.assert_frame_equal(
            nbt.comm_comp_overlap(lazy, by=by), nbt.comm_comp_overlap(full, by=by), check_dtype=False
        )
    pd.testing.assert_frame_equal(
        nbt.temporal_breakdown(lazy), nbt.temporal_breakdown(full), check_dtype=False
    )
    ours, theirs = nbt.stragglers(lazy), nbt.stragglers(full)
    pd.testing.assert_frame_equal(ours.table, theirs.table, check_dtype=False)
    assert ours.slowest_rank == theirs.slowest_rank
    pd.testing.assert_frame_equal(lazy.step_times_ms(), full.step_times_ms())
    # an analysis the summaries do not answer reads the events, one rank at a time
    pd.testing.assert_frame_equal(
        nbt.comm_comp_overlap(lazy, include_last_step=True),
        nbt.comm_comp_overlap(full, include_last_step=True),
    )


def test_a_folder_not_held_answers_like_the_held_one_on_session_gloo_ranks(gloo_set: ScaleSet) -> None:
    lazy = nbt.load_trace(gloo_set.path, hold_events=False, workers=2)
    full = nbt.load_trace(gloo_set.path, hold_events=True)
    assert lazy.ranks == full.ranks == list(range(6))
    reads_before = lazy.rank_reads  # type: ignore[attr-defined]
    assert reads_before == 0  # the summaries answered nothing yet needed events
    pd.testing.assert_frame_equal(nbt.comm_comp_overlap(lazy), nbt.comm_comp_overlap(full), check_dtype=False)
    assert lazy.rank_reads == 0  # type: ignore[attr-defined]
    _assert_same_answers(lazy, full)
    assert nbt.stragglers(lazy).slowest_rank == gloo_set.straggler
    pd.testing.assert_frame_equal(lazy.events[2], full.events[2])
    assert f"{len(full.ranks)} rank(s)" in repr(lazy) and "read when asked" in repr(lazy)


def test_a_folder_not_held_answers_like_the_held_one_on_dlrm_ranks(dlrm_set: ScaleSet) -> None:
    _assert_same_answers(
        nbt.load_trace(dlrm_set.path, hold_events=False, workers=2), nbt.load_trace(dlrm_set.path)
    )


def test_many_rank_files_are_summarized_by_default_and_overlap_magic_goes_the_same_way(
    tmp_path: Path, gloo_trace_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbtoolkit.trace import load
    from nbtoolkit.trace.overlap_report import OverlapReport
    from nbtoolkit.trace.views import TraceReport

    made = write_scale_set(gloo_trace_folder, tmp_path / "set", ranks=4)
    assert not isinstance(nbt.load_trace(made.path), RankFolderTrace)  # a few ranks: held
    monkeypatch.setattr(load, "MANY_RANKS", 4)
    loaded = nbt.load_trace(made.path, workers=1)
    assert isinstance(loaded, RankFolderTrace)
    report = OverlapReport.of(str(made.path))  # what %nbt overlap DIR runs
    pd.testing.assert_frame_equal(report.table, nbt.comm_comp_overlap(loaded))
    shown = TraceReport.of(loaded)  # what %nbt trace DIR shows: the summaries' answers, no event read
    pd.testing.assert_frame_equal(shown.temporal, nbt.temporal_breakdown(loaded))
    assert shown.kernel_types is None and loaded.rank_reads == 0  # type: ignore[attr-defined]
    with pytest.raises(nbt.NbtUsageError, match="hold_events=True"):
        nbt.load_trace(made.path, max_bytes=10**9)


class _CountingFrames(Mapping[int, pd.DataFrame]):
    """A Trace's events, counting every frame handed out."""

    def __init__(self, frames: dict[int, pd.DataFrame]) -> None:
        self.frames, self.handed = frames, 0

    def __getitem__(self, rank: int) -> pd.DataFrame:
        self.handed += 1
        return self.frames[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self.frames)

    def __len__(self) -> int:
        return len(self.frames)


def _frames_read(base: Trace, ranks: int, analysis) -> int:  # type: ignore[no-untyped-def]
    rank0 = base.ranks[0]
    counting = _CountingFrames(dict.fromkeys(range(ranks), base.events[rank0]))
    trace = Trace(
        events=counting,  # type: ignore[arg-type]
        info=dict.fromkeys(range(ranks), base.info[rank0]),
        collectives=dict.fromkeys(range(ranks), base.collectives[rank0]),
    )
    analysis(trace)
    return counting.handed


@pytest.mark.parametrize(
    "analysis",
    [nbt.comm_comp_overlap, nbt.temporal_breakdown, nbt.stragglers, nbt.kernel_breakdown, nbt.idle_breakdown],
    ids=lambda f: f.__name__,
)
def test_every_multi_rank_analysis_reads_each_rank_a_fixed_number_of_times(
    gloo_trace_folder: Path, analysis
) -> None:  # type: ignore[no-untyped-def]
    base = nbt.load_trace(gloo_trace_folder)
    small, large = _frames_read(base, 8, analysis), _frames_read(base, 16, analysis)
    assert small > 0
    # linear: twice the ranks, twice the reads (quadratic work would read four times as many)
    assert large <= 2 * small + 2, (small, large)


def test_a_trace_made_from_summaries_reads_ranks_through_the_reader_it_was_given(gloo_set: ScaleSet) -> None:
    # what cluster.load_trace passes: a reader that fetches a rank's events on its node
    from nbtoolkit.trace.rank_folder_trace import from_summary
    from nbtoolkit.trace.summary_ranks import load_summary_ranks

    summary = nbt.summarize_traces(gloo_set.folder, workers=1)
    asked: list[list[int]] = []

    def read_ranks(ranks: list[int]) -> Trace:
        asked.append(list(ranks))
        return load_summary_ranks(summary, ranks)

    trace = from_summary(summary, read_ranks=read_ranks)
    assert nbt.stragglers(trace).slowest_rank == gloo_set.straggler and asked == []
    held = nbt.load_trace(gloo_set.folder, hold_events=True)
    assert len(trace.events[3]) == len(held.events[3]) > 0
    assert asked == [[3]]
