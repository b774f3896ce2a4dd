"""load_compile_log under hostile input: wrong types, FIFOs, devices, files over the read limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import nbtoolkit as nbt
from nbtoolkit.compile.log_reader import CompileLogWarning

_LINE = 'V0403 07:28:48.061000 139877824898048 torch/_dynamo/output_graph.py:1139] {"str": ["x", 0]}\n'


@pytest.mark.parametrize("value", [None, 3, ["a.log"]])
def test_a_wrong_type_names_what_was_given(value: object) -> None:
    shown = "None" if value is None else type(value).__name__
    with pytest.raises(nbt.NbtUsageError, match=rf"load_compile_log\(\) takes the path .*got .*{shown}"):
        nbt.load_compile_log(value)  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "dedicated_log_torch_trace_rank_0.log"
    os.mkfifo(fifo)
    with pytest.raises(nbt.CompileLogError, match="named pipe"):
        nbt.load_compile_log(fifo)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused() -> None:
    with pytest.raises(nbt.CompileLogError, match="is a device"):
        nbt.load_compile_log("/dev/zero")


def test_a_log_over_the_limit_is_refused_naming_the_knobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.log"
    path.write_text(_LINE * 20_000)  # about 2 MB
    with pytest.raises(nbt.CompileLogError, match=r"big\.log is 1\.\d\d MiB, over the limit of 1\.00 MiB"):
        nbt.load_compile_log(path, max_bytes="1MiB")
    monkeypatch.setenv("NBT_MAX_READ_BYTES", "1MiB")
    with pytest.raises(nbt.CompileLogError, match="NBT_MAX_READ_BYTES"):
        nbt.load_compile_log(path)
    monkeypatch.delenv("NBT_MAX_READ_BYTES")
    assert nbt.load_compile_log(path).source == str(path)  # under the default limit it reads


# ------------------------------------------------------------------ long lines, records, integers
_PREFIX = "V0403 07:28:48.061000 1 torch/_dynamo/convert_frame.py:1] "


def _record(envelope: dict[str, object], *payload: str) -> str:
    import json

    return _PREFIX + json.dumps(envelope) + "\n" + "".join(f"\t{line}\n" for line in payload)


_START = {"frame_id": 0, "frame_compile_id": 0, "attempt": 0, "dynamo_start": {"stack": []}}
_METRICS = {
    "frame_id": 0, "frame_compile_id": 0, "compilation_metrics": {"co_name": "f", "graph_op_count": 3}
}


def test_a_line_over_the_record_limit_is_skipped_without_being_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBT_MAX_LOG_RECORD_BYTES", "1MiB")
    path = tmp_path / "dedicated_log_torch_trace_rank_0.log"
    huge = _PREFIX + '{"dynamo_start": {"stack": "' + "a" * (3 << 20) + '"}}\n'
    path.write_text(huge + _record(_METRICS))
    with pytest.warns(CompileLogWarning):
        report = nbt.load_compile_log(path)
    assert list(report.compiles["function"]) == ["f"]  # the record after the long line is read
    expected = ":1: a record (its line and payload) longer than the limit NBT_MAX_LOG_RECORD_BYTES=1.00 MiB"
    assert any(expected in n
               for n in report.notes), report.notes


def test_a_payload_over_the_record_limit_drops_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NBT_MAX_LOG_RECORD_BYTES", "1MiB")
    path = tmp_path / "x.log"
    graph = {"frame_id": 0, "frame_compile_id": 0, "dynamo_output_graph": {}, "has_payload": "0"}
    path.write_text(_record(graph, *(["x = torch.add(a, b)" * 100] * 1000)) + _record(_METRICS))
    with pytest.warns(CompileLogWarning):
        report = nbt.load_compile_log(path)
    assert report.graphs.empty and list(report.compiles["function"]) == ["f"]
    assert any("x.log:1: a record" in n and "NBT_MAX_LOG_RECORD_BYTES" in n for n in report.notes)


def test_a_log_of_one_line_over_the_limit_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBT_MAX_LOG_RECORD_BYTES", "1MiB")
    path = tmp_path / "one.log"
    path.write_text(_PREFIX + '{"dynamo_start": {"stack": "' + "a" * (2 << 20))
    with pytest.raises(nbt.CompileLogError, match=r"one\.log: a record .* longer than the limit NBT_MAX_LOG"):
        nbt.load_compile_log(path)


def test_a_two_gigabyte_line_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """A 2 GiB log of one line: the old reader held the line whole (2 GB and more)."""
    from tests._python import read_bounded

    path = tmp_path / "big.log"
    with open(path, "wb") as out:
        out.write((_PREFIX + '{"dynamo_start": {"stack": "').encode())
        out.truncate(2 << 30)  # sparse: the line is NUL characters to the end, with no newline
    out_of = read_bounded("load_compile_log", path, timeout=300)
    assert out_of["outcome"] == "error", out_of
    assert "NBT_MAX_LOG_RECORD_BYTES=256.00 MiB" in str(out_of["message"])
    assert int(out_of["peak_rss"]) < 1.5 * 2**30, out_of  # type: ignore[call-overload]


def test_integers_past_64_bits_are_read_as_absent_with_a_note(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    lines = [
        _record({**_START, "frame_id": 2**63}),
        _record({**_START, "rank": 10**30}),
        _record(
            {
                "frame_id": 0,
                "frame_compile_id": 0,
                "artifact": {"name": "dynamo_graph_break_reason"},
                "has_payload": "0",
            },
            "Graph break in user code at /nowhere/x.py:" + "1" + "0" * 30,
            "Reason: Unsupported: builtin: print",
        ),
        _record({**_METRICS, "frame_compile_id": 10**30,
                 "compilation_metrics": {"co_name": "g", "co_firstlineno": 10**30, "graph_op_count": 2**70}}),
    ]
    (folder / ("rank_" + "9" * 30 + ".log")).write_text("".join(lines))
    report = nbt.load_compile_log(folder)
    notes = " | ".join(report.notes)
    assert "frame_id = 9223372036854775808, which does not fit in 64 bits: read as absent" in notes
    assert "rank = 1e+30" in notes and "frame_compile_id = 1e+30" in notes
    assert "the rank in the name is not below the limit NBT_MAX_WORLD_SIZE" in notes
    assert report.ranks == []
    assert report.breaks["user_line"].isna().all() and list(report.breaks["user_file"]) == ["/nowhere/x.py"]
    assert report.compiles["line"].isna().all() and report.compiles["op_count"].isna().all()
    assert "-/0" in report.compile_ids  # frame_id read as absent


def test_a_payload_nested_past_the_recursion_limit_is_read_as_text(tmp_path: Path) -> None:
    path = tmp_path / "deep.log"
    deep = "[" * 100_000 + "]" * 100_000
    artifact = {
        "frame_id": 0, "frame_compile_id": 0, "artifact": {"name": "recompile_reasons"}, "has_payload": "0"
    }
    path.write_text(_record(artifact, deep) + _record(_METRICS))
    report = nbt.load_compile_log(path)  # json.loads raised RecursionError through the reader
    assert list(report.compiles["function"]) == ["f"]


def test_a_log_of_damaged_records_only_names_the_first_damage(tmp_path: Path) -> None:
    path = tmp_path / "deep.log"
    path.write_text(_PREFIX + '{"frame_id": 0, "x": ' + "[" * 5000 + "]" * 5000 + "}\n")
    with pytest.raises(nbt.CompileLogError, match=r"deep\.log:1: the JSON envelope does not parse \(depth"):
        nbt.load_compile_log(path)
