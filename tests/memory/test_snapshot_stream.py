"""Large snapshots: scaled from real ones, read streaming with filters, limits and any pickle protocol.

The snapshots here are written in the session by scaling a real one (the recorded CPU step's,
and a real GPU snapshot's when the fixtures are there) to tens of MB; the 1 GB case is in
benchmarks/snapshot_scale.py.
"""

from __future__ import annotations

import gzip
import io
import pickle
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import SnapshotError
from nbtoolkit.memory.snapshot_columns import SnapshotFilter
from nbtoolkit.memory.snapshot_reader import restricted_loads
from nbtoolkit.memory.snapshot_scale import scaled_snapshot_dict, write_scaled_snapshot
from nbtoolkit.memory.snapshot_stream import stream_snapshot
from tests._python import run_python

from .test_snapshot import PICKLES, RECORDED

GPU_SNAPSHOT = "memory/kk_memory_files_memory_ctx128_fullstep.pickle"  # full step, 19k trace entries
FRAMES = ("segments", "blocks", "trace", "annotations")


def _assert_same(a: nbt.MemorySnapshot, b: nbt.MemorySnapshot) -> None:
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    assert a.stacks == b.stacks


@pytest.fixture(scope="module")
def gpu_source(real_data: Callable[[str], Path]) -> dict[str, Any]:
    return restricted_loads(real_data(GPU_SNAPSHOT).read_bytes())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def scaled_gpu(gpu_source: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 20 MB: 16 copies of a real full training step (61 GB reserved) over 2 devices (protocol 5)."""
    path = tmp_path_factory.mktemp("scaled") / "scaled_gpu.pickle"
    return write_scaled_snapshot(gpu_source, path, copies=16, devices=2, protocol=5)


@pytest.mark.parametrize("name", [*PICKLES, RECORDED])
def test_streaming_equals_the_whole_load_on_every_fixture(
    name: str, snapshot_file: Callable[[str], Path]
) -> None:
    """Each real snapshot (skipped, naming it, where the data is missing) and the recorded one."""
    path = snapshot_file(name)
    whole = nbt.load_memory_snapshot(path, stream=False)
    # A drain every 4 KB: many drains, lists caught while they fill.
    streamed = stream_snapshot(path, keep=SnapshotFilter(), max_rows=10**9, drain_every=4096)
    assert streamed is not None
    _assert_same(whole, streamed)
    assert streamed.stats() == whole.stats()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_the_scaled_writer_writes_what_pickle_reads_in_every_binary_protocol(
    recorded_memory: Any, tmp_path: Path, protocol: int
) -> None:
    source = restricted_loads(recorded_memory.snapshot.read_bytes())
    path = write_scaled_snapshot(source, tmp_path / "s.pickle", copies=5, devices=2, protocol=protocol)
    assert path.read_bytes()[:2] == bytes([0x80, protocol])
    assert pickle.loads(path.read_bytes()) == scaled_snapshot_dict(source, 5, devices=2)
    streamed = nbt.load_memory_snapshot(path, stream=True)
    _assert_same(nbt.load_memory_snapshot(scaled_snapshot_dict(source, 5, devices=2)), streamed)
    assert streamed.devices() == [0, 1]


@pytest.mark.parametrize("protocol", [0, 1])
def test_text_and_old_binary_protocols_stream_too(
    recorded_memory: Any, tmp_path: Path, protocol: int
) -> None:
    source = restricted_loads(recorded_memory.snapshot.read_bytes())
    scaled = scaled_snapshot_dict(source, 4, devices=2)
    path = tmp_path / f"p{protocol}.pickle"
    path.write_bytes(pickle.dumps(scaled, protocol=protocol))
    streamed = stream_snapshot(path, keep=SnapshotFilter(), max_rows=10**9, drain_every=2048)
    assert streamed is not None
    _assert_same(nbt.load_memory_snapshot(scaled), streamed)


def test_scaled_gpu_snapshot_equals_memory_viz_and_is_flagged_impossible(
    scaled_gpu: Path, gpu_source: dict[str, Any]
) -> None:
    from torch.cuda import _memory_viz

    assert 10 << 20 < scaled_gpu.stat().st_size < 60 << 20
    snap = nbt.load_memory_snapshot(scaled_gpu, stream=True)
    with redirect_stdout(io.StringIO()):
        expected = _memory_viz.segsum(pickle.loads(scaled_gpu.read_bytes()))
    lines = [line for line in expected.splitlines() if line.startswith(("segments:", "total_"))]
    assert snap.stats().lines() == lines
    original = nbt.load_memory_snapshot(gpu_source)
    assert snap.stats().total_reserved == 16 * original.stats().total_reserved
    assert len(snap.trace) == 16 * len(original.trace)
    # 8 copies of a 61 GB run on each device: more than any device has.
    check = snap.capacity_check()
    assert (check["problem"] != "").all() and list(check["device"]) == [0, 1]
    assert any("impossible totals" in note for note in snap.notes)
    assert not any("impossible" in note for note in original.notes)
    # A capacity the user gives is checked too: the original step fits 80 GB, not 40 GB.
    assert original.capacity_check(80 * 10**9)["problem"].iloc[0] == ""
    assert "more than" in original.capacity_check(40 * 10**9)["problem"].iloc[0]


def test_device_and_time_filters_apply_while_reading(scaled_gpu: Path) -> None:
    whole = nbt.load_memory_snapshot(scaled_gpu, stream=True)
    times = whole.trace["time_us"]
    start, end = float(times.quantile(0.3)), float(times.quantile(0.6))
    part = nbt.load_memory_snapshot(scaled_gpu, devices=[1], time_range_us=(start, end), stream=True)
    assert set(part.segments["device"]) == {1} and set(part.trace["device"]) == {1}
    assert part.trace["time_us"].between(start, end).all()
    expected = whole.trace[(whole.trace["device"] == 1) & whole.trace["time_us"].between(start, end)]
    # Stacks are interned as rows are kept, so ids differ: compare the stacks' text.
    expected = expected.reset_index(drop=True)
    # (categories are listed in the order rows were kept: compare the values)
    pd.testing.assert_frame_equal(
        part.trace.drop(columns="stack_id"), expected.drop(columns="stack_id"), check_categorical=False
    )
    assert [part.stacks[i] for i in part.trace["stack_id"]] == [whole.stacks[i] for i in expected["stack_id"]]
    assert any("filtered while reading" in note for note in part.notes)
    # The whole load (stream=False) filters alike.
    alike = nbt.load_memory_snapshot(scaled_gpu, devices=1, time_range_us=(start, end), stream=False)
    pd.testing.assert_frame_equal(
        alike.trace.drop(columns="stack_id"), part.trace.drop(columns="stack_id"), check_categorical=False
    )
    # An open end, and a window holding nothing.
    assert len(nbt.load_memory_snapshot(scaled_gpu, time_range_us=(None, start), stream=True).trace) > 0
    assert len(nbt.load_memory_snapshot(scaled_gpu, time_range_us=(0, 1), stream=True).trace) == 0
    with pytest.raises(nbt.NbtUsageError, match="starts after it ends"):
        nbt.load_memory_snapshot(scaled_gpu, time_range_us=(end, start))


def test_history_false_on_a_file_read_in_one_go(recorded_memory: Any) -> None:
    """A small file is unpickled before the first drain: segments only all the same."""
    state = nbt.load_memory_snapshot(recorded_memory.snapshot, history=False, stream=True)
    whole = nbt.load_memory_snapshot(recorded_memory.snapshot)
    assert len(state.trace) == 0 and len(state.annotations) == 0
    assert state.stats() == whole.stats() and len(whole.trace) > 0
    assert len(nbt.load_memory_snapshot(recorded_memory.snapshot, history=False, stream=False).trace) == 0


def test_history_false_stops_where_the_history_begins(scaled_gpu: Path) -> None:
    state = nbt.load_memory_snapshot(scaled_gpu, history=False, stream=True)
    assert len(state.trace) == 0 and len(state.blocks) > 0
    assert state.stats() == nbt.load_memory_snapshot(scaled_gpu, stream=True).stats()
    note = next(n for n in state.notes if "segments only" in n)
    stopped_at = int(note.split("after ")[1].split(" bytes")[0].replace(",", ""))
    assert stopped_at < scaled_gpu.stat().st_size


def test_gzip_and_limits_while_streaming(scaled_gpu: Path, tmp_path: Path) -> None:
    packed = tmp_path / "scaled.pickle.gz"
    packed.write_bytes(gzip.compress(scaled_gpu.read_bytes(), compresslevel=1))
    _assert_same(
        nbt.load_memory_snapshot(scaled_gpu, stream=True), nbt.load_memory_snapshot(packed, stream=True)
    )
    with pytest.raises(SnapshotError, match="over the limit"):
        nbt.load_memory_snapshot(scaled_gpu, stream=True, max_bytes=1 << 20)
    with pytest.raises(SnapshotError, match="more than 1,000 rows kept"):
        nbt.load_memory_snapshot(scaled_gpu, stream=True, max_rows=1000)
    truncated = tmp_path / "truncated.pickle"
    truncated.write_bytes(scaled_gpu.read_bytes()[: 3 << 20])
    with pytest.raises(SnapshotError, match="corrupt or truncated"):
        nbt.load_memory_snapshot(truncated, stream=True)


def test_a_pickle_sharing_entries_is_refused_when_streaming(tmp_path: Path) -> None:
    entry = {"action": "alloc", "addr": 1, "size": 8, "stream": 0, "frames": []}
    path = tmp_path / "shared.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[entry] * 5000]}))
    with pytest.raises(SnapshotError, match=r"referred to twice.*stream=False"):
        stream_snapshot(path, keep=SnapshotFilter(), max_rows=10**9, drain_every=1024)
    assert len(nbt.load_memory_snapshot(path, stream=False).trace) == 5000


def test_a_malicious_pickle_is_refused_when_streaming(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("ran",))

    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [Boom()]}))
    with pytest.raises(SnapshotError, match=r"refused: the pickle tries to load builtins\.print"):
        nbt.load_memory_snapshot(path, stream=True)


def test_streaming_memory_stays_below_the_file_size(scaled_gpu: Path) -> None:
    """Peak RSS growth of a fresh process: streaming well under the whole load's.

    (On a file this small, fixed costs dominate both: pandas' and pyarrow's first use, the
    source's stacks. The 1 GB ratios are in benchmarks/snapshot_scale.py.)
    """
    code = (
        "import sys, nbtoolkit as nbt, pandas, numpy\n"
        "def hwm():\n"
        "    status = open('/proc/self/status').read()\n"
        "    return int(status.split('VmHWM:')[1].split()[0]) * 1024\n"
        "open('/proc/self/clear_refs', 'w').write('5')  # the peak so far (imports) resets to now\n"
        "base = hwm()\n"
        "s = nbt.load_memory_snapshot(sys.argv[1], stream=sys.argv[2] == 'stream')\n"
        "s.stats()\n"
        "print('GROWTH', hwm() - base)\n"
    )
    size = scaled_gpu.stat().st_size
    growth = {}
    for mode in ("stream", "whole"):
        out = run_python("-c", code, str(scaled_gpu), mode).stdout
        growth[mode] = int(out.split("GROWTH ")[1].split()[0])
    assert growth["stream"] < 0.6 * growth["whole"], (growth, size)
