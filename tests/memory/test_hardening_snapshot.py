"""Snapshot and memory-timeline readers under hostile input: bombs, corrupt gzip, wrong types."""

from __future__ import annotations

import gzip
import os
import pickle
import re
import time
from pathlib import Path

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import SnapshotError


def _segment(blocks: list[dict[str, object]]) -> dict[str, object]:
    return {"device": 0, "address": 0, "total_size": 512 * len(blocks), "blocks": blocks}


def _block() -> dict[str, object]:
    return {"size": 512, "state": "active_allocated", "frames": []}


def _bomb(path: Path) -> Path:
    """A small pickle whose one segment is referenced 10,000 times (9 million blocks once built)."""
    segment = _segment([_block() for _ in range(900)])
    path.write_bytes(pickle.dumps({"segments": [segment] * 10_000, "device_traces": []}))
    return path


def test_a_pickle_of_shared_references_is_refused_in_seconds(tmp_path: Path) -> None:
    path = _bomb(tmp_path / "bomb.pickle")
    assert path.stat().st_size < 100_000
    start = time.perf_counter()
    with pytest.raises(SnapshotError) as info:
        nbt.load_memory_snapshot(path)
    assert time.perf_counter() - start < 5
    message = str(info.value)
    assert "bomb.pickle" in message and "5,000,000 rows" in message
    assert "max_rows=" in message and "NBT_MAX_SNAPSHOT_ROWS" in message


def test_the_row_budget_is_configurable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "small.pickle"
    path.write_bytes(pickle.dumps({"segments": [_segment([_block() for _ in range(10)])] * 3}))
    assert len(nbt.load_memory_snapshot(path).blocks) == 30  # 33 rows: under the default
    with pytest.raises(SnapshotError, match="more than 20 rows"):
        nbt.load_memory_snapshot(path, max_rows=20)
    monkeypatch.setenv("NBT_MAX_SNAPSHOT_ROWS", "20")
    with pytest.raises(SnapshotError, match="more than 20 rows"):
        nbt.load_memory_snapshot(path)
    assert len(nbt.load_memory_snapshot(path, max_rows=100).blocks) == 30  # the keyword wins
    monkeypatch.setenv("NBT_MAX_SNAPSHOT_ROWS", "many")
    with pytest.raises(nbt.NbtUsageError, match="NBT_MAX_SNAPSHOT_ROWS='many'"):
        nbt.load_memory_snapshot(path)


def test_the_dict_in_memory_gets_the_same_budget() -> None:
    segment = _segment([_block() for _ in range(100)])
    with pytest.raises(SnapshotError, match="the snapshot given stands for more than 50 rows"):
        nbt.load_memory_snapshot({"segments": [segment] * 2}, max_rows=50)


def test_a_corrupt_gzipped_snapshot_is_a_snapshot_error(tmp_path: Path) -> None:
    data = gzip.compress(pickle.dumps({"segments": [_segment([_block()])]}))
    path = tmp_path / "snap.pickle.gz"
    path.write_bytes(data[:10] + b"\x00" * 6 + data[16:])  # the deflate stream's first bytes
    with pytest.raises(SnapshotError, match=r"snap\.pickle\.gz is a corrupt or truncated gzip file"):
        nbt.load_memory_snapshot(path)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotError, match="corrupt or truncated gzip"):
        nbt.load_memory_snapshot(path)


