"""nbt.compare's step-time verdict on traces of known step times and known load: the rules, the
text and HTML, and the load saved and loaded with the trace.

The traces are real Kineto JSON files read by nbt.load_trace; the load around their steps is a
StepLoad written here (what nbt.profile measures is tested on real recordings in
test_compare_load.py), so that each rule meets exactly the case it is for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.interleaved import FASTER, SAME, SLOWER, UNCLEAR
from nbtoolkit.trace.step_load import StepLoad
from nbtoolkit.trace.step_time import LOAD_UNKNOWN, MIN_STEPS, NOT_COMPARABLE

QUIET_PROBE_S = 0.0003
BUSY_PROBE_S = 0.02  # a thread held the GIL: 20 ms


def _jitter(ms: float, n: int, spread: float = 0.004) -> list[float]:
    """``n`` step times around ``ms``, ±``spread`` apart (a deterministic little noise)."""
    return [ms * (1 + spread * ((i * 7) % 5 - 2) / 2) for i in range(n)]


def _trace(tmp_path: Path, name: str, durations_ms: list[float], *, rank: int = 0) -> nbt.Trace:
    """A one-rank Kineto trace whose ProfilerStep#i lasts ``durations_ms[i]``, with a matmul in each."""
    events, ts = [], 0.0
    for i, ms in enumerate(durations_ms):
        us = ms * 1e3
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1, "ts": ts,
             "dur": us}
        )  # fmt: skip
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts + 1,
                       "dur": us * 0.8})  # fmt: skip
        ts += us + 50
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": rank}}))
    return nbt.load_trace(path)


def _load(
    durations_ms: list[float], *, busy: set[int] = frozenset(), wait_shares: list[float] | None = None
) -> StepLoad:
    """The StepLoad of steps of ``durations_ms``, each step waiting ``wait_shares[i]`` of its time for a
    processor (0 by default). ``busy`` (steps in a row): a thread held the GIL from inside the first
    to inside the last, so the probes between them are slow, the ones around the block quiet."""
    n = len(durations_ms)
    probes = [BUSY_PROBE_S if (i - 1 in busy and i in busy) else QUIET_PROBE_S for i in range(n + 1)]
    shares = wait_shares or [0.0] * n
    wall = [ms / 1e3 for ms in durations_ms]
    return StepLoad(
        probes_s=probes,
        probe_waits_s=[0.0] * (n + 1),
        wall_s=wall,
        cpu_s=[w * (1 - s) for w, s in zip(wall, shares, strict=True)],
        wait_s=[w * s for w, s in zip(wall, shares, strict=True)],
        machine_busy=0.3,
        cores=2,
    )


def _recorded(tmp_path: Path, name: str, durations_ms: list[float], **load: object) -> nbt.Trace:
    trace = _trace(tmp_path, name, durations_ms)
    trace.step_load = {0: _load(durations_ms, **load)}  # type: ignore[arg-type]
    return trace


def test_a_clear_slowdown_is_named_with_its_interval_in_text_and_html(tmp_path):
    before = _recorded(tmp_path, "before", _jitter(10.0, 12))
    after = _recorded(tmp_path, "after", _jitter(15.0, 12))
    diff = nbt.compare(before, after)
    result = diff.step_time
    assert result.verdict == SLOWER
    assert result.ratio == pytest.approx(1.5)
    # the step times alone give about 1.49-1.51 (±0.4% jitter); the interval allows 10% each side for what two
    # recordings made one after the other can differ by with nothing changed
    assert 1.48 / 1.1 < result.low < 1.5 / 1.1 and 1.5 * 1.1 < result.high < 1.52 * 1.1
    assert diff.time_within_noise is False
    text = repr(diff)
    assert "Step time: after is slower: 1.50× the time (" in text
    assert "with 95% confidence; 12 of 12 before steps, 12 of 12 after steps)" in text
    assert "the machine's 2 cores were 30% busy while both traces were recorded" in text
    html = diff._repr_html_()
    assert "<b>Step time</b>: after is slower: 1.50× the time" in html
    assert "<li>the machine&#x27;s 2 cores were 30% busy" in html  # notes escaped, as list items

    assert "cover all steps" not in text  # no step was disturbed
    after.step_load[0].machine_busy = 0.9
    text = repr(nbt.compare(before, after))
    assert "cores were 30% busy while the before trace was recorded" in text
    assert "cores were 90% busy while the after trace was recorded" in text

    faster = nbt.compare(after, before).step_time
    assert faster.verdict == FASTER and faster.speedup == pytest.approx(1.5)
    assert faster.reading().startswith("after is faster: 1.50× the speed (")


