"""Hostile traces end in one TraceError naming the limit, or a result, in linear time and bounded memory.

Each case is a file this test writes itself: an event name of megabytes of ``{``, a trailer of
``}]`` pairs, a gzip bomb of whitespace, JSON nested thousands deep, a second ``traceEvents``
key, phases outside the Chrome format, a gzip padded with zeros, integers past 64 bits. The
bombs run in a fresh process under an address-space limit (``tests/_python.read_bounded``), so
that unbounded memory fails there instead of taking the test runner down.
"""

from __future__ import annotations

import gzip
import json
import re
import time
import zlib
from pathlib import Path

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError, TraceError
from tests._python import read_bounded


def _event(**over: object) -> dict[str, object]:
    event: dict[str, object] = {
        "ph": "X",
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 1,
        "tid": 1,
        "ts": 10,
        "dur": 5,
    }
    event.update(over)
    return event


def _doc(events: list[dict[str, object]], **top: object) -> bytes:
    return json.dumps({"schemaVersion": 1, "traceEvents": events, **top}).encode()


def _gzip_stream(path: Path, head: bytes, mib_of_spaces: int, tail: bytes = b"") -> Path:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * (1 << 20)
    with open(path, "wb") as out:
        out.write(packer.compress(head))
        for _ in range(mib_of_spaces):
            out.write(packer.compress(block))
        out.write(packer.compress(tail))
        out.write(packer.flush())
    return path


def _fastest_load(path: Path, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        nbt.load_trace(path)
        best = min(best, time.perf_counter() - start)
    return best


# ------------------------------------------------------------------ linear parsing
def _braces_trace(path: Path, mib: float) -> Path:
    name = b"{" * int(mib * (1 << 20))
    path.write_bytes(
        b'{"traceEvents": [{"ph":"X","name":"a","ts":0,"dur":1,"pid":1,"tid":1}, '
        b'{"ph":"X","name":"' + name + b'","ts":1,"dur":1,"pid":1,"tid":1}]}'
    )
    return path


def _false_boundaries_trace(path: Path, mib: float) -> Path:
    """An event name of ``},{`` repeated: every boundary found inside it is a false one."""
    name = b"},{" * int(mib * (1 << 20) / 3)
    path.write_bytes(
        b'{"traceEvents": [{"ph":"X","name":"a","ts":0,"dur":1,"pid":1,"tid":1}, '
        b'{"ph":"X","name":"' + name + b'","ts":1,"dur":1,"pid":1,"tid":1}]}'
    )
    return path


def _closers_trace(path: Path, pairs: int) -> Path:
    path.write_bytes(_doc([_event()])[:-1] + b', "x": "' + b"}]" * pairs + b'"}')
    return path


@pytest.mark.parametrize(
    ("make", "small"),
    [(_braces_trace, 1.0), (_false_boundaries_trace, 1.0), (_closers_trace, 100_000)],
    ids=["event-name-of-braces", "event-name-of-boundaries", "trailer-of-closers"],
)
def test_parsing_time_grows_linearly(tmp_path, monkeypatch, make, small):
    """4x the input takes about 4x the time (the quadratic readers took 16x, and minutes at 64 MiB).

    Small chunks make the reader look for an event boundary after every 64 KiB, as it does after
    every 4 MiB of a real file: a search that starts again from the right each time is quadratic.
    """
    from nbtoolkit.trace import _kineto_json

    monkeypatch.setattr(_kineto_json, "CHUNK_BYTES", 64 << 10)
    one, four = make(tmp_path / "one.json", small), make(tmp_path / "four.json", 4 * small)
    nbt.load_trace(one)  # imports and caches warm
    base = _fastest_load(one)
    ratio = _fastest_load(four) / max(base, 1e-3)
    assert ratio < 9, f"4x the input took {ratio:.1f}x the time ({base:.3f} s at 1x): not linear"


def test_a_name_of_braces_is_read_whole_and_exact(tmp_path):
    path = _braces_trace(tmp_path / "rank0.json", 5)  # longer than a chunk: no boundary inside it
    names = set(nbt.load_trace(path).events[0]["name"].astype(str))
    assert names == {"a", "{" * (5 << 20)}


def test_boundaries_inside_a_name_are_passed_over(tmp_path):
    path = _false_boundaries_trace(tmp_path / "rank0.json", 9)  # two chunks of false boundaries
    names = set(nbt.load_trace(path).events[0]["name"].astype(str))
    assert names == {"a", "},{" * int(9 * (1 << 20) / 3)}


def test_a_name_of_braces_of_64_mib_is_read_within_the_memory_limit(tmp_path):
    out = read_bounded("load_trace", _braces_trace(tmp_path / "rank0.json", 64))
    assert out["outcome"] == "result", out
    assert out["seconds"] < 30, out  # ~2 s on 2 busy cores; the quadratic reader took minutes


def test_chunks_split_between_events_whatever_the_whitespace(tmp_path, monkeypatch):
    """Kineto writes ``},\\n  {``: the boundary is found across whitespace, and nothing is lost."""
    from nbtoolkit.trace import _kineto_json

    monkeypatch.setattr(_kineto_json, "CHUNK_BYTES", 4 << 10)
    events = [_event(ts=i, name=f"op{i}") for i in range(3000)]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=2))
    frame = nbt.load_trace(path).events[0]
    assert len(frame) == 3000 and set(frame["name"].astype(str)) == {f"op{i}" for i in range(3000)}


