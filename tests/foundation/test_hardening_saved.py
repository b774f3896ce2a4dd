"""Paths and saved results under careless or hostile use (issue 32, item 10): one clear NbtError each.

Paths: every public function taking a path refuses an 8,000-character path, ``~user`` of a user
that does not exist and a NUL byte with one error naming the (shortened) path. Saved results:
a tampered folder fails at load (naming the file and the problem), never later in an analysis;
saving where a file or another kind of result is in the way is a SaveError. The fuzz of the same
(test_hardening_saved_fuzz.py) covers many more tamperings; these are the named cases.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtError, NbtUsageError, SaveError, SnapshotError, TraceError


# ------------------------------------------------------------------ small results, made here
def _trace_file(folder: Path) -> Path:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "record_param_comms",
            "pid": 1,
            "tid": 1,
            "ts": 20,
            "dur": 5,
            "args": {
                "Collective name": "allreduce",
                "In msg nelems": 4,
                "Out msg nelems": 4,
                "Group size": 2,
                "dtype": "Float",
            },
        },
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rank0.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def _snapshot() -> nbt.MemorySnapshot:
    frames = [{"filename": "train.py", "line": 3, "name": "step"}]
    segment = {
        "device": 0,
        "address": 0,
        "total_size": 4096,
        "allocated_size": 1024,
        "active_size": 1024,
        "requested_size": 1000,
        "stream": 0,
        "segment_type": "large",
        "blocks": [
            {
                "address": 0,
                "size": 1024,
                "requested_size": 1000,
                "state": "active_allocated",
                "frames": frames,
            },
            {"address": 1024, "size": 3072, "requested_size": 3072, "state": "inactive", "frames": []},
        ],
    }
    trace = [{"action": "alloc", "addr": 0, "size": 1024, "time_us": 10, "frames": frames}]
    return nbt.load_memory_snapshot({"segments": [segment], "device_traces": [trace]})


def _timeline() -> nbt.MemoryTimeline:
    return nbt.MemoryTimeline(
        events=pd.DataFrame(
            {
                "time_us": [0.0, 5.0],
                "action": ["alloc", "free"],
                "delta_bytes": [64, -64],
                "category": ["activation", "activation"],
                "tensor": [1, 1],
                "stack_id": [0, 0],
            }
        ),
        stacks=["train.py:3 in step"],
    )


def _graphs() -> nbt.GraphReport:
    from nbtoolkit.compile.schema import FRAME_COLUMNS

    frames = {
        name: pd.DataFrame({c: pd.Series(dtype=t) for c, t in cols.items()})
        for name, cols in FRAME_COLUMNS.items()
    }
    frames["graphs"] = pd.DataFrame(
        [
            {
                "graph": 0,
                "rank": None,
                "compile_id": "0/0",
                "frame_id": 0,
                "frame_compile_id": 0,
                "attempt": 0,
                "function": "step",
                "file": "train.py",
                "line": 3,
                "op_count": 2,
                "node_count": 4,
                "compile_time_s": 0.5,
                "backend_compile_time_s": 0.1,
                "fx_code": "def forward(x): ...",
            }
        ]
    ).astype(FRAME_COLUMNS["graphs"])
    return nbt.GraphReport(**frames, compile_ids=["0/0"], source="test")


@pytest.fixture
def saved(tmp_path: Path) -> dict[str, Path]:
    return {
        "trace": nbt.load_trace(_trace_file(tmp_path / "traces")).save(tmp_path / "trace"),
        "snapshot": _snapshot().save(tmp_path / "snapshot"),
        "graphs": _graphs().save(tmp_path / "graphs"),
        "timeline": _timeline().save(tmp_path / "timeline.parquet"),
    }


_LOAD: dict[str, tuple[Callable[[Any], Any], type[NbtError]]] = {
    "trace": (nbt.Trace.load, TraceError),
    "snapshot": (nbt.MemorySnapshot.load, SnapshotError),
    "graphs": (nbt.GraphReport.load, NbtUsageError),
    "timeline": (nbt.MemoryTimeline.load, SnapshotError),
}


def _edit_json(path: Path, edit: Callable[[Any], Any]) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _edit_column(path: Path, name: str, new: Callable[[pa.ChunkedArray], pa.Array]) -> None:
    table = pq.read_table(path)
    index = table.schema.get_field_index(name)
    column = new(table.column(index))
    pq.write_table(table.set_column(index, pa.field(name, column.type), column), path)


# ------------------------------------------------------------------ paths
_LOADERS: dict[str, tuple[Callable[[Any], Any], type[NbtError]]] = {
    "load_trace": (nbt.load_trace, TraceError),
    "load_compile_log": (nbt.load_compile_log, nbt.CompileLogError),
    "load_memory_snapshot": (nbt.load_memory_snapshot, SnapshotError),
    "load_memory_timeline": (nbt.load_memory_timeline, SnapshotError),
    "summarize_traces": (nbt.summarize_traces, TraceError),
    "Trace.load": (nbt.Trace.load, TraceError),
    "MemorySnapshot.load": (nbt.MemorySnapshot.load, SnapshotError),
    "GraphReport.load": (nbt.GraphReport.load, NbtUsageError),
    "MemoryTimeline.load": (nbt.MemoryTimeline.load, SnapshotError),
    "StepMetrics.load": (nbt.StepMetrics.load, NbtUsageError),
    "load_rank_snapshots": (nbt.load_rank_snapshots, SnapshotError),
    "load_flight_recorder": (nbt.load_flight_recorder, TraceError),
}
_BAD_PATHS = {
    "8000 characters": ("a" * 8000, r"^a{59}…a{59} \(8,000 characters\): the path is 8,000 bytes long"),
    "a 300-byte name": (
        "x/" + "é" * 150,
        r"one name in the path is 300 bytes long; a file or folder name holds at most 255",
    ),
    "6001-character path": (
        "a/" * 3000 + "b",
        r"the path is 6,001 bytes long; the system takes at most 4,095",
    ),
    "no such user": ("~nosuchuser_nbt/x.json", r"cannot expand '~nosuchuser_nbt' \(no user 'nosuchuser_nbt'"),
    "NUL byte": ("trace\x00.json", r"trace\\x00\.json: the path holds a NUL byte"),
}


@pytest.mark.parametrize("bad", list(_BAD_PATHS))
@pytest.mark.parametrize("loader", list(_LOADERS))
def test_a_bad_path_is_one_error_naming_it(loader: str, bad: str) -> None:
    function, error = _LOADERS[loader]
    path, message = _BAD_PATHS[bad]
    with pytest.raises(error, match=message) as raised:
        function(path)
    assert len(str(raised.value)) < 400  # the path is shortened, not repeated whole


@pytest.mark.parametrize("bad", list(_BAD_PATHS))
def test_a_bad_path_to_save_to_is_a_save_error(tmp_path: Path, bad: str) -> None:
    path, message = _BAD_PATHS[bad]
    for result in (nbt.load_trace(_trace_file(tmp_path)), _snapshot(), _graphs(), _timeline()):
        with pytest.raises(SaveError, match=message):
            result.save(path)


def test_a_bad_report_path_is_one_usage_error() -> None:
    with pytest.raises(NbtUsageError, match="NUL byte"):
        nbt.report(_timeline(), path="r\x00.html")


def test_a_relative_path_is_read_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = nbt.load_trace(_trace_file(tmp_path / "traces")).save(tmp_path / "rel")
    monkeypatch.chdir(tmp_path)
    assert nbt.Trace.load("rel").ranks == [0]
    monkeypatch.chdir(folder)
    with pytest.raises(TraceError, match=r"^rel: no such folder"):
        nbt.Trace.load("rel")


# ------------------------------------------------------------------ tampered saved results (issue cases)
def test_trace_metadata_without_ranks_as_a_list_or_with_a_bad_rank(saved: dict[str, Path]) -> None:
    meta = saved["trace"] / "trace.json"
    original = meta.read_text()
    _edit_json(meta, lambda d: {k: v for k, v in d.items() if k != "ranks"})
    with pytest.raises(TraceError, match=r"trace\.json: the key 'ranks' is missing"):
        nbt.Trace.load(saved["trace"])
    meta.write_text("[]")
    with pytest.raises(TraceError, match=r"trace\.json: the saved Trace is damaged: it holds a JSON list"):
        nbt.Trace.load(saved["trace"])
    meta.write_text(original)
    _edit_json(meta, lambda d: {**d, "ranks": [{**d["ranks"][0], "rank": "0"}]})
    with pytest.raises(TraceError, match=r"ranks\[0\]: 'rank' should be an integer from 0 .*got string"):
        nbt.Trace.load(saved["trace"])
    meta.write_text(original)
    _edit_json(meta, lambda d: {**d, "ranks": [{**d["ranks"][0], "thread_names": [1]}]})
    with pytest.raises(TraceError, match=r"'thread_names' should be an object"):
        nbt.Trace.load(saved["trace"])


def test_an_extra_key_in_saved_metadata_is_left_out(saved: dict[str, Path]) -> None:
    meta = saved["trace"] / "trace.json"
    want = nbt.Trace.load(saved["trace"])
    _edit_json(meta, lambda d: {**d, "newer": 1, "ranks": [{**d["ranks"][0], "from_a_newer_version": True}]})
    got = nbt.Trace.load(saved["trace"])
    assert got.info == want.info
    pd.testing.assert_frame_equal(got.events[0], want.events[0])


@pytest.mark.parametrize("kind", list(_LOAD))
def test_a_damaged_parquet_names_the_file(saved: dict[str, Path], kind: str) -> None:
    load, error = _LOAD[kind]
    path = saved[kind] if kind == "timeline" else sorted(saved[kind].glob("*.parquet"))[0]
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(error, match=rf"{path.name}.*(not a readable Parquet|Parquet)"):
        load(saved[kind])


@pytest.mark.parametrize("kind", ["trace", "snapshot", "graphs"])
def test_damaged_metadata_json_names_the_file(saved: dict[str, Path], kind: str) -> None:
    load, error = _LOAD[kind]
    meta = next(p for p in saved[kind].glob("*.json"))
    meta.write_text(meta.read_text()[:-3])
    with pytest.raises(error, match=rf"{meta.name}: the saved \w+ is damaged: not valid JSON"):
        load(saved[kind])
    meta.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(error, match=r"nested too deeply|JSON list"):
        load(saved[kind])


def test_snapshot_sizes_as_strings_or_a_dropped_column_fail_at_load(saved: dict[str, Path]) -> None:
    blocks = saved["snapshot"] / "blocks.parquet"
    original = blocks.read_bytes()
    _edit_column(blocks, "size", lambda c: pa.array([str(v) for v in c.to_pylist()]))
    with pytest.raises(
        SnapshotError, match=r"blocks\.parquet: .* the column 'size' holds string, where integers"
    ):
        nbt.MemorySnapshot.load(saved["snapshot"])
    blocks.write_bytes(original)
    table = pq.read_table(blocks)
    pq.write_table(table.drop_columns(["requested_size"]), blocks)
    with pytest.raises(SnapshotError, match=r"the column 'requested_size' is missing"):
        nbt.MemorySnapshot.load(saved["snapshot"])
    blocks.write_bytes(original)
    _edit_column(blocks, "stack_id", lambda c: pa.array([7] * len(c)))
    with pytest.raises(SnapshotError, match=r"'stack_id' are outside \[-1, 1\)"):
        nbt.MemorySnapshot.load(saved["snapshot"])
    blocks.write_bytes(original)
    _edit_json(saved["snapshot"] / "snapshot.json", lambda d: [d])
    with pytest.raises(
        SnapshotError, match=r"snapshot\.json: the saved MemorySnapshot is damaged: .*JSON list"
    ):
        nbt.MemorySnapshot.load(saved["snapshot"])


def test_trace_events_out_of_order_or_a_collective_row_past_the_events(saved: dict[str, Path]) -> None:
    events = saved["trace"] / "rank0.events.parquet"
    original = events.read_bytes()
    _edit_column(events, "ts", lambda c: pa.array(list(reversed(c.to_pylist())), pa.float64()))
    with pytest.raises(TraceError, match="events are not in time order"):
        nbt.Trace.load(saved["trace"])
    events.write_bytes(original)
    _edit_column(events, "dur", lambda c: pa.array([float("nan")] * len(c)))
    with pytest.raises(TraceError, match="missing, infinite or negative time or duration"):
        nbt.Trace.load(saved["trace"])
    events.write_bytes(original)
    _edit_column(events, "ts", lambda c: pa.nulls(len(c)))  # all null: a number column of nothing
    with pytest.raises(TraceError, match="missing, infinite or negative time or duration"):
        nbt.Trace.load(saved["trace"])
    events.write_bytes(original)
    _edit_column(saved["trace"] / "rank0.collectives.parquet", "row", lambda c: pa.array([10**6] * len(c)))
    with pytest.raises(TraceError, match=r"rank0\.collectives\.parquet: .*'row' are outside"):
        nbt.Trace.load(saved["trace"])


def test_graph_report_metadata_of_the_wrong_type(saved: dict[str, Path]) -> None:
    _edit_json(saved["graphs"] / "report.json", lambda d: {**d, "steps": "many"})
    with pytest.raises(NbtUsageError, match=r"report\.json: 'steps' should be an integer, got string"):
        nbt.GraphReport.load(saved["graphs"])


def test_memory_timeline_metadata_damaged_or_a_list(saved: dict[str, Path]) -> None:
    path = saved["timeline"]
    table = pq.read_table(path)
    for raw, message in ((b"{", "metadata is damaged"), (b"[1]", "metadata is a JSON list")):
        pq.write_table(table.replace_schema_metadata({b"nbtoolkit": raw}), path)
        with pytest.raises(SnapshotError, match=message):
            nbt.MemoryTimeline.load(path)
    meta = json.loads(table.schema.metadata[b"nbtoolkit"])
    pq.write_table(
        table.replace_schema_metadata({b"nbtoolkit": json.dumps({**meta, "stacks": {}}).encode()}), path
    )
    with pytest.raises(SnapshotError, match=r"'stacks' should be a list"):
        nbt.MemoryTimeline.load(path)
    pq.write_table(table.drop_columns(["delta_bytes"]), path)
    with pytest.raises(SnapshotError, match=r"the column 'delta_bytes' is missing"):
        nbt.MemoryTimeline.load(path)


def test_an_edited_summary_cache_is_read_again_with_a_note(tmp_path: Path) -> None:
    folder = _trace_file(tmp_path / "traces").parent
    want = nbt.summarize_traces(folder, cache=True, workers=1)
    (cached,) = (folder / ".nbt-cache").glob("*.summary.json")
    _edit_json(
        cached, lambda d: {**d, "records": {k: v for k, v in d["records"].items() if k != "step_labels"}}
    )
    got = nbt.summarize_traces(folder, cache=True, workers=1)
    pd.testing.assert_frame_equal(got.overlap, want.overlap)
    assert got.step_labels == want.step_labels == ["ProfilerStep#1"]
    assert any("'step_labels' is not a list of strings; read rank0.json again" in n for n in got.notes)
    again = nbt.summarize_traces(folder, cache=True, workers=1)  # the cache was written anew
    assert not any("cached summary" in n for n in again.notes)


# ------------------------------------------------------------------ saving and loading the wrong thing
@pytest.mark.parametrize("kind", ["trace", "snapshot", "graphs"])
def test_loading_a_folder_of_another_kind_names_it(saved: dict[str, Path], kind: str) -> None:
    load, error = _LOAD[kind]
    other = "snapshot" if kind != "snapshot" else "trace"
    with pytest.raises(error, match=rf"holds a saved {'MemorySnapshot' if other == 'snapshot' else 'Trace'}"):
        load(saved[other])


def test_saving_into_a_file_or_over_another_kind_is_a_save_error(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    file = tmp_path / "a_file"
    file.write_text("keep me")
    trace = nbt.Trace.load(saved["trace"])
    with pytest.raises(SaveError, match=r"a_file: it is a file; a saved Trace is a folder") as raised:
        trace.save(file)
    assert isinstance(raised.value, OSError)  # the caches take it as "not cached this time"
    assert file.read_text() == "keep me"
    with pytest.raises(SaveError, match=r"it holds a saved MemorySnapshot .*Give another folder"):
        trace.save(saved["snapshot"])
    assert not (saved["snapshot"] / "trace.json").exists()
    with pytest.raises(SaveError, match="it is a folder; give a file name"):
        _timeline().save(saved["snapshot"])
    with pytest.raises(SaveError, match=r"a_file/x: .*(Not a directory|a part of the path is a file)"):
        _snapshot().save(file / "x")


def test_saving_over_the_same_kind_replaces_it(saved: dict[str, Path]) -> None:
    snapshot = _snapshot()
    snapshot.notes.append("second")
    again = nbt.MemorySnapshot.load(snapshot.save(saved["snapshot"]))
    assert again.notes[-1] == "second"


def test_a_timeline_saved_into_a_new_folder_makes_it(tmp_path: Path) -> None:
    path = _timeline().save(tmp_path / "new" / "deeper" / "t.parquet")
    assert nbt.MemoryTimeline.load(path).peak_bytes == 64


def test_unicode_and_newlines_in_names_round_trip(tmp_path: Path) -> None:
    folder = tmp_path / "résumé\nrun 🙂"
    trace = nbt.load_trace(_trace_file(tmp_path / "traces"))
    again = nbt.Trace.load(trace.save(folder))
    assert again.ranks == [0]
    with pytest.raises(TraceError, match=r"résumé\\nrun 🙂/nope: no such folder"):  # the newline escaped
        nbt.Trace.load(folder / "nope")


def test_a_read_only_folder_is_a_save_error(tmp_path: Path) -> None:
    """Saving into a folder without write permission is one SaveError naming the cause.

    Root writes anywhere (CAP_DAC_OVERRIDE), so as root the save runs in a fresh process whose
    bounding set lacks the two DAC capabilities (util-linux ``setpriv``): the same check a
    non-root user meets.
    """
    import shutil
    import subprocess
    import sys

    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    code = (
        "import sys, pandas as pd, nbtoolkit as nbt\n"
        "tl = nbt.MemoryTimeline(events=pd.DataFrame({'time_us': [0.0], 'action': ['alloc'], "
        "'delta_bytes': [64], 'category': ['activation'], 'tensor': [1], 'stack_id': [0]}), stacks=['x'])\n"
        "try:\n    tl.save(sys.argv[1])\nexcept nbt.NbtError as exc:\n    print(type(exc).__name__, exc)\n"
    )
    command = [sys.executable, "-c", code, str(folder / "t.parquet")]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "running as root needs util-linux's setpriv to drop CAP_DAC_OVERRIDE"
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    finally:
        folder.chmod(0o700)
    assert done.stdout.startswith("SaveError") and "Permission denied" in done.stdout, (
        done.stdout + done.stderr
    )
    assert not (folder / "t.parquet").exists()


def test_parquet_with_a_newer_writers_metadata_loads(saved: dict[str, Path]) -> None:
    events = saved["trace"] / "rank0.events.parquet"
    want = nbt.Trace.load(saved["trace"])
    table = pq.read_table(events)
    pq.write_table(
        table.replace_schema_metadata({b"pandas": b"{not json", b"org.newer.writer": b"\xff"}), events
    )
    pd.testing.assert_frame_equal(nbt.Trace.load(saved["trace"]).events[0], want.events[0])


# ------------------------------------------------------------------ more careless and hostile cases
def test_a_path_of_the_wrong_type_is_a_usage_error(saved: dict[str, Path]) -> None:
    trace = nbt.Trace.load(saved["trace"])
    for call in (lambda: trace.save(None), lambda: nbt.Trace.load(5), lambda: _timeline().save(["t"])):
        with pytest.raises(NbtUsageError, match=r"expected a path \(a str or pathlib\.Path\), got"):
            call()


def test_a_symlink_loop_is_named(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(TraceError, match="loop is a symbolic link that leads nowhere"):
        nbt.Trace.load(loop)
    with pytest.raises(SaveError, match="loop is a symbolic link that leads nowhere"):
        _snapshot().save(loop)


def test_saving_to_a_fifo_or_a_device_is_refused_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, Path(os.devnull)):
        with pytest.raises(SaveError, match="it is not a regular file"):
            _timeline().save(target)


def test_a_fifo_in_a_saved_folder_is_refused_not_a_hang(saved: dict[str, Path]) -> None:
    events = saved["trace"] / "rank0.events.parquet"
    events.unlink()
    os.mkfifo(events)
    with pytest.raises(TraceError, match=r"rank0\.events\.parquet: .*not a regular file"):
        nbt.Trace.load(saved["trace"])


def test_a_full_disk_is_one_error_with_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    with pytest.raises(
        SaveError, match=r"into .*snap: No space left on device \(the disk is full: free some"
    ):
        _snapshot().save(tmp_path / "snap")


def test_saving_over_a_foreign_file_of_the_same_name_is_refused(tmp_path: Path) -> None:
    run = _trace_file(tmp_path / "run").parent
    (run / "rank0.json").rename(run / "trace.json")  # a profiler trace that happens to be named trace.json
    before = (run / "trace.json").read_bytes()
    trace = nbt.load_trace(run)
    with pytest.raises(
        SaveError, match=r"its trace\.json was not written by nbtoolkit, and saving would overwrite"
    ):
        trace.save(run)
    assert (run / "trace.json").read_bytes() == before


def test_the_metadata_file_given_for_its_folder(saved: dict[str, Path]) -> None:
    folder = saved["trace"]
    with pytest.raises(TraceError, match=rf"trace\.json is a file, not a folder .*give its folder, {folder}"):
        nbt.Trace.load(saved["trace"] / "trace.json")


def test_a_parquet_bomb_is_refused_before_it_is_read(
    saved: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column of one repeated value compresses to nothing: 2 million rows in a file under 1 MB."""
    import numpy as np

    events = saved["trace"] / "rank0.events.parquet"
    table = pq.read_table(events)
    rows = 1_000_000
    bomb = pa.table(
        {
            name: pa.array(np.zeros(rows, dtype="int64" if pa.types.is_integer(kind) else "float64"))
            if not pa.types.is_dictionary(kind)
            else pa.array(["x"] * rows).dictionary_encode()
            for name, kind in zip(table.schema.names, table.schema.types, strict=True)
        }
    )
    with pq.ParquetWriter(events, bomb.schema) as writer:
        writer.write_table(bomb)
        writer.write_table(bomb)
    assert events.stat().st_size < 1_000_000
    monkeypatch.setenv("NBT_MAX_READ_BYTES", "64MiB")
    message = r"holds 2,000,000 rows, about 152\.59 MiB once read, over the read limit of 64\.00 MiB"
    with pytest.raises(TraceError, match=message):
        nbt.Trace.load(saved["trace"])
    monkeypatch.setenv("NBT_MAX_READ_BYTES", "1GiB")
    assert len(nbt.Trace.load(saved["trace"]).events[0]) == 2 * rows  # raised, it loads
    # the limit is read once, in core.bounded, as every reader reads it: a malformed value is named
    monkeypatch.setenv("NBT_MAX_READ_BYTES", "lots")
    with pytest.raises(nbt.NbtUsageError, match=r"NBT_MAX_READ_BYTES='lots' is not a size"):
        nbt.Trace.load(saved["trace"])