def test_steps_within_two_percent_are_no_change_beyond_what_two_recordings_can_show(tmp_path):
    before = _recorded(tmp_path, "before", _jitter(10.0, 12, spread=0.002))
    after = _recorded(tmp_path, "after", _jitter(10.02, 12, spread=0.002))
    diff = nbt.compare(before, after)
    assert diff.step_time.verdict == SAME
    assert diff.time_within_noise is True
    text = repr(diff)
    assert "no change beyond ±12%: 1.00× the time (0.9" in text
    assert "can differ by 10% with nothing changed: time smaller changes with nbt.optimize" in text


def test_a_nine_percent_difference_between_two_recordings_is_not_named(tmp_path):
    """CI's shared machine recorded the same step 1.09× as long the second time (1.04-1.14× by the
    step times alone, every step undisturbed): two recordings cannot name a change that small."""
    before = _recorded(tmp_path, "before", _jitter(10.0, 40, spread=0.002))
    after = _recorded(tmp_path, "after", _jitter(10.9, 40, spread=0.002))
    result = nbt.compare(before, after).step_time
    assert result.verdict == UNCLEAR and result.low < 1.0 < result.high
    assert "no measurable change: 1.09× the time" in result.reading()
    reading = result.reading()
    assert "two recordings made one after the other can differ by 10% with nothing changed" in reading


def test_steps_another_thread_disturbed_are_left_out(tmp_path):
    """10 of 18 "before" steps ran while a thread held the GIL and took 3x as long: naively the
    median is theirs and "after" (the same step) looks 3x as fast."""
    durations = _jitter(10.0, 18)
    busy = set(range(4, 14))
    for i in busy:
        durations[i] *= 3
    before = _recorded(tmp_path, "before", durations, busy=busy)
    after = _recorded(tmp_path, "after", _jitter(10.0, 18))
    assert before.steps["dur"].median() > 2 * after.steps["dur"].median()  # what a naive compare sees
    diff = nbt.compare(before, after)
    result = diff.step_time
    assert result.before.disturbed == 10 and result.after.disturbed == 0
    assert result.verdict in (SAME, UNCLEAR)
    assert result.ratio == pytest.approx(1.0, abs=0.01)
    assert "8 of 18 before steps (10 disturbed by other work), 18 of 18 after steps" in repr(diff)
    assert "the times per category and per operator below cover all steps, the disturbed ones" in repr(diff)
    step = diff.summary.set_index("metric").loc["step time (ms, median)"]
    assert step["before"] == pytest.approx(result.before.median_ms)  # the undisturbed steps' median
    assert step["before"] < 10.1


def test_steps_that_waited_for_a_processor_are_left_out(tmp_path):
    """Another process took the core during 8 steps: they waited 60% of their time, took 2.5x."""
    durations, shares = _jitter(10.0, 18), [0.0] * 18
    for i in range(5, 13):
        durations[i] *= 2.5
        shares[i] = 0.6
    before = _recorded(tmp_path, "before", durations, wait_shares=shares)
    after = _recorded(tmp_path, "after", _jitter(15.0, 18))
    result = nbt.compare(before, after).step_time
    assert result.before.disturbed == 8
    assert result.verdict == SLOWER and result.ratio == pytest.approx(1.5, rel=0.01)


