"""The snapshot cache never follows a symbolic link it did not make (see tests/trace's twin).

Links are planted where ``load_memory_snapshot(cache=True / cache_dir=)`` reads and writes: the
``.nbt-cache`` beside the pickle, an explicit ``cache_dir``, the exact name of the cache entry.
The folder they point to stays untouched and every result equals the uncached read. The
snapshot is the one this session records.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbtoolkit as nbt
from nbtoolkit.memory.snapshot_cache import cache_folder
from nbtoolkit.memory.snapshot_columns import SnapshotFilter
from tests.conftest import folder_state


def test_a_snapshot_cache_never_follows_links(recorded_memory: object, victim: Path, tmp_path: Path) -> None:
    snapshot = recorded_memory.snapshot  # type: ignore[attr-defined]
    folder = tmp_path / "snaps"
    folder.mkdir()
    source = folder / "snap.pickle"
    shutil.copy2(snapshot, source)
    before = folder_state(victim)
    direct = nbt.load_memory_snapshot(source)

    (folder / ".nbt-cache").symlink_to(victim, target_is_directory=True)
    shipped = nbt.load_memory_snapshot(source, cache=True)
    assert folder_state(victim) == before
    assert any("symbolic link" in note for note in shipped.notes)

    link = tmp_path / "cache_link"
    link.symlink_to(victim, target_is_directory=True)
    explicit = nbt.load_memory_snapshot(source, cache_dir=link)
    assert folder_state(victim) == before
    assert any("symbolic link" in note for note in explicit.notes)

    real = tmp_path / "real_cache"
    real.mkdir()
    entry = cache_folder(source, SnapshotFilter(), real)
    entry.symlink_to(victim, target_is_directory=True)  # a link at the entry's exact name
    cached = nbt.load_memory_snapshot(source, cache_dir=real)
    assert folder_state(victim) == before
    assert not entry.is_symlink() and (entry / "snapshot.json").is_file()
    again = nbt.load_memory_snapshot(source, cache_dir=real)
    assert any("read from the cache" in note for note in again.notes)
    for result in (shipped, explicit, cached, again):
        assert result.stats() == direct.stats()
