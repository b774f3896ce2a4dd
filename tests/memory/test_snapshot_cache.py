"""``load_memory_snapshot(path, cache=True)``: a large pickle read once, its Parquet cache after.

On the snapshot this session records (scaled to a few MB, read streaming) and on a real GPU
snapshot when the fixtures are there (skipped, naming it, when not).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

import nbtoolkit as nbt
import nbtoolkit.memory.snapshot_reader as snapshot_io
from nbtoolkit.memory.snapshot_reader import restricted_loads
from nbtoolkit.memory.snapshot_scale import write_scaled_snapshot

from .conftest import RECORDED

GPU_SNAPSHOT = "kk_memory_files_memory_ctx128_fullstep.pickle"
FRAMES = ("segments", "blocks", "trace", "annotations")


def _assert_same(a: nbt.MemorySnapshot, b: nbt.MemorySnapshot) -> None:
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    assert a.stacks == b.stacks and a.stack_mosaic == b.stack_mosaic
    assert a.stats() == b.stats()


@pytest.fixture(params=[RECORDED, GPU_SNAPSHOT])
def big_pickle(request: pytest.FixtureRequest, snapshot_file: Callable[[str], Path], tmp_path: Path) -> Path:
    """Eight copies of the snapshot over two devices, in a folder of its own."""
    source = restricted_loads(snapshot_file(request.param).read_bytes())
    (tmp_path / "snaps").mkdir()
    return write_scaled_snapshot(source, tmp_path / "snaps" / "big.pickle", copies=8, devices=2, protocol=5)


def _no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the pickle was read although the cache holds it")

    monkeypatch.setattr(snapshot_io, "_read_file", refuse)


def test_a_second_load_reads_the_cache_and_equals_the_pickle(
    big_pickle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = nbt.load_memory_snapshot(big_pickle, stream=True)
    first = nbt.load_memory_snapshot(big_pickle, cache=True)
    _assert_same(first, direct)
    made = list((big_pickle.parent / ".nbt-cache").iterdir())
    assert len(made) == 1 and (made[0] / "snapshot.json").is_file()
    assert not any("read from the cache" in n for n in first.notes)

    _no_unpickling(monkeypatch)
    second = nbt.load_memory_snapshot(big_pickle, cache=True)
    _assert_same(second, direct)
    assert any("read from the cache" in n for n in second.notes)
    assert second.source == direct.source


def test_filters_and_a_changed_file_make_their_own_cache(big_pickle: Path) -> None:
    full = nbt.load_memory_snapshot(big_pickle, cache=True)
    one_device = nbt.load_memory_snapshot(big_pickle, cache=True, devices=1)
    assert set(one_device.segments["device"]) == {1} and set(full.segments["device"]) == {0, 1}
    segments_only = nbt.load_memory_snapshot(big_pickle, cache=True, history=False)
    assert len(segments_only.trace) == 0 < len(full.trace)
    assert len(list((big_pickle.parent / ".nbt-cache").iterdir())) == 3
    # the same bytes written again (a new dump): a new modification time, read from the pickle
    stat = big_pickle.stat()
    os.utime(big_pickle, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    again = nbt.load_memory_snapshot(big_pickle, cache=True)
    assert not any("read from the cache" in n for n in again.notes)
    _assert_same(again, full)


def test_an_unwritable_or_damaged_cache_costs_speed_not_the_result(
    big_pickle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = nbt.load_memory_snapshot(big_pickle, stream=True)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    unwritable = nbt.load_memory_snapshot(big_pickle, cache_dir=blocker / "cache")
    _assert_same(unwritable, direct)
    assert any("could not write the cache" in n for n in unwritable.notes)

    cache_dir = tmp_path / "cache"
    nbt.load_memory_snapshot(big_pickle, cache_dir=cache_dir)
    (folder,) = cache_dir.iterdir()
    (folder / "trace.parquet").write_bytes(b"PAR1 damaged")
    repaired = nbt.load_memory_snapshot(big_pickle, cache_dir=cache_dir)
    _assert_same(repaired, direct)
    assert not any("read from the cache" in n for n in repaired.notes)
    assert any("was damaged" in n and "rewrote it" in n for n in repaired.notes)
    _no_unpickling(monkeypatch)  # rewritten: the next load reads it
    _assert_same(nbt.load_memory_snapshot(big_pickle, cache_dir=cache_dir), direct)