def test_a_wait_the_kept_steps_still_met_widens_the_interval(tmp_path):
    """The "before" steps all waited 10% of their time for a processor (not a burst: all are
    kept), which alone makes them 1/0.9 as long: "after" is not called faster for it."""
    before = _recorded(tmp_path, "before", _jitter(10.0 / 0.9, 12), wait_shares=[0.1] * 12)
    after = _recorded(tmp_path, "after", _jitter(10.0, 12))
    result = nbt.compare(before, after).step_time
    assert result.before.disturbed == 0
    assert result.ratio == pytest.approx(0.9, rel=0.01)
    assert result.load_effect == pytest.approx(0.9)
    assert result.high >= 1.0 > 0.9 > result.low  # covers the ratio with the wait taken out
    assert result.verdict == UNCLEAR
    assert "no measurable change: 0.90× the time" in result.reading()
    assert "(and by more when they met different load from other work)" in result.reading()
    notes = " ".join(result.notes())
    assert "still waited for a processor 10% of their time before and 0% after" in notes
    assert "which alone makes 0.90× the time" in notes


def test_a_trace_recorded_while_the_machine_was_busy_is_not_comparable(tmp_path):
    durations = _jitter(10.0, 10)
    for i in range(2, 8):
        durations[i] *= 3
    before = _recorded(tmp_path, "before", durations, busy=set(range(2, 8)))
    after = _recorded(tmp_path, "after", _jitter(10.0, 10))
    diff = nbt.compare(before, after)
    result = diff.step_time
    assert result.verdict == NOT_COMPARABLE
    assert diff.time_within_noise is None
    text = repr(diff)
    assert (
        "Step time: not comparable: the before trace was recorded while the machine was busy "
        f"(6 of 10 before steps disturbed by other work; a verdict needs {MIN_STEPS} undisturbed steps "
        "per trace): record it again when the machine is quiet, or time the change with nbt.optimize, "
        "which interleaves before and after"
    ) in text
    assert "faster" not in text
    html = diff._repr_html_()
    assert "<b>Step time</b>: not comparable: the before trace was recorded" in html

    both = nbt.compare(before, before).step_time
    assert both.verdict == NOT_COMPARABLE
    assert "both traces were recorded while the machine was busy" in both.why
    assert "record them again" in both.why


def test_too_few_steps_give_no_verdict_and_say_how_many_to_record(tmp_path):
    before = _recorded(tmp_path, "before", _jitter(10.0, 3))
    after = _recorded(tmp_path, "after", _jitter(20.0, 3))
    result = nbt.compare(before, after).step_time
    assert result.verdict == UNCLEAR
    assert result.ratio == pytest.approx(2.0, rel=0.01)
    assert "the before trace has 3 step(s) and the after trace has 3 step(s)" in result.reading()
    assert "nbt.profile(step, steps=20)" in result.reading()


def test_traces_without_load_keep_the_quartile_rule_and_say_the_load_is_unknown(tmp_path):
    before = _trace(tmp_path, "before", _jitter(10.0, 8))
    after = _trace(tmp_path, "after", _jitter(15.0, 8))
    diff = nbt.compare(before, after)
    result = diff.step_time
    assert result.verdict == LOAD_UNKNOWN and diff.time_within_noise is False
    assert not result.before.load_known and result.before.disturbed == 0
    text = repr(diff)
    assert "after looks slower (1.50× the time; the steps' middle halves do not overlap), but the " in text
    assert "machine's load during the recordings is unknown (the traces carry no load measurements" in text

    overlapping = nbt.compare(before, _trace(tmp_path, "same", _jitter(10.0, 8))).step_time
    assert overlapping.within_noise is True
    assert "within the steps' noise (their middle halves overlap)" in overlapping.reading()

    # one side measured is not enough: the other side's load is still unknown
    measured = _recorded(tmp_path, "measured", _jitter(10.0, 8))
    one_side = nbt.compare(measured, after).step_time
    assert one_side.verdict == LOAD_UNKNOWN
    assert "the after trace carries no load measurements" in one_side.reading()


def test_a_load_of_other_steps_than_the_trace_holds_is_not_used(tmp_path):
    before = _trace(tmp_path, "before", _jitter(10.0, 8))
    before.step_load = {0: _load(_jitter(10.0, 9))}  # measured for 9 steps, the trace has 8
    after = _recorded(tmp_path, "after", _jitter(10.0, 8))
    assert nbt.compare(before, after).step_time.verdict == LOAD_UNKNOWN


