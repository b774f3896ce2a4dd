"""nbt.critical_path on CPU traces recorded in this session, and its errors.

CPU definitions: with no device, the graph holds the host threads only; the path is the chain
of host ops (nested and in order on their thread), with the time between top-level ops as
``host gap`` (unprofiled Python). A gloo collective is a host op; its time on the path
includes waiting for the slowest peer, which is why a rank that waits for a straggler shows
``collective`` time on its path while the straggler shows its own extra work.
"""

from __future__ import annotations

import pytest

import nbtoolkit as nbt
from tests.trace.conftest import STRAGGLER_RANK, STRAGGLER_SLEEP_S

HOST_KINDS = {"cpu", "host gap", "collective", "collective queue", "allocator", "sync wait"}


def test_cpu_step_path_is_the_host_chain(cpu_trace_file):
    trace = nbt.load_trace(cpu_trace_file)
    steps = trace.steps
    for step in steps["step"]:
        path = nbt.critical_path(trace, step=int(step))
        seg = path.segments
        assert set(seg["kind"]) <= HOST_KINDS
        assert (seg["stream"] == -1).all()
        # no device: the span is the ProfilerStep itself. The path's span is end - start of large absolute
        # timestamps (float64 keeps about 0.001 us there); the step's dur is the JSON's own value. So they
        # agree to the trace's 1 ns resolution, not always to 1e-6 relative (a CI run was 0.0005 us off).
        expected = float(steps.loc[steps["step"] == step, "dur"].iloc[0])
        assert path.span_us == pytest.approx(expected, rel=1e-6, abs=1e-3)
        assert seg["dur_us"].sum() == pytest.approx(path.span_us)
        # the work is the host ops' time; the rest are gaps between them
        assert path.length_us == pytest.approx(seg.loc[seg["kind"] != "host gap", "work_us"].sum())
        names = set(seg.loc[seg["kind"] == "cpu", "name"])
        assert any(n.startswith("aten::") for n in names), names
        frame = trace.rank_events(0)
        # every event on the path is a host event of this step
        rows = frame.iloc[path.events]
        step_row = steps[steps["step"] == step].iloc[0]
        assert (rows["ts"] >= step_row["ts"]).all() and (rows["ts"] <= step_row["ts"] + step_row["dur"]).all()
    # default: the step of median duration
    default = nbt.critical_path(trace)
    assert default.step in set(steps["step"])
    ordered = sorted(steps["dur"])
    assert default.span_us == pytest.approx(ordered[(len(ordered) - 1) // 2])
    text = repr(default)
    assert "Critical path of rank 0" in text and "shortened" in text
    assert "<table" in default._repr_html_()


@pytest.mark.distributed
@pytest.mark.slow
def test_gloo_ranks_waiting_rank_shows_the_collective_straggler_its_own_time(gloo_trace_folder):
    trace = nbt.load_trace(gloo_trace_folder)
    waiting = 1 - STRAGGLER_RANK
    share: dict[int, dict[str, float]] = {}
    for rank in (0, 1):
        for step in trace.steps.query("rank == @rank")["step"]:
            path = nbt.critical_path(trace, rank=rank, step=int(step))
            assert set(path.segments["kind"]) <= HOST_KINDS
            assert path.segments["dur_us"].sum() == pytest.approx(path.span_us)
            kinds = path.by_kind().set_index("kind")["dur_us"]
            for kind, value in kinds.items():
                share.setdefault(rank, {}).setdefault(str(kind), 0.0)
                share[rank][str(kind)] += float(value)
    sleep_us = STRAGGLER_SLEEP_S * 1e6 * 3  # three profiled steps
    per_rank = nbt.critical_path_by_rank(trace).set_index("rank")
    assert per_rank.loc[waiting, "collective_pct"] > per_rank.loc[STRAGGLER_RANK, "collective_pct"]
    assert per_rank.loc[STRAGGLER_RANK, "top_kind"] == "host gap"  # its own sleep bounds its step
    # the waiting rank spends about the straggler's sleep inside collectives on its path
    assert share[waiting].get("collective", 0.0) >= 0.5 * sleep_us, share
    # the straggler's sleep is unprofiled host time on its own path
    assert share[STRAGGLER_RANK].get("host gap", 0.0) >= 0.9 * sleep_us, share
    assert share[STRAGGLER_RANK].get("collective", 0.0) < share[waiting]["collective"]


def test_errors_name_the_problem(cpu_trace_file):
    trace = nbt.load_trace(cpu_trace_file)
    with pytest.raises(nbt.TraceError, match="rank 3 is not in this trace"):
        nbt.critical_path(trace, rank=3)
    with pytest.raises(nbt.TraceError, match="no ProfilerStep#999; steps present"):
        nbt.critical_path(trace, step=999)
    with pytest.raises(nbt.TraceError, match="no host annotation contains 'nope'"):
        nbt.critical_path(trace, annotation="nope")
    with pytest.raises(nbt.TraceError, match="instance 7 is out of range"):
        nbt.critical_path(trace, annotation="ProfilerStep", instance=7)


@pytest.mark.parametrize("step_dur", [0, 100])
def test_a_step_of_zero_duration_ops_says_what_is_there(tmp_path, step_dur):
    """Ops that all last 0 us were reported as "no host operator starts inside it": untrue."""
    import json

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
               "ts": 0, "dur": step_dur}]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 0, "dur": 0}
               for i in range(5000)]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    with pytest.raises(nbt.TraceError) as info:
        nbt.critical_path(nbt.load_trace(path))
    message = str(info.value)
    assert "5,000 host operator(s) start inside it, all of zero duration" in message, message
    assert "no host operator starts" not in message
    assert ("lasts 0 us" in message) == (step_dur == 0)
