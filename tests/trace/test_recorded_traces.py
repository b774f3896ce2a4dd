"""Every trace reader and analysis on traces recorded in this session (tests/trace/conftest.py).

Expected numbers are computed here from the raw JSON with the ``json`` module, following the
definitions in the analyses' docstrings (whole-µs times, last ProfilerStep left out, union of
intervals), never copied from nbtoolkit's output.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
import statistics
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.trace.overlap import COMM_PREFIXES
from nbtoolkit.trace.overlap_report import OverlapReport
from nbtoolkit.trace.timeline_figure import timeline
from nbtoolkit.trace.views import TraceReport, overlap_chart

from .conftest import PROFILED_STEPS, STRAGGLER_RANK, STRAGGLER_SLEEP_S

WAITING_RANK = 1 - STRAGGLER_RANK
ANALYSED_STEPS = PROFILED_STEPS - 1  # the last ProfilerStep is left out by default (HTA's rule)

slow = pytest.mark.slow  # the recordings spawn processes
distributed = pytest.mark.distributed


# ------------------------------------------------------------------ raw JSON, read independently
def raw_host_events(path: Path) -> list[dict[str, Any]]:
    """The complete host events of a trace file as the json module reads them (no profiler span)."""
    document = json.loads(path.read_text())
    return [
        event
        for event in document["traceEvents"]
        if event.get("ph") == "X"
        and event.get("cat") not in ("Trace", "", None)
        and "stream" not in event.get("args", {})
    ]


def whole_us(event: dict[str, Any]) -> tuple[float, float]:
    """HTA's whole-µs interval of an event: start rounded up, end rounded down (never before start)."""
    start = math.ceil(event["ts"])
    return start, max(math.floor(event["ts"] + event["dur"]), start)


def step_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        (e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: int(e["name"][13:])
    )


def analysed(events: list[dict[str, Any]], *, include_last_step: bool = False) -> list[dict[str, Any]]:
    """Host events of the analysed steps: those starting before the last step (or within it)."""
    steps = [whole_us(e) for e in step_events(events)]
    if include_last_step:
        last_end = max(end for _, end in steps)
        return [e for e in events if whole_us(e)[0] <= last_end]
    last_start = max(start for start, _ in steps)
    return [e for e in events if whole_us(e)[0] < last_start]


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def gloo_calls(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["name"].startswith("gloo:")]


