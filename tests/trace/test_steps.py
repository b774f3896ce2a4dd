"""The one ProfilerStep label parser (nbtoolkit.core.profiler_steps) and the places that use it."""

from __future__ import annotations

import json

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError, TraceError
from nbtoolkit.core.profiler_steps import (
    is_profiler_step_label,
    parse_profiler_step,
    profiler_step_label,
    step_labels,
)


@pytest.mark.parametrize("step", [0, 1, 12, 551, 10**12])
def test_label_written_is_label_read(step):
    label = profiler_step_label(step)
    assert label == f"ProfilerStep#{step}"  # the form torch.profiler writes
    assert is_profiler_step_label(label)
    assert parse_profiler_step(label) == step


@pytest.mark.parametrize(
    "label",
    [
        "ProfilerStep#x",
        "ProfilerStep#",
        "ProfilerStep#-1",
        "ProfilerStep#1.5",
        "ProfilerStep 3",
        "ProfilerStep#1 ",
        "ProfilerStep#1\n",  # a regex "$" would accept the trailing newline
        "ProfilerStep",
    ],
)
def test_malformed_labels_are_trace_errors_naming_the_label_and_the_source(label):
    with pytest.raises(TraceError) as info:
        parse_profiler_step(label, source="rank3.json")
    message = str(info.value)
    assert message.startswith("rank3.json: ")
    assert repr(label) in message and "ProfilerStep#N" in message


@pytest.mark.parametrize(
    "name", ["my ProfilerStep helper", "## ProfilerStep#3 ##", "profilerstep#3", "aten::mm"]
)
def test_names_merely_containing_profiler_step_are_not_labels(name):
    assert not is_profiler_step_label(name)
    assert step_labels([name, "ProfilerStep#4"]) == {"ProfilerStep#4": 4}
    with pytest.raises(TraceError):
        parse_profiler_step(name)


def _event(name, ts, dur, cat="user_annotation", **args):
    event = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event


def _kernel(ts, dur, corr):
    args = {"stream": 7, "correlation": corr, "device": 0}
    return {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts, "dur": dur} | {
        "args": args
    }


def _write(tmp_path, events):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_steps_parsed_at_load_are_kept_and_equal_a_fresh_parse(tmp_path):
    events = [
        _event("ProfilerStep#7", 0, 100),
        _event("ProfilerStep#8", 100, 50),
        _event("ProfilerStep#8", 150, 0),  # annotated twice: the longest one is the step
        _event("my ProfilerStep helper", 10, 5),
        _event("aten::mm", 20, 5, cat="cpu_op"),
    ]
    trace = nbt.load_trace(_write(tmp_path, events))
    assert trace._steps is not None  # kept from the load: Trace.steps does not parse again
    assert list(trace.steps["step"]) == [7, 8]
    assert list(trace.steps["dur"]) == [100, 50]
    saved = nbt.Trace.load(trace.save(tmp_path / "saved"))
    assert saved._steps is None  # not saved: recomputed from the events, identically
    assert saved.steps.equals(trace.steps)


def test_a_name_containing_profiler_step_does_not_make_a_second_step(tmp_path):
    # One real step label and a user annotation that contains the word: with two "labels"
    # the analyses would leave out the last step (and its kernel); with one they keep all.
    events = [
        _event("ProfilerStep#0", 0, 100),
        _event("my ProfilerStep helper", 50, 100),
        _event("cudaLaunchKernel", 10, 1, cat="cuda_runtime", correlation=1),
        _event("cudaLaunchKernel", 60, 1, cat="cuda_runtime", correlation=2),
        _kernel(20, 30, 1),
        _kernel(70, 20, 2),
    ]
    trace = nbt.load_trace(_write(tmp_path, events))
    assert list(trace.steps["step"]) == [0]
    assert nbt.temporal_breakdown(trace).iloc[0]["compute_us"] == 50
    assert nbt.kernel_breakdown(trace).by_kernel["calls"].sum() == 2


def test_load_trace_returns_a_loaded_trace_unchanged(tmp_path):
    trace = nbt.load_trace(_write(tmp_path, [_event("ProfilerStep#0", 0, 10)]))
    assert nbt.load_trace(trace) is trace


@pytest.mark.parametrize("bad", [3, None, b"rank0.json", ["rank0.json"]])
def test_load_trace_names_what_it_takes(bad):
    with pytest.raises(NbtUsageError) as info:
        nbt.load_trace(bad)
    shown = "got None" if bad is None else f"{type(bad).__name__} ({bad!r})"
    assert "or a Trace" in str(info.value) and shown in str(info.value)


def test_host_steps_read_plain_and_categorical_names_alike():
    """A frame built by hand has plain string names; the loader's are categorical: same steps."""
    import pandas as pd

    from nbtoolkit.core.profiler_steps import host_steps

    frame = pd.DataFrame(
        {
            "name": ["ProfilerStep#1", "aten::mm", "ProfilerStep#2", "ProfilerStep#2"],
            "stream": [-1, -1, -1, 7],  # the last: the annotation's copy on a device stream
            "ts": [0.0, 1.0, 5.0, 5.5],
            "dur": [4.0, 1.0, 4.0, 3.0],
        }
    )
    plain = host_steps(3, frame)
    assert plain.to_dict("list") == {"rank": [3, 3], "step": [1, 2], "ts": [0.0, 5.0], "dur": [4.0, 4.0]}
    pd.testing.assert_frame_equal(plain, host_steps(3, frame.assign(name=frame["name"].astype("category"))))