def test_a_top_level_list_is_streamed_like_the_whole_file_decode(tmp_path, monkeypatch):
    from nbtoolkit.trace import _kineto_json, kineto

    monkeypatch.setattr(_kineto_json, "CHUNK_BYTES", 4 << 10)
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps([_event(ts=i) for i in range(2000)]))
    streamed = nbt.load_trace(path)

    def no_streaming(file, columns):
        raise _kineto_json.StreamingFallback

    monkeypatch.setattr(kineto, "stream_file", no_streaming)
    whole = nbt.load_trace(path)
    assert streamed.events[0].equals(whole.events[0])
    assert streamed.info[0].trace_format == whole.info[0].trace_format == "chrome-array"


def test_a_value_of_the_wrong_type_names_the_event_in_the_file(tmp_path, monkeypatch):
    from nbtoolkit.trace import _kineto_json

    monkeypatch.setattr(_kineto_json, "CHUNK_BYTES", 4 << 10)
    events = [_event(ts=i) for i in range(2000)]
    events[1500]["ts"] = "soon"
    path = tmp_path / "rank0.json"
    path.write_bytes(_doc(events))
    with pytest.raises(TraceError, match=r"wrong type .*\$\.traceEvents\[1500\]\.ts"):
        nbt.load_trace(path)


# ------------------------------------------------------------------ bombs
@pytest.mark.parametrize(
    "head", [b'{"traceEvents": [', b"[", b'{"traceEvents": [{"ph":"X","name":"a","ts":1,"dur":1},']
)
def test_a_gzip_bomb_of_whitespace_stops_at_the_event_limit(tmp_path, head):
    """1 MB of gzip, 1 GiB of spaces: an older reader took 12 s and 3.2 GB before saying "truncated"."""
    path = _gzip_stream(tmp_path / "rank0.json.gz", head, 1024)
    assert path.stat().st_size < 2 << 20
    out = read_bounded("load_trace", path)
    assert out["outcome"] == "error", out
    message = str(out["message"])
    assert "rank0.json.gz" in message and "NBT_MAX_EVENT_BYTES=256.00 MiB" in message, message
    assert "without an event boundary" in message
    assert out["seconds"] < 30 and int(out["peak_rss"]) < 1.5 * 2**30, out  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("head", "tail", "expected"),
    [
        (b'{"traceEvents":', b"null}", "no 'traceEvents' list in its 1.00 GiB of JSON"),
        (b'{"x": {"traceEvents": 1}, "big": "', b'"}', "no 'traceEvents' list in its first"),
        (b'{"traceEvents": [{"ph": "X" "name": "a"}, {"ph": "X"}, ', b"]}", "malformed"),
    ],
    ids=["spaces-after-the-key", "a-nested-key-then-a-long-string", "a-syntax-error-then-spaces"],
)
def test_a_document_the_stream_cannot_place_is_never_read_whole(tmp_path, head, tail, expected):
    """Each of these once sent the reader to decode the whole file: 1 GiB of spaces, held twice."""
    path = _gzip_stream(tmp_path / "rank0.json.gz", head, 1024, tail)
    out = read_bounded("load_trace", path)
    assert out["outcome"] == "error" and expected in str(out["message"]), out
    assert out["seconds"] < 30 and int(out["peak_rss"]) < 1.5 * 2**30, out  # type: ignore[call-overload]


