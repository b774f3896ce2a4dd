"""A one-time conversion of a large allocator snapshot pickle to Parquet, read instead next time.

Unpickling is the cost of a large snapshot: a 1 GB pickle takes most of a minute whatever
reads it (:mod:`nbtoolkit.memory.snapshot_stream` keeps it in bounded memory, not in less time).
The columns it becomes are a few times smaller and read back in about a second.
``load_memory_snapshot(path, cache=True)`` therefore saves the snapshot it read
(:meth:`MemorySnapshot.save`: Parquet frames plus a JSON file, no pickle, nothing that runs
code when read) and the next call with the same file and the same read filters loads that.

The key holds the file's name, size and modification time (nanoseconds), the read filters
(devices, time range, history) and the cache format: a file that changes is read again. The
folder is ``<snapshot's folder>/.nbt-cache`` (as for traces) or ``cache_dir``. A cache that
cannot be written (read-only folder, full disk, a symbolic link where the cache folder should
be) costs speed next time, never this result; a cache folder that is damaged is read from the
pickle again and rewritten. No link is followed, in reading or in writing
(:mod:`nbtoolkit.core.cache_folder`).

The row budget (``max_rows``) guards unpickling: it applies when the cache is made.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from nbtoolkit.core.cache_folder import (
    DEFAULT_CACHE_NAME,
    file_identity,
    is_plain_folder,
    usable_cache_folder,
    write_cached_folder,
)
from nbtoolkit.core.errors import SnapshotError

if TYPE_CHECKING:
    from nbtoolkit.memory.snapshot import MemorySnapshot
    from nbtoolkit.memory.snapshot_columns import SnapshotFilter

__all__ = ["SNAPSHOT_CACHE_FORMAT", "cache_folder", "cached_snapshot"]

SNAPSHOT_CACHE_FORMAT = 1


def cache_folder(source: Path, keep: SnapshotFilter, cache_dir: Path | None) -> Path:
    """Where the snapshot read from ``source`` with ``keep`` is (or will be) cached."""
    devices = sorted(keep.devices) if keep.devices is not None else None
    filters = repr((devices, keep.time_range_us, keep.history)).encode()
    digest = hashlib.sha256(filters).hexdigest()[:12]
    root = cache_dir if cache_dir is not None else source.parent / DEFAULT_CACHE_NAME
    return root / f"{file_identity(source)}-{digest}-v{SNAPSHOT_CACHE_FORMAT}"


def cached_snapshot(
    source: Path, keep: SnapshotFilter, cache_dir: Path | None, read: Callable[[], MemorySnapshot]
) -> MemorySnapshot:
    """The cached snapshot of ``source`` if there is one, else ``read()`` and cache what it gives."""
    from nbtoolkit.memory.snapshot import MemorySnapshot

    folder = cache_folder(source, keep, cache_dir)
    root, refused = usable_cache_folder(folder.parent)  # a link there is never read nor written
    if root is None:
        snapshot = read()
        snapshot.notes.append(f"could not write the cache ({refused}); next time the pickle is read")
        return snapshot
    damage = ""
    if is_plain_folder(folder) and (folder / "snapshot.json").is_file():
        try:
            snapshot = MemorySnapshot.load(folder)
        except SnapshotError as exc:
            damage = str(exc)  # damaged: read the pickle again and rewrite it
        else:
            snapshot.notes.append(f"read from the cache {folder} (made from {source.name} once)")
            return snapshot
    snapshot = read()
    if damage:
        snapshot.notes.append(
            f"the cache {folder} was damaged ({damage[:200]}); read the pickle again and rewrote it"
        )
    try:
        write_cached_folder(root, folder.name, snapshot.save)
    except OSError as exc:
        snapshot.notes.append(
            f"could not write the cache {folder} ({exc.strerror or exc}); next time the pickle is read"
        )
    return snapshot