def test_a_gzip_bomb_stops_at_the_read_limit(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pickle.gz"
    path.write_bytes(gzip.compress(b"\x00" * (32 << 20)))
    with pytest.raises(SnapshotError, match=r"stopped reading after .* NBT_MAX_READ_BYTES"):
        nbt.load_memory_snapshot(path, max_bytes="8MiB")
    with pytest.raises(SnapshotError, match=r"stopped reading after"):
        nbt.load_memory_timeline(path, max_bytes="8MiB")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "snap.pickle"
    os.mkfifo(fifo)
    with pytest.raises(SnapshotError, match="named pipe"):
        nbt.load_memory_snapshot(fifo)  # would block in open() before


@pytest.mark.parametrize("value", [None, 5, 2.5])
def test_wrong_types_name_what_was_given(value: object) -> None:
    shown = "None" if value is None else type(value).__name__
    with pytest.raises(nbt.NbtUsageError, match=rf"load_memory_snapshot\(\) takes .*got .*{shown}"):
        nbt.load_memory_snapshot(value)  # type: ignore[arg-type]
    with pytest.raises(nbt.NbtUsageError, match=rf"load_memory_timeline\(\) takes .*got .*{shown}"):
        nbt.load_memory_timeline(value)  # type: ignore[arg-type]


def test_a_deeply_nested_value_is_a_snapshot_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.pickle"
    path.write_bytes(_deep_pickle(100_000))
    assert pickle.loads(_deep_pickle(3))["segments"][0]["segment_type"] == [[[]]]  # the layout is right
    with pytest.raises(SnapshotError, match=r"deep\.pickle"):
        nbt.load_memory_snapshot(path)  # str() of the value recursed too deep: not a RecursionError


def _deep_pickle(depth: int) -> bytes:
    """A snapshot pickle whose segment_type is a list nested ``depth`` deep, written as opcodes
    (``pickle.dumps`` itself would recurse too deep): {'segments': [{..., 'segment_type': [[...]]}]}."""
    nested = b"]" * depth + b"a" * (depth - 1)  # EMPTY_LIST depth times, then APPEND depth-1 times
    return (
        b"\x80\x02}(X\x08\x00\x00\x00segments](}(X\x06\x00\x00\x00deviceK\x00X\x07\x00\x00\x00addressK\x00"
        b"X\n\x00\x00\x00total_sizeK\x01X\x06\x00\x00\x00blocks]X\x0c\x00\x00\x00segment_type"
        + nested
        + b"ueu."
    )


# ------------------------------------------------------------------ frames, stack text, negative sizes
def _snapshot_with_blocks(blocks: list[dict[str, object]]) -> dict[str, object]:
    return {
        "segments": [{"device": 0, "address": 0, "total_size": 512 * len(blocks), "allocated_size": 0,
                      "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
                      "blocks": blocks}],
        "device_traces": [[]],
    }


def test_a_stack_of_ten_million_frames_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """20 MB of pickle, one block whose stack is 10**7 references to one frame: 1.9 GB once read."""
    from tests._python import read_bounded

    frames = [{"filename": "a.py", "line": 1, "name": "f"}] * 10**7
    path = tmp_path / "frames.pickle"
    block = {"size": 512, "state": "active_allocated", "frames": frames}
    path.write_bytes(pickle.dumps(_snapshot_with_blocks([block])))
    out = read_bounded("load_memory_snapshot", path)
    assert out["outcome"] == "error", out
    message = str(out["message"])
    assert "a stack of 10,000,000 frames, over the limit NBT_MAX_STACK_FRAMES=100,000" in message, message
    assert int(out["peak_rss"]) < 1.5 * 2**30, out  # type: ignore[call-overload]


@pytest.mark.parametrize("stream", [False, True])
def test_the_stack_frames_limit_is_raisable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """Real stacks share frames and count them once per entry: only one stack's length is bounded."""
    frames = [{"filename": "a.py", "line": i, "name": "f"} for i in range(30)]
    blocks = [{"size": 512, "state": "active_allocated", "frames": list(frames)} for _ in range(100)]
    path = tmp_path / "stacks.pickle"
    path.write_bytes(pickle.dumps(_snapshot_with_blocks(blocks)))
    snapshot = nbt.load_memory_snapshot(path, stream=stream, max_rows=102)  # frames are no rows
    assert len(snapshot.blocks) == 100
    monkeypatch.setenv("NBT_MAX_STACK_FRAMES", "20")
    expected = r"stacks\.pickle.*a stack of 30 frames, over the limit NBT_MAX_STACK_FRAMES=20"
    with pytest.raises(SnapshotError, match=expected):
        nbt.load_memory_snapshot(path, stream=stream)
    monkeypatch.setenv("NBT_MAX_STACK_FRAMES", "30")
    assert len(nbt.load_memory_snapshot(path, stream=stream).blocks) == 100


@pytest.mark.parametrize("stream", [False, True])
def test_two_thousand_stacks_sharing_a_megabyte_name_stay_small(tmp_path: Path, stream: bool) -> None:
    """Every stack's text repeated the 1 MB name: 2.8 GB. Frame text is cut to 512 characters."""
    from tests._python import read_bounded

    name = "x" * (1 << 20)
    blocks = [{"size": 512, "state": "active_allocated", "requested_size": 512,
               "frames": [{"filename": f"/u/m{i}.py", "line": i, "name": name}]} for i in range(2000)]
    path = tmp_path / "shared_name.pickle"
    path.write_bytes(pickle.dumps(_snapshot_with_blocks(blocks)))
    if not stream:
        out = read_bounded("load_memory_snapshot", path)
        assert out["outcome"] == "result", out
        assert int(out["peak_rss"]) < 1 * 2**30, out  # type: ignore[call-overload]
    snapshot = nbt.load_memory_snapshot(path, stream=stream)
    assert len(snapshot.stacks) == 2000
    assert max(map(len, snapshot.stacks)) < 1000 and "...(+1,048,064 characters)" in snapshot.stacks[0]


def test_the_stack_text_budget_is_named_and_raisable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [{"size": 512, "state": "active_allocated",
               "frames": [{"filename": f"/u/m{i}.py", "line": j, "name": "n" * 400} for j in range(40)]}
              for i in range(200)]  # 200 distinct stacks of ~16 KB of text
    path = tmp_path / "many.pickle"
    path.write_bytes(pickle.dumps(_snapshot_with_blocks(blocks)))
    monkeypatch.setenv("NBT_MAX_STACK_TEXT_BYTES", "1MiB")
    expected = r"many\.pickle: the snapshot's .* over the limit NBT_MAX_STACK_TEXT_BYTES=1\.00 MiB"
    with pytest.raises(SnapshotError, match=expected):
        nbt.load_memory_snapshot(path)
    monkeypatch.setenv("NBT_MAX_STACK_TEXT_BYTES", "16MiB")
    assert len(nbt.load_memory_snapshot(path).stacks) == 200


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("block size", "1 block(s) have a negative size"),
        ("segment total", "1 segment(s) have a negative total_size"),
        ("trace entry", "1 trace entry(s) have a negative size"),
    ],
)
def test_negative_sizes_are_refused(tmp_path: Path, where: str, expected: str) -> None:
    snapshot = _snapshot_with_blocks([{"size": 512, "state": "inactive"}])
    snapshot["device_traces"] = [[{"action": "alloc", "addr": 0, "size": 512, "stream": 0}]]
    if where == "block size":
        snapshot["segments"][0]["blocks"][0]["size"] = -(7 * 2**30)  # type: ignore[index]
    elif where == "segment total":
        snapshot["segments"][0]["total_size"] = -512  # type: ignore[index]
    else:
        snapshot["device_traces"][0][0]["size"] = -1  # type: ignore[index]
    path = tmp_path / "negative.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    for stream in (False, True):
        with pytest.raises(SnapshotError, match=rf"negative\.pickle: {re.escape(expected)}.*corrupt"):
            nbt.load_memory_snapshot(path, stream=stream)
    with pytest.raises(SnapshotError, match=rf"the snapshot given: {re.escape(expected)}"):
        nbt.load_memory_snapshot(snapshot)
