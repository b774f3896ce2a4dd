"""Every kind of bad input ends in one TraceError that names the file and the problem."""

from __future__ import annotations

import gzip
import json

import pytest

import nbtoolkit as nbt
from nbtoolkit.errors import NbtError, TraceError


def _event(**over):
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5}
    event.update(over)
    return event


def _doc(events, **top):
    return {"schemaVersion": 1, "traceEvents": events, **top}


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def _raises(path, *fragments):
    with pytest.raises(TraceError) as info:
        nbt.load_trace(path)
    message = str(info.value)
    assert isinstance(info.value, NbtError)
    for fragment in fragments:
        assert fragment in message, message
    assert info.value.__cause__ is None or isinstance(info.value.__cause__, TraceError)
    return message


def test_missing_path(tmp_path):
    _raises(tmp_path / "nope.json", "nope.json", "no such file or folder")


def test_empty_folder(tmp_path):
    _raises(tmp_path, str(tmp_path), "it is empty")


def test_folder_with_only_non_trace_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    _raises(tmp_path, "no .json/.json.gz trace", "notes.txt")


def test_non_trace_files_are_skipped_and_noted(tmp_path):
    _write(tmp_path / "rank0.json", _doc([_event()], distributedInfo={"rank": 0}))
    (tmp_path / "README.md").write_text("# traces")
    (tmp_path / "model.pt").write_bytes(b"\x00\x01")
    trace = nbt.load_trace(tmp_path)
    assert trace.ranks == [0]
    assert any("README.md" in note and "model.pt" in note for note in trace.notes)
    assert "README.md" in repr(trace)  # the note is shown to the user


def test_truncated_gzip(tmp_path):
    data = gzip.compress(json.dumps(_doc([_event()] * 100)).encode())
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(data[: len(data) // 2])
    _raises(path, "rank0.json.gz", "gzip stream is truncated or corrupt")


def test_gz_name_but_not_gzip(tmp_path):
    path = tmp_path / "rank0.json.gz"
    path.write_text(json.dumps(_doc([_event()])))
    _raises(path, "rank0.json.gz", "not gzip-compressed")


def test_truncated_json(tmp_path):
    path = tmp_path / "rank0.json"
    text = json.dumps(_doc([_event()] * 10))
    path.write_text(text[: len(text) - 40])
    _raises(path, "rank0.json", "truncated")


def test_garbled_json(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "a" "ts": 1}]}')
    _raises(path, "rank0.json", "malformed")


def test_empty_file(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text("")
    _raises(path, "rank0.json", "empty")


@pytest.mark.parametrize("doc", [{"nodes": [], "schema": "1.0.2-chakra"}, 42, "trace"])
def test_json_that_is_not_a_trace(tmp_path, doc):
    path = _write(tmp_path / "et.json", doc)
    _raises(path, "et.json", "not a profiler trace")


@pytest.mark.parametrize(
    "events", [[], [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}]]
)
def test_trace_without_events(tmp_path, events):
    _raises(_write(tmp_path / "rank0.json", _doc(events)), "rank0.json", "no events")


def test_duplicate_ranks(tmp_path):
    _write(tmp_path / "a.json", _doc([_event()], distributedInfo={"rank": 3}))
    _write(tmp_path / "b.json", _doc([_event()], distributedInfo={"rank": 3}))
    _raises(tmp_path, "rank 3 appears twice", "a.json", "b.json")


def test_ranks_with_different_trace_formats(tmp_path):
    _write(tmp_path / "rank0.json", _doc([_event()]))
    _write(tmp_path / "rank1.json", [_event()])  # legacy Chrome JSON array format
    _raises(tmp_path, "different trace formats", "rank0.json", "rank1.json")


@pytest.mark.parametrize("label", ["ProfilerStep#abc", "ProfilerStep 3", "ProfilerStep#"])
def test_bad_profiler_step_label(tmp_path, label):
    path = _write(tmp_path / "rank0.json", _doc([_event(), _event(name=label, cat="user_annotation")]))
    _raises(path, "rank0.json", repr(label), "ProfilerStep#N")


def test_negative_duration(tmp_path):
    path = _write(tmp_path / "rank0.json", _doc([_event(), _event(name="aten::bad", dur=-3)]))
    _raises(path, "rank0.json", "aten::bad", "negative duration")


def test_missing_duration(tmp_path):
    event = _event(name="aten::nodur")
    del event["dur"]
    _raises(
        _write(tmp_path / "rank0.json", _doc([_event(), event])), "rank0.json", "aten::nodur", "no duration"
    )


def test_int64_overflow_in_an_id(tmp_path):
    path = _write(tmp_path / "rank0.json", _doc([_event(args={"correlation": 2**70})]))
    _raises(path, "rank0.json", "64 bits")


def test_int64_overflow_in_a_timestamp(tmp_path):
    path = _write(tmp_path / "rank0.json", _doc([_event(ts=2**80)]))
    _raises(path, "rank0.json", "int64")


def test_invalid_utf8_in_a_name(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "aten::\xff\xfe", "ts": 1, "dur": 1}]}')
    _raises(path, "rank0.json", "UTF-8")


def test_wrong_value_type(tmp_path):
    path = _write(tmp_path / "rank0.json", _doc([_event(ts="soon")]))
    _raises(path, "rank0.json", "wrong type", "traceEvents[0].ts")


def test_trace_load_of_a_folder_that_is_not_a_saved_trace(tmp_path):
    with pytest.raises(TraceError, match=r"Trace\.save"):
        nbt.Trace.load(tmp_path)