def test_a_gzip_cut_short_after_many_events_is_one_error_without_a_second_read(tmp_path, monkeypatch):
    from nbtoolkit.trace import _kineto_json

    whole = gzip.compress(_doc([_event(ts=i) for i in range(20_000)]))
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(whole[: len(whole) * 3 // 4])

    def no_second_read(file):
        raise AssertionError("the file was read whole a second time")

    monkeypatch.setattr(_kineto_json, "read_all", no_second_read)
    with pytest.raises(TraceError, match="the gzip stream is truncated or corrupt"):
        nbt.load_trace(path)


def test_a_large_json_that_is_no_trace_is_skipped_in_a_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("NBT_MAX_EVENT_BYTES", "1MiB")
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(_doc([_event()]))
    (folder / "execution_trace.json").write_bytes(b'{"nodes": [' + b"1, " * (1 << 20) + b"1]}")
    trace = nbt.load_trace(folder)
    assert trace.ranks == [0]
    assert any("skipped execution_trace.json: no 'traceEvents' list" in n for n in trace.notes), trace.notes


def test_the_event_limit_is_raisable(tmp_path, monkeypatch):
    path = _braces_trace(tmp_path / "rank0.json", 3)
    monkeypatch.setenv("NBT_MAX_EVENT_BYTES", "1MiB")
    with pytest.raises(TraceError, match=r"NBT_MAX_EVENT_BYTES=1\.00 MiB") as info:
        nbt.load_trace(path)
    assert "raise it" in str(info.value)
    monkeypatch.setenv("NBT_MAX_EVENT_BYTES", "8MiB")
    assert len(nbt.load_trace(path).events[0]) == 2


def test_a_document_without_trace_events_is_not_searched_forever(tmp_path, monkeypatch):
    monkeypatch.setenv("NBT_MAX_EVENT_BYTES", "1MiB")
    path = _gzip_stream(tmp_path / "rank0.json.gz", b'{"nodes": "', 4, b'"}')
    with pytest.raises(TraceError, match=r"no 'traceEvents' list in its first .*NBT_MAX_EVENT_BYTES"):
        nbt.load_trace(path)


# ------------------------------------------------------------------ nesting
@pytest.mark.parametrize("where", ["in an event's args", "in a document field", "in a top-level list"])
def test_json_nested_past_the_depth_limit_is_one_trace_error(tmp_path, where):
    deep = "[" * 5000 + "]" * 5000
    if where == "in an event's args":
        text = _doc([_event(args={"x": 0})]).decode().replace('{"x": 0}', '{"x": ' + deep + "}")
    elif where == "in a document field":
        text = _doc([_event()]).decode()[:-1] + ', "extra": ' + deep + "}"
    else:
        text = json.dumps([_event(), _event(args={"x": 0})]).replace('{"x": 0}', '{"x": ' + deep + "}")
    path = tmp_path / "rank0.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=r"more than 1,000 levels deep.*NBT_MAX_JSON_DEPTH=1,000"):
        nbt.load_trace(path)


def test_the_depth_limit_is_raisable_and_bounded(tmp_path, monkeypatch):
    path = tmp_path / "rank0.json"
    path.write_text(
        _doc([_event(args={"x": 0})]).decode().replace('{"x": 0}', '{"x": ' + "[" * 1500 + "]" * 1500 + "}")
    )
    with pytest.raises(TraceError, match="NBT_MAX_JSON_DEPTH"):
        nbt.load_trace(path)
    monkeypatch.setenv("NBT_MAX_JSON_DEPTH", "2000")
    assert len(nbt.load_trace(path).events[0]) == 1
    monkeypatch.setenv("NBT_MAX_JSON_DEPTH", "1000000")  # the C decoders would overflow the stack
    with pytest.raises(NbtUsageError, match="NBT_MAX_JSON_DEPTH='1000000' is over 10,000"):
        nbt.load_trace(path)


def test_the_depth_limit_holds_after_a_library_raised_the_recursion_limit(tmp_path):
    """torch.compile raises the process's recursion limit; the configured JSON depth must still hold."""
    import sys

    path = tmp_path / "rank0.json"
    path.write_text(
        _doc([_event(args={"x": 0})]).decode().replace('{"x": 0}', '{"x": ' + "[" * 1500 + "]" * 1500 + "}")
    )
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)
    try:
        with pytest.raises(TraceError, match="NBT_MAX_JSON_DEPTH"):
            nbt.load_trace(path)
        assert sys.getrecursionlimit() == 50_000  # the caller's limit is given back
    finally:
        sys.setrecursionlimit(old)


# ------------------------------------------------------------------ integers past 64 bits
def test_a_step_number_past_64_bits_is_a_trace_error(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_bytes(_doc([_event(name="ProfilerStep#" + "9" * 40, cat="user_annotation")]))
    with pytest.raises(TraceError, match="step number of 40 digits, which does not fit in 64 bits"):
        nbt.load_trace(path)


def test_a_rank_or_world_past_the_limit_is_not_believed_and_noted(tmp_path):
    path = tmp_path / "trace_rank3.json"
    path.write_bytes(_doc([_event()], distributedInfo={"rank": 2**64, "world_size": 10**12}))
    trace = nbt.load_trace(path)
    assert trace.ranks == [3]  # from the file name, as for a trace without distributedInfo.rank
    info = trace.info[3]
    assert info.world_size is None
    notes = " | ".join(info.notes)
    assert "distributedInfo.rank 18446744073709551616 is not believed" in notes
    assert "world_size 1000000000000 is not believed" in notes and "NBT_MAX_WORLD_SIZE" in notes


def test_a_world_of_a_trillion_does_not_size_the_missing_ranks(tmp_path):
    """summarize_traces listed missing ranks with set(range(world)): 10**12 never ended."""
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(_doc([_event()], distributedInfo={"rank": 0, "world_size": 10**12}))
    start = time.perf_counter()
    summary = nbt.summarize_traces(folder)
    assert time.perf_counter() - start < 30
    assert summary.world_size in (None, 1) and not summary.missing_ranks


def test_a_rank_file_name_of_30_digits_is_no_rank(tmp_path):
    path = tmp_path / ("rank_" + "9" * 30 + ".json")
    path.write_bytes(_doc([_event()]))
    trace = nbt.load_trace(path)
    assert trace.ranks == [0] and "rank unknown" in trace.info[0].notes[0]


# ------------------------------------------------------------------ accepted silently before
def _two_lists(first: int) -> bytes:
    return (
        _doc([_event(ts=i) for i in range(first)])[:-1]
        + b', "traceEvents": '
        + json.dumps([_event(ts=9999)]).encode()
        + b"}"
    )


@pytest.mark.parametrize("streaming", [True, False])
def test_a_second_trace_events_key_is_refused(tmp_path, monkeypatch, streaming):
    from nbtoolkit.trace import _kineto_json, kineto

    if not streaming:

        def no_streaming(file, columns):
            raise _kineto_json.StreamingFallback

        monkeypatch.setattr(kineto, "stream_file", no_streaming)
    path = tmp_path / "rank0.json"
    path.write_bytes(_two_lists(2059))
    with pytest.raises(TraceError, match="has 2 'traceEvents' lists; JSON readers keep only the last"):
        nbt.load_trace(path)


def test_a_nested_trace_events_list_before_the_documents_is_passed_over(tmp_path, monkeypatch):
    from nbtoolkit.trace import _kineto_json

    monkeypatch.setattr(_kineto_json, "CHUNK_BYTES", 4 << 10)
    events = [_event(ts=i) for i in range(2000)]
    text = json.dumps({"meta": {"traceEvents": [{"a": 1}, {"b": 2}]}, "traceEvents": events})
    path = tmp_path / "rank0.json"
    path.write_text(text)
    assert len(nbt.load_trace(path).events[0]) == 2000


def test_the_key_named_in_an_event_is_no_second_list(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_bytes(_doc([_event(name='"traceEvents"'), _event(args={"traceEvents": 1})]))
    assert len(nbt.load_trace(path).events[0]) == 2


@pytest.mark.parametrize("streaming", [True, False])
def test_unknown_phases_are_skipped_with_a_note_naming_them(tmp_path, monkeypatch, streaming):
    from nbtoolkit.trace import _kineto_json, kineto

    if not streaming:

        def no_streaming(file, columns):
            raise _kineto_json.StreamingFallback

        monkeypatch.setattr(kineto, "stream_file", no_streaming)
    monkeypatch.setattr(_kineto_json, "CHUNK_BYTES", 4 << 10)
    events = [_event(ts=i) for i in range(1000)] + [_event(ph="Z")] * 3 + [_event(ph="xx")]
    events += [{k: v for k, v in _event().items() if k != "ph"}, _event(ph="i")]
    path = tmp_path / "rank0.json"
    path.write_bytes(_doc(events))
    trace = nbt.load_trace(path)
    assert len(trace.events[0]) == 1000
    note = next(n for n in trace.info[0].notes if "phase" in n)
    assert "skipped 5 event(s)" in note and "'Z' (3)" in note and "'xx' (1)" in note and "'' (1)" in note
    assert "'i'" not in note  # an instant event is of the format, only not used


def test_a_trace_without_unknown_phases_has_no_such_note(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_bytes(_doc([_event(), _event(ph="i"), _event(ph="M", name="thread_name", args={"name": "x"})]))
    assert not any("phase" in n for n in nbt.load_trace(path).info[0].notes)


def test_a_gzip_padded_with_zeros_is_read_as_gzip_reads_it(tmp_path):
    text = _doc([_event(), _event(ts=20)])
    padded = gzip.compress(text) + b"\0" * 5000
    assert gzip.decompress(padded) == text  # Python's gzip skips the padding, as gzip(1) does
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(padded)
    assert len(nbt.load_trace(path).events[0]) == 2
    between = gzip.compress(text[:50]) + b"\0" * 3000 + gzip.compress(text[50:])
    assert gzip.decompress(between) == text  # zeros between members too
    path.write_bytes(between)
    assert len(nbt.load_trace(path).events[0]) == 2
    path.write_bytes(gzip.compress(text) + b"\0" * 10 + b"garbage")  # not padding: still refused
    with pytest.raises(TraceError, match="truncated or corrupt"):
        nbt.load_trace(path)


# ------------------------------------------------------------------ encodings and literals
def test_a_utf8_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_bytes(b"\xef\xbb\xbf" + _doc([_event()]))
    assert len(nbt.load_trace(path).events[0]) == 1
    gz = tmp_path / "rank1.json.gz"
    gz.write_bytes(gzip.compress(b"\xef\xbb\xbf" + _doc([_event()])))
    assert len(nbt.load_trace(gz).events[1]) == 1


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_doc([_event()]).decode().encode("utf-16"), "UTF-16 (or UTF-32) text"),
        (_doc([_event()]).decode().encode("utf-16-le"), "UTF-16 (or UTF-32) text"),
        (gzip.compress(_doc([_event()])), "gzip-compressed twice"),
        (_doc([_event()]).replace(b'"ts": 10', b'"ts": NaN'), "literal NaN near byte"),
        (_doc([_event()]).replace(b'"dur": 5', b'"dur": -Infinity'), "literal -Infinity near byte"),
    ],
    ids=["utf-16", "utf-16-le", "gzip-twice", "NaN", "-Infinity"],
)
def test_malformed_json_says_why(tmp_path, data, expected):
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(data))
    with pytest.raises(TraceError, match=re.escape(expected)):
        nbt.load_trace(path)
