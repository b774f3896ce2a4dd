"""Every kind of bad input ends in one TraceError that names the file and the problem."""

from __future__ import annotations

import gzip
import json

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtError, TraceError


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


# ---------------------------------------------------------------- hardening (issue 22)
_ANALYSES = ["comm_comp_overlap", "temporal_breakdown", "kernel_breakdown", "idle_breakdown", "stragglers"]


@pytest.mark.parametrize("analysis", _ANALYSES)
@pytest.mark.parametrize("value", [None, [1, 2], 5])
def test_analyses_given_something_else_than_a_trace_say_what_they_need(analysis, value):
    with pytest.raises(nbt.NbtUsageError, match=rf"{analysis}\(\) takes a Trace .* or the path") as info:
        getattr(nbt, analysis)(value)
    assert ("None" if value is None else type(value).__name__) in str(info.value)


@pytest.mark.parametrize("analysis", ["comm_comp_overlap", "temporal_breakdown", "kernel_breakdown"])
def test_analyses_given_a_path_load_it(tmp_path, analysis):
    path = _write(tmp_path / "rank0.json", _doc([_event()], distributedInfo={"rank": 0}))
    from_path = getattr(nbt, analysis)(str(path))
    from_trace = getattr(nbt, analysis)(nbt.load_trace(path))
    assert repr(from_path) == repr(from_trace)


def test_compare_names_the_side_that_is_not_a_trace(tmp_path):
    path = _write(tmp_path / "rank0.json", _doc([_event()]))
    with pytest.raises(nbt.NbtUsageError, match=r"compare\(\) \(after\) takes a Trace.*got an int"):
        nbt.compare(path, 7)


def _in_thread(function, timeout_s=20.0):
    """Run ``function`` in a thread; fail (not hang) when it has not returned within ``timeout_s``."""
    import threading

    outcome = {}

    def run():
        try:
            outcome["value"] = function()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the reader blocked"
    return outcome


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_refused_without_blocking(tmp_path):
    import os

    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    outcome = _in_thread(lambda: nbt.load_trace(fifo))
    assert isinstance(outcome.get("error"), TraceError)
    assert "named pipe" in str(outcome["error"]) and "rank0.json" in str(outcome["error"])