def test_text_that_is_not_utf8_fails_at_load_not_in_use(saved: dict[str, Path]) -> None:
    graphs = saved["graphs"] / "graphs.parquet"
    _edit_column(
        graphs, "function", lambda c: pa.array([b"\xff\xfe"] * len(c), pa.binary()).view(pa.string())
    )
    with pytest.raises(NbtUsageError, match=r"graphs\.parquet: .*Invalid UTF8"):
        nbt.GraphReport.load(saved["graphs"])


@pytest.mark.parametrize("kind", list(_LOAD))
def test_a_result_saved_by_a_newer_nbtoolkit_says_upgrade(saved: dict[str, Path], kind: str) -> None:
    load, error = _LOAD[kind]
    if kind == "timeline":
        table = pq.read_table(saved[kind])
        meta = {**json.loads(table.schema.metadata[b"nbtoolkit"]), "version": 2}
        pq.write_table(table.replace_schema_metadata({b"nbtoolkit": json.dumps(meta).encode()}), saved[kind])
    else:
        meta_file = next(saved[kind].glob("*.json"))
        newer = {
            "trace": {"nbtoolkit_trace": 2},
            "snapshot": {"version": 2},
            "graphs": {"format": "nbtoolkit.GraphReport/2"},
        }
        _edit_json(meta_file, lambda d: {**d, **newer[kind]})
    with pytest.raises(
        error, match=r"saved by a newer nbtoolkit \(format 2; this one reads up to 1\): upgrade"
    ):
        load(saved[kind])