def test_the_load_is_saved_and_loaded_with_the_trace(tmp_path):
    trace = _recorded(tmp_path, "before", _jitter(10.0, 9), busy={3}, wait_shares=[0.05] * 9)
    folder = trace.save(tmp_path / "saved")
    meta = json.loads((folder / "trace.json").read_text())
    assert set(meta["step_load"]) == {"0"}
    loaded = nbt.Trace.load(folder)
    assert loaded.step_load[0].to_json() == trace.step_load[0].to_json()
    after = _recorded(tmp_path, "after", _jitter(12.0, 9))
    assert nbt.compare(loaded, after).step_time.reading() == nbt.compare(trace, after).step_time.reading()

    plain = _trace(tmp_path, "plain", _jitter(10.0, 3))
    plain_folder = plain.save(tmp_path / "plain_saved")
    assert "step_load" not in json.loads((plain_folder / "trace.json").read_text())  # as before
    assert nbt.Trace.load(plain_folder).step_load == {}


def test_a_real_profile_keeps_its_load_through_save_and_load(tmp_path):
    trace = nbt.profile(lambda: sum(range(1000)), steps=3, warmup=1)
    load = trace.step_load[0]
    assert load.steps == 3 and len(load.probes_s) == 4 and load.problem() is None
    loaded = nbt.Trace.load(trace.save(tmp_path / "profiled"))
    assert loaded.step_load[0].to_json() == load.to_json()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["0"].update(probes_s=[0.001]), "do not describe the same steps"),
        (lambda s: s["0"].update(wall_s="fast"), "'wall_s' should be a list (of a number each)"),
        (lambda s: s["0"].update(cpu_s=[-1.0, 0.0, 0.0]), "a time is negative, infinite or missing"),
        (lambda s: s["0"].update(machine_busy=3), "machine_busy 3.0 is not a share from 0 to 1"),
        (lambda s: s.update({"7": s.pop("0")}), "step_load names rank '7', which is not a rank of the trace"),
        (lambda s: s["0"].pop("probes_s"), "the key 'probes_s' is missing"),
    ],
)
def test_a_damaged_saved_load_is_a_trace_error_naming_the_file(tmp_path, edit, message):
    trace = _recorded(tmp_path, "before", _jitter(10.0, 3))
    folder = trace.save(tmp_path / "saved")
    meta_path = folder / "trace.json"
    meta = json.loads(meta_path.read_text())
    edit(meta["step_load"])
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(nbt.TraceError) as info:
        nbt.Trace.load(folder)
    assert "trace.json" in str(info.value) and message in str(info.value), str(info.value)


def test_combined_traces_keep_each_rank_s_load(tmp_path):
    first = _recorded(tmp_path, "rank0", _jitter(10.0, 8))
    second = _trace(tmp_path, "rank1", _jitter(10.0, 8), rank=1)
    shares = [0.0, 0.0, 0.7, 0.0, 0.0, 0.0, 0.7, 0.0]  # another process took the core twice
    second.step_load = {1: _load(_jitter(10.0, 8), wait_shares=shares)}
    both = nbt.Trace.combine([first, second])
    assert set(both.step_load) == {0, 1}
    assert both.step_load[1] is second.step_load[1]
    result = nbt.compare(both, both).step_time
    assert result.before.steps == 16 and result.before.disturbed == 2  # rank 1's steps 2 and 6


def test_a_recording_whose_machine_speed_moved_widens_the_interval_by_that_drift(tmp_path):
    """The after recording's undisturbed steps went from 10 to 13 ms halfway (as on this machine):
    the 1.15× between the medians is not named, and the note says why."""
    before = _recorded(tmp_path, "before", _jitter(10.0, 30, spread=0.002))
    after = _recorded(tmp_path, "after", _jitter(10.0, 15, spread=0.002) + _jitter(13.0, 15, spread=0.002))
    result = nbt.compare(before, after).step_time
    assert result.after.drift == pytest.approx(0.3, abs=0.01) and result.allowance == result.after.drift
    assert result.verdict == UNCLEAR and result.low < 1.0
    notes = " ".join(result.notes())
    assert "the after trace's undisturbed steps drifted by 30% while it was recorded" in notes