@pytest.mark.skipif(not __import__("os").path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused():
    outcome = _in_thread(lambda: nbt.load_trace("/dev/zero"))
    assert isinstance(outcome.get("error"), TraceError)
    assert "is a device" in str(outcome["error"])


def _gzip_of_spaces(path, mib):
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as out:
        block = b" " * (1 << 20)
        for _ in range(mib):
            out.write(packer.compress(block))
        out.write(packer.flush())
    return path


@pytest.mark.parametrize("how", ["keyword", "environment"])
def test_inflation_stops_at_the_limit_and_names_the_knobs(tmp_path, monkeypatch, how):
    path = _gzip_of_spaces(tmp_path / "rank0.json.gz", 64)
    assert path.stat().st_size < 1 << 20  # a small file ...
    if how == "keyword":
        call = lambda: nbt.load_trace(path, max_bytes="16MiB")  # noqa: E731
    else:
        monkeypatch.setenv("NBT_MAX_READ_BYTES", "16MiB")
        call = lambda: nbt.load_trace(path)  # noqa: E731
    with pytest.raises(TraceError) as info:
        call()
    message = str(info.value)
    assert "rank0.json.gz" in message and "16.00 MiB" in message  # the limit ...
    import re

    reached = re.search(r"stopped reading after ([\d.]+) MiB", message)  # ... and the size reached
    assert reached is not None and 16 < float(reached.group(1)) <= 20, message  # one 4 MiB piece over
    assert "NBT_MAX_READ_BYTES" in message and "max_bytes=" in message


def test_a_bad_limit_is_a_usage_error(tmp_path, monkeypatch):
    path = _write(tmp_path / "rank0.json", _doc([_event()]))
    with pytest.raises(nbt.NbtUsageError, match="max_bytes"):
        nbt.load_trace(path, max_bytes=-1)
    monkeypatch.setenv("NBT_MAX_READ_BYTES", "lots")
    with pytest.raises(nbt.NbtUsageError, match="NBT_MAX_READ_BYTES='lots'"):
        nbt.load_trace(path)


def test_whitespace_only_is_no_json_value_not_an_empty_file(tmp_path):
    plain = tmp_path / "rank0.json"
    plain.write_bytes(b" \n\t" * 100_000)
    message = _raises(plain, "rank0.json", "no JSON value", "whitespace")
    assert "empty" not in message
    _raises(_gzip_of_spaces(tmp_path / "rank1.json.gz", 8), "rank1.json.gz", "no JSON value", "8.00 MiB")


def test_a_gzip_of_whitespace_inflates_in_bounded_memory(tmp_path):
    """512 MiB of whitespace (an older reader kept all of it, then a copy) under a memory limit."""
    import resource

    from tests._python import run_python

    path = _gzip_of_spaces(tmp_path / "rank0.json.gz", 512)
    code = (
        "import resource, nbtoolkit as nbt\n"
        "from nbtoolkit.trace import kineto\n"  # import everything the load needs before the limit
        "size = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + 256 * 2**20, resource.RLIM_INFINITY))\n"
        "try:\n"
        f"    nbt.load_trace({str(path)!r})\n"
        "except nbt.TraceError as exc:\n"
        "    print('ERROR', exc)\n"
    )
    assert resource.RLIMIT_AS  # Linux/macOS only; the suite runs on Linux
    done = run_python("-c", code, timeout=120)
    assert "no JSON value" in done.stdout and "512.00 MiB" in done.stdout, done.stdout


def test_several_gzip_members_are_read_as_one_stream(tmp_path):
    text = json.dumps(_doc([_event(), _event(name="aten::add", ts=20)])).encode()
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(text[:50]) + gzip.compress(text[50:]))
    assert sorted(nbt.load_trace(path).events[0]["name"]) == ["aten::add", "aten::mm"]


def _dist(rank, world=2, backend="gloo", members=(0, 1)):
    return {
        "rank": rank,
        "world_size": world,
        "backend": backend,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "ranks": list(members)}],
    }


@pytest.mark.parametrize(
    ("other", "expected"),
    [
        ({"world": 8, "members": range(8)}, "world size differs"),
        ({"backend": "nccl"}, "backend differs"),
        ({"members": (1, 0, 2)}, "process group '0' has different members"),
    ],
)
def test_a_folder_mixing_two_jobs_is_refused_naming_the_files(tmp_path, other, expected):
    _write(tmp_path / "job_a_rank0.json", _doc([_event()], distributedInfo=_dist(0)))
    _write(tmp_path / "job_b_rank1.json", _doc([_event()], distributedInfo=_dist(1, **other)))
    message = _raises(tmp_path, "different jobs", expected, "job_a_rank0.json", "job_b_rank1.json")
    assert "folder of their own" in message


def test_a_rank_outside_its_world_is_refused(tmp_path):
    _write(tmp_path / "a.json", _doc([_event()], distributedInfo={"rank": 0, "world_size": 128}))
    _write(tmp_path / "b.json", _doc([_event()], distributedInfo={"rank": 9, "world_size": 8}))
    _raises(tmp_path, "world size differs", "rank 9 (b.json) is not below its world size 8")


def test_ranks_of_one_job_load_together(tmp_path):
    _write(tmp_path / "rank0.json", _doc([_event()], distributedInfo=_dist(0)))
    _write(tmp_path / "rank1.json", _doc([_event()], distributedInfo=_dist(1)))
    _write(tmp_path / "rank2.json", _doc([_event()], distributedInfo={"rank": 2}))  # says less: not compared
    assert nbt.load_trace(tmp_path).ranks == [0, 1, 2]