def rank_file(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.json"


# ------------------------------------------------------------------------------ loaded traces
@pytest.fixture(scope="module")
def cpu_trace(cpu_trace_file: Path) -> nbt.Trace:
    return nbt.load_trace(cpu_trace_file)


@pytest.fixture(scope="module")
def gloo_trace(gloo_trace_folder: Path) -> nbt.Trace:
    return nbt.load_trace(gloo_trace_folder)


# --------------------------------------------------------------------------------- load_trace
@slow
def test_single_file_loads_as_rank_zero_cpu_with_its_steps(
    cpu_trace_file: Path, cpu_trace: nbt.Trace
) -> None:
    """A profile without torch.distributed: rank 0 with a note, cpu, no world, every ProfilerStep."""
    events = raw_host_events(cpu_trace_file)
    assert cpu_trace.ranks == [0]
    info = cpu_trace.info[0]
    assert info.device_type == "cpu" and cpu_trace.device_type == "cpu"
    assert not cpu_trace.has_gpu_kernels
    assert info.world_size is None and info.backend is None
    assert any("rank unknown" in note for note in info.notes)
    assert info.trace_format.startswith("kineto schema")
    assert len(cpu_trace.events[0]) == len(events)
    steps = step_events(events)
    assert (
        list(cpu_trace.steps["step"]) == list(range(PROFILED_STEPS)) == [int(e["name"][13:]) for e in steps]
    )
    assert list(cpu_trace.steps["dur"]) == [e["dur"] for e in steps]
    ops = {e["name"] for e in events if e["cat"] == "cpu_op"}
    assert {"aten::addmm", "aten::mm"} <= ops
    assert set(cpu_trace.top_operators(5)["name"]) <= ops


@slow
def test_profile_returns_what_it_wrote_to_trace_path(cpu_trace_recording: tuple[Path, Path]) -> None:
    """The Trace nbt.profile returned (saved by the recording process) has the events of its file."""
    trace_file, saved = cpu_trace_recording
    returned = nbt.Trace.load(saved)
    from_file = nbt.load_trace(trace_file)
    pd.testing.assert_frame_equal(returned.events[0], from_file.events[0])
    assert returned.info[0].source == str(trace_file)
    assert not any("file name" in note for note in returned.info[0].notes)  # profile() knows why


@slow
@distributed
def test_folder_of_two_gloo_ranks(gloo_trace_folder: Path, gloo_trace: nbt.Trace) -> None:
    """Ranks, world size, backend and process group come from each file's distributedInfo."""
    assert gloo_trace.ranks == [0, 1]
    assert gloo_trace.device_type == "cpu"
    for rank in (0, 1):
        document = json.loads(rank_file(gloo_trace_folder, rank).read_text())
        info = gloo_trace.info[rank]
        assert info.rank == document["distributedInfo"]["rank"] == rank
        assert info.world_size == 2 and info.backend == "gloo" and info.device_type == "cpu"
        assert [g["ranks"] for g in info.process_groups] == [[0, 1]]
        assert info.base_time_ns == document["baseTimeNanoseconds"]
        assert len(gloo_trace.events[rank]) == len(raw_host_events(rank_file(gloo_trace_folder, rank)))
        rank_steps = gloo_trace.steps[gloo_trace.steps["rank"] == rank]
        assert list(rank_steps["step"]) == list(range(PROFILED_STEPS))
    assert any("worker.py.txt" in note for note in gloo_trace.notes)
    times = gloo_trace.step_times_ms()
    assert list(times.columns) == ["rank 0", "rank 1"] and len(times) == PROFILED_STEPS


@slow
@distributed
def test_per_rank_files_combine_into_the_folder_trace(gloo_trace_folder: Path, gloo_trace: nbt.Trace) -> None:
    """Each rank's file loads alone with its own rank; Trace.combine of them equals the folder."""
    singles = [nbt.load_trace(rank_file(gloo_trace_folder, rank)) for rank in (1, 0)]
    assert [s.ranks for s in singles] == [[1], [0]]
    combined = nbt.Trace.combine(singles)
    assert combined.ranks == [0, 1]
    for rank in (0, 1):
        pd.testing.assert_frame_equal(combined.events[rank], gloo_trace.events[rank])
    pd.testing.assert_frame_equal(nbt.comm_comp_overlap(combined), nbt.comm_comp_overlap(gloo_trace))


@slow
@distributed
def test_save_load_round_trip_keeps_events_metadata_and_analyses(
    gloo_trace: nbt.Trace, tmp_path: Path
) -> None:
    """Trace.save then Trace.load gives the same frames, rank info, summary and analysis results."""
    again = nbt.Trace.load(gloo_trace.save(tmp_path / "saved"))
    assert again.ranks == gloo_trace.ranks
    for rank in gloo_trace.ranks:
        pd.testing.assert_frame_equal(again.events[rank], gloo_trace.events[rank])
        assert again.info[rank] == gloo_trace.info[rank]
    assert again.notes == gloo_trace.notes
    assert repr(again) == repr(gloo_trace)
    pd.testing.assert_frame_equal(nbt.comm_comp_overlap(again), nbt.comm_comp_overlap(gloo_trace))
    pd.testing.assert_frame_equal(nbt.temporal_breakdown(again), nbt.temporal_breakdown(gloo_trace))


@slow
@distributed
@pytest.mark.parametrize("compressed", [False, True], ids=["json", "json.gz"])
def test_chunked_streaming_equals_whole_document_decoding(
    gloo_trace_folder: Path,
    cpu_trace_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    compressed: bool,
) -> None:
    """Decoding in many small chunks (plain or gzip-inflated) gives what whole-document decoding gives."""
    from nbtoolkit.trace import _kineto_json, kineto

    chunk_bytes = 8 * 1024
    folder = tmp_path / "traces"
    folder.mkdir()
    sources = [rank_file(gloo_trace_folder, 0), rank_file(gloo_trace_folder, 1)]
    for source in sources:
        if compressed:
            with source.open("rb") as raw, gzip.open(folder / f"{source.name}.gz", "wb") as packed:
                shutil.copyfileobj(raw, packed)
        else:
            shutil.copy(source, folder / source.name)
    single = folder / "single" / cpu_trace_file.name
    single.parent.mkdir()
    shutil.copy(cpu_trace_file, single)
    assert min(s.stat().st_size for s in [*sources, cpu_trace_file]) > 8 * chunk_bytes  # many chunks each

    def must_stream(file: Path) -> bytes:
        raise AssertionError(f"{file} fell back to whole-document decoding")

    with monkeypatch.context() as patch:
        patch.setattr(_kineto_json, "CHUNK_BYTES", chunk_bytes)
        patch.setattr(kineto, "read_bytes", must_stream)
        streamed = [nbt.load_trace(folder), nbt.load_trace(single)]

    def no_streaming(file: Path, columns: Any) -> Any:
        raise _kineto_json.StreamingFallback

    monkeypatch.setattr(kineto, "stream_file", no_streaming)
    whole = [nbt.load_trace(folder), nbt.load_trace(single)]
    for a, b in zip(streamed, whole, strict=True):
        assert a.ranks == b.ranks
        for rank in b.ranks:
            pd.testing.assert_frame_equal(a.events[rank], b.events[rank])
            pd.testing.assert_frame_equal(a.collectives[rank], b.collectives[rank])
            assert a.info[rank] == b.info[rank]
    assert streamed[0].ranks == [0, 1]


# ----------------------------------------------------------------------- temporal breakdown
@slow
@distributed
def test_temporal_breakdown_parts_add_up_to_the_span(
    gloo_trace_folder: Path, gloo_trace: nbt.Trace, cpu_trace: nbt.Trace
) -> None:
    """idle + compute + non-compute = span, percentages sum to 100, span = first to last host op."""
    for trace in (gloo_trace, cpu_trace):
        table = nbt.temporal_breakdown(trace)
        assert list(table["rank"]) == trace.ranks
        total = table["idle_us"] + table["compute_us"] + table["non_compute_us"]
        assert (abs(total - table["span_us"]) < 1e-6).all()
        pct = table["idle_pct"] + table["compute_pct"] + table["non_compute_pct"]
        assert (abs(pct - 100) < 1e-9).all()
        assert (table[["idle_us", "compute_us", "non_compute_us"]] >= 0).all().all()
        assert (table["compute_us"] > 0).all()
    for rank in (0, 1):
        kept = analysed(raw_host_events(rank_file(gloo_trace_folder, rank)))
        ops = [whole_us(e) for e in kept if e["cat"] == "cpu_op" or e["name"].startswith(COMM_PREFIXES)]
        span = max(end for _, end in ops) - min(start for start, _ in ops)
        row = nbt.temporal_breakdown(gloo_trace).set_index("rank").loc[rank]
        assert row["span_us"] == pytest.approx(span, abs=1e-6)


@slow
@distributed
def test_temporal_breakdown_puts_the_sleep_in_idle_and_the_wait_in_communication(
    gloo_trace: nbt.Trace,
) -> None:
    """The sleeping rank is idle (nothing runs); the rank waiting for it sits in the all_reduce."""
    table = nbt.temporal_breakdown(gloo_trace).set_index("rank")
    sleep_us = STRAGGLER_SLEEP_S * 1e6 * ANALYSED_STEPS
    assert table.loc[STRAGGLER_RANK, "idle_us"] > 0.8 * sleep_us
    assert table.loc[WAITING_RANK, "non_compute_us"] > 0.5 * sleep_us
    assert table.loc[STRAGGLER_RANK, "idle_us"] > table.loc[WAITING_RANK, "idle_us"]
    assert table.loc[WAITING_RANK, "non_compute_us"] > table.loc[STRAGGLER_RANK, "non_compute_us"]


@slow
def test_single_rank_without_collectives_has_no_non_compute_time(cpu_trace: nbt.Trace) -> None:
    """No gloo call: communication is zero, so non-compute is zero and the span is compute + idle."""
    row = nbt.temporal_breakdown(cpu_trace).iloc[0]
    assert row["non_compute_us"] == 0
    assert row["compute_us"] + row["idle_us"] == pytest.approx(row["span_us"])
    overlap = nbt.comm_comp_overlap(cpu_trace)
    assert list(overlap["rank"]) == [0] and overlap["method"].iloc[0] == "cpu-gloo"
    assert overlap["comm_time_us"].iloc[0] == 0 and math.isnan(overlap["overlap_pct"].iloc[0])
    assert nbt.comm_comp_overlap(cpu_trace, by="collective").empty


# --------------------------------------------------------------------------------- overlap
@slow
@distributed
@pytest.mark.parametrize("include_last_step", [False, True])
def test_comm_time_is_the_union_of_the_gloo_calls_in_the_raw_json(
    gloo_trace_folder: Path, gloo_trace: nbt.Trace, include_last_step: bool
) -> None:
    """comm_time_us = union of the whole-µs intervals of the gloo:* host events of the analysed steps."""
    table = nbt.comm_comp_overlap(gloo_trace, include_last_step=include_last_step).set_index("rank")
    assert (table["method"] == "cpu-gloo").all()
    for rank in (0, 1):
        events = raw_host_events(rank_file(gloo_trace_folder, rank))
        calls = gloo_calls(analysed(events, include_last_step=include_last_step))
        assert {e["name"] for e in calls} >= {"gloo:all_reduce"}
        expected = union_length([whole_us(e) for e in calls])
        row = table.loc[rank]
        assert row["comm_time_us"] == pytest.approx(expected, abs=1e-6)
        assert row["overlap_time_us"] + row["exposed_comm_us"] == pytest.approx(row["comm_time_us"])
        assert 0 <= row["overlap_time_us"] <= row["comm_time_us"]
        assert row["overlap_pct"] == pytest.approx(100 * row["overlap_time_us"] / row["comm_time_us"])
    if not include_last_step:  # the last step's calls are left out
        everything = nbt.comm_comp_overlap(gloo_trace, include_last_step=True).set_index("rank")
        assert (everything["comm_time_us"] > table["comm_time_us"]).all()


@slow
@distributed
def test_overlap_by_collective_has_one_row_per_gloo_call_and_rows_add_up(
    gloo_trace_folder: Path, gloo_trace: nbt.Trace
) -> None:
    """One row per gloo call of the analysed steps, with its duration; hidden + exposed = duration."""
    calls = nbt.comm_comp_overlap(gloo_trace, by="collective")
    per_rank = nbt.comm_comp_overlap(gloo_trace).set_index("rank")
    for rank in (0, 1):
        raw = gloo_calls(analysed(raw_host_events(rank_file(gloo_trace_folder, rank))))
        rows = calls[calls["rank"] == rank]
        assert sorted(rows["name"]) == sorted(e["name"] for e in raw)
        assert set(rows["collective"]) == {e["name"].split(":", 1)[1] for e in raw}
        durations = [end - start for start, end in (whole_us(e) for e in raw)]
        assert rows["dur_us"].sum() == pytest.approx(sum(durations), abs=1e-6)
        assert sorted(rows["dur_us"]) == pytest.approx(sorted(durations), abs=1e-6)
        assert ((rows["overlap_time_us"] + rows["exposed_comm_us"] - rows["dur_us"]).abs() < 1e-6).all()
        # calls run concurrently on gloo's worker threads: their sum bounds the union from above
        assert rows["dur_us"].sum() >= per_rank.loc[rank, "comm_time_us"] - 1e-6
        assert rows["overlap_time_us"].sum() >= per_rank.loc[rank, "overlap_time_us"] - 1e-6


@slow
@distributed
def test_overlap_by_iteration_covers_the_analysed_steps(gloo_trace: nbt.Trace) -> None:
    """by='iteration': one row per rank and analysed step (the last step only when asked)."""
    table = nbt.comm_comp_overlap(gloo_trace, by="iteration")
    for rank in (0, 1):
        assert list(table.loc[table["rank"] == rank, "step"]) == list(range(ANALYSED_STEPS))
    with_last = nbt.comm_comp_overlap(gloo_trace, by="iteration", include_last_step=True)
    assert list(with_last.loc[with_last["rank"] == 0, "step"]) == list(range(PROFILED_STEPS))
    assert (table["comm_time_us"] > 0).all()
    with pytest.raises(nbt.NbtUsageError, match="by must be"):
        nbt.comm_comp_overlap(gloo_trace, by="stream")  # type: ignore[arg-type]


# ------------------------------------------------------------------- kernel and idle breakdowns
@slow
@distributed
def test_kernel_and_idle_breakdowns_are_empty_on_cpu_traces(
    gloo_trace: nbt.Trace, cpu_trace: nbt.Trace
) -> None:
    """Both are defined on device kernels; a CPU trace has none, so they are empty and say so."""
    for trace in (gloo_trace, cpu_trace):
        kernels = nbt.kernel_breakdown(trace)
        assert kernels.by_type.empty and kernels.by_kernel.empty
        assert "no device kernels" in repr(kernels) and "no device kernels" in kernels._repr_html_()
        idle = nbt.idle_breakdown(trace)
        assert idle.empty
        assert list(idle.columns) == ["rank", "stream", "idle_category", "idle_us", "idle_ratio"]
        assert trace.top_kernels().empty


# ---------------------------------------------------------------------------------- stragglers
@slow
@distributed
def test_the_sleeping_rank_is_the_straggler(gloo_trace_folder: Path, gloo_trace: nbt.Trace) -> None:
    """The rank that sleeps in every step works longest; the other waits for it in the all_reduce."""
    report = nbt.stragglers(gloo_trace)
    table = report.table.set_index("rank")
    assert report.slowest_rank == STRAGGLER_RANK
    assert report.has_straggler
    assert list(report.table.loc[report.table["is_straggler"], "rank"]) == [STRAGGLER_RANK]
    assert table.loc[WAITING_RANK, "exposed_comm_ms"] > table.loc[STRAGGLER_RANK, "exposed_comm_ms"]
    sleep_ms = STRAGGLER_SLEEP_S * 1e3
    assert table.loc[STRAGGLER_RANK, "work_ms"] - table.loc[WAITING_RANK, "work_ms"] > 0.5 * sleep_ms
    for rank in (0, 1):
        steps = step_events(raw_host_events(rank_file(gloo_trace_folder, rank)))[:-1]
        assert table.loc[rank, "steps"] == len(steps) == ANALYSED_STEPS
        assert table.loc[rank, "step_time_ms"] == pytest.approx(
            statistics.mean(e["dur"] for e in steps) / 1e3
        )
        assert table.loc[rank, "work_ms"] == pytest.approx(
            table.loc[rank, "step_time_ms"] - table.loc[rank, "exposed_comm_ms"]
        )
    assert f"Straggler: rank {STRAGGLER_RANK}" in repr(report)
    assert "<table" in report._repr_html_()
    assert not nbt.stragglers(gloo_trace, threshold_pct=1e6).has_straggler


@slow
def test_stragglers_of_one_rank_have_nothing_to_compare(cpu_trace: nbt.Trace) -> None:
    """One rank: it is the slowest by definition, at 0 % from the median, and no straggler."""
    report = nbt.stragglers(cpu_trace)
    assert report.slowest_rank == 0 and not report.has_straggler
    assert report.slowdown_pct == 0
    assert "one rank only" in repr(report)


# ------------------------------------------------------------------------------------- compare
@slow
@distributed
def test_compare_a_trace_with_itself_changes_nothing(gloo_trace: nbt.Trace, cpu_trace: nbt.Trace) -> None:
    """Same trace before and after: every delta is zero, and CPU traces have no kernel table."""
    for trace in (gloo_trace, cpu_trace):
        diff = nbt.compare(trace, trace)
        assert (diff.summary["delta"] == 0).all()
        assert len(diff.operators) and (diff.operators["delta_ms"] == 0).all()
        assert diff.kernels is None
        assert diff.step_time_change_pct == 0
        assert diff.time_within_noise is (True if len(trace.steps) >= 2 else None)
        assert "Trace comparison" in repr(diff) and "<table" in diff._repr_html_()


def test_compare_flags_a_step_time_change_inside_the_noise() -> None:
    """The quartile rule of Comparison (traces without load measurements): overlapping middle halves
    are noise, separate ones are not."""

    from nbtoolkit.trace.step_time import _quartiles_overlap

    def steps(*durations: float) -> pd.DataFrame:
        return pd.DataFrame({"dur": list(durations)})

    assert _quartiles_overlap(steps(100, 110, 120, 130), steps(105, 115, 125, 135)) is True
    assert _quartiles_overlap(steps(100, 101, 102, 103), steps(150, 151, 152, 153)) is False
    assert _quartiles_overlap(steps(100), steps(150, 151)) is None


@slow
@distributed
def test_compare_rank_zero_alone_with_both_ranks(gloo_trace_folder: Path, gloo_trace: nbt.Trace) -> None:
    """Step time is the median over all ranks' steps; categories are means over ranks per analysed step."""
    rank0 = nbt.load_trace(rank_file(gloo_trace_folder, 0))
    diff = nbt.compare(rank0, gloo_trace)
    summary = diff.summary.set_index("metric")
    durations = {
        r: [e["dur"] for e in step_events(raw_host_events(rank_file(gloo_trace_folder, r)))] for r in (0, 1)
    }
    step = summary.loc["step time (ms, median)"]
    assert step["before"] == pytest.approx(statistics.median(durations[0]) / 1e3)
    assert step["after"] == pytest.approx(statistics.median(durations[0] + durations[1]) / 1e3)
    assert diff.step_time_change_pct == pytest.approx(100 * (step["after"] / step["before"] - 1))
    comm = {
        r: union_length(
            [whole_us(e) for e in gloo_calls(analysed(raw_host_events(rank_file(gloo_trace_folder, r))))]
        )
        for r in (0, 1)
    }
    communication = summary.loc["communication (ms/step)"]
    assert communication["before"] == pytest.approx(comm[0] / 1e3 / ANALYSED_STEPS)
    assert communication["after"] == pytest.approx((comm[0] + comm[1]) / 2 / 1e3 / ANALYSED_STEPS)
    temporal = nbt.temporal_breakdown(gloo_trace)
    assert summary.loc["idle (ms/step)", "after"] == pytest.approx(
        temporal["idle_us"].mean() / 1e3 / ANALYSED_STEPS
    )
    assert (summary["delta"] == summary["after"] - summary["before"]).all()
    # Operators: self time per profiled step, over every rank of each trace, biggest change first.
    ops0 = rank0.top_operators(10**9).set_index("name")["self_us"]
    ops_all = gloo_trace.top_operators(10**9).set_index("name")["self_us"]
    for row in diff.operators.itertuples(index=False):
        assert row.before_ms == pytest.approx(ops0.get(row.name, 0.0) / 1e3 / PROFILED_STEPS)
        assert row.after_ms == pytest.approx(ops_all.get(row.name, 0.0) / 1e3 / PROFILED_STEPS)
    deltas = diff.operators["delta_ms"].abs().to_numpy()
    assert (deltas[:-1] >= deltas[1:]).all()


# --------------------------------------------------------------------------------------- views
@slow
@distributed
def test_timeline_draws_a_lane_per_rank_thread_with_gloo_calls_and_steps(gloo_trace: nbt.Trace) -> None:
    """Host lanes of both ranks, the gloo calls as communication segments, one shaded band per step."""
    fig = timeline(gloo_trace)
    labels = list(fig.layout.yaxis.ticktext)
    for rank in (0, 1):
        assert any(label.startswith(f"rank {rank} · ") for label in labels)
        assert any(label.startswith(f"rank {rank} · ") and "pt_gloo_runloop" in label for label in labels)
    by_kind = {data.name: data for data in fig.data}
    assert {"host", "communication"} <= set(by_kind)
    assert any("gloo:all_reduce" in str(text) for text in by_kind["communication"].hovertext)
    assert len(fig.layout.shapes) == PROFILED_STEPS
    frames = gloo_trace.events.values()
    first_us = min(float(frame["ts"].min()) for frame in frames)
    last_us = max(float((frame["ts"] + frame["dur"]).max()) for frame in frames)
    x_ms = [x for data in fig.data for x in data.x if x is not None]  # ms from the first event
    assert min(x_ms) >= 0 and max(x_ms) <= (last_us - first_us) / 1e3 + 1e-9
    assert len(timeline(gloo_trace, ranks=[STRAGGLER_RANK]).layout.yaxis.ticktext) < len(labels)


@slow
@distributed
def test_trace_overlap_chart_and_report_display(gloo_trace: nbt.Trace) -> None:
    """The Trace, the overlap chart and the %nbt trace report show text, HTML and their figures."""
    bundle = gloo_trace._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert "2 rank(s) [0, 1]" in bundle["text/plain"] and "backend gloo, world size 2" in bundle["text/plain"]
    assert "Step times (ms)" in bundle["text/plain"] and "nbt-trace" in bundle["text/html"]
    overlap = nbt.comm_comp_overlap(gloo_trace)
    chart = overlap_chart(gloo_trace)
    assert [bar.name for bar in chart.data] == ["hidden behind compute", "exposed"]
    assert list(chart.data[1].y) == pytest.approx(list(overlap["exposed_comm_us"] / 1e3))
    assert list(chart.data[1].text) == [f"{p:.1f} % overlap" for p in overlap["overlap_pct"]]
    report = TraceReport.of(gloo_trace)
    text = repr(report)
    assert "Temporal breakdown" in text and f"Straggler: rank {STRAGGLER_RANK}" in text
    assert "Idle time per stream" not in text  # no device streams on CPU
    assert set(report._repr_mimebundle_()) == {"text/plain", "text/html"}
    assert len(report._report_figures()) == 2


@slow
def test_single_rank_views_show_no_kernels(cpu_trace: nbt.Trace) -> None:
    """A one-rank CPU trace: host lanes only, no kernel section, three shaded steps."""
    fig = timeline(cpu_trace)
    assert {data.name for data in fig.data} == {"host"}
    assert len(fig.layout.shapes) == PROFILED_STEPS
    text = repr(cpu_trace)
    assert "Top operators by self CPU time" in text and "Top kernels" not in text


# -------------------------------------------------------------------------------------- magics
@slow
@distributed
def test_overlap_magic_on_the_recorded_folder(
    shell: Any, gloo_trace_folder: Path, gloo_trace: nbt.Trace
) -> None:
    """%nbt overlap PATH loads the folder and shows the same table nbt.comm_comp_overlap gives."""
    result = shell.run_line_magic("nbt", f"overlap {gloo_trace_folder} --name recorded_overlap")
    assert isinstance(result, OverlapReport)
    assert shell.user_ns["recorded_overlap"] is result
    pd.testing.assert_frame_equal(result.table, nbt.comm_comp_overlap(gloo_trace))
    assert "cpu-gloo" in repr(result)
    assert len(result._figures()) == 1


@slow
@distributed
def test_trace_magic_on_a_recorded_trace_variable(shell: Any, gloo_trace: nbt.Trace) -> None:
    """%nbt trace VAR reports the recorded trace, straggler included."""
    shell.user_ns["recorded_trace"] = gloo_trace
    report = shell.run_line_magic("nbt", "trace recorded_trace")
    assert isinstance(report, TraceReport) and report.trace is gloo_trace
    assert report.stragglers.slowest_rank == STRAGGLER_RANK
