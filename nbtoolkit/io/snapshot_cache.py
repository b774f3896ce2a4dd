"""A one-time conversion of a large allocator snapshot pickle to Parquet, read instead next time.

Unpickling is the cost of a large snapshot: a 1 GB pickle takes most of a minute whatever
reads it (:mod:`nbtoolkit.io.snapshot_stream` keeps it in bounded memory, not in less time).
The columns it becomes are a few times smaller and read back in about a second.
``load_memory_snapshot(path, cache=True)`` therefore saves the snapshot it read
(:meth:`MemorySnapshot.save`: Parquet frames plus a JSON file, no pickle, nothing that runs
code when read) and the next call with the same file and the same read filters loads that.

The key holds the file's name, size and modification time (nanoseconds), the read filters
(devices, time range, history) and the cache format: a file that changes is read again. The
folder is ``<snapshot's folder>/.nbt-cache`` (as for traces) or ``cache_dir``. A cache that
cannot be written (read-only folder, full disk) costs speed next time, never this result; a
cache folder that is damaged is read from the pickle again and rewritten.

The row budget (``max_rows``) guards unpickling: it applies when the cache is made.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from nbtoolkit.errors import SnapshotError
from nbtoolkit.io.trace_cache import DEFAULT_CACHE_NAME, file_identity

if TYPE_CHECKING:
    from nbtoolkit.model.snapshot import MemorySnapshot
    from nbtoolkit.model.snapshot_columns import SnapshotFilter

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
    from nbtoolkit.model.snapshot import MemorySnapshot

    folder = cache_folder(source, keep, cache_dir)
    if (folder / "snapshot.json").is_file():
        try:
            snapshot = MemorySnapshot.load(folder)
        except SnapshotError:
            pass  # damaged: read the pickle again and rewrite it
        else:
            snapshot.notes.append(f"read from the cache {folder} (made from {source.name} once)")
            return snapshot
    snapshot = read()
    problem = _write(snapshot, folder)
    if problem:
        snapshot.notes.append(f"could not write the cache {folder} ({problem}); next time the pickle is read")
    return snapshot


def _write(snapshot: MemorySnapshot, folder: Path) -> str:
    """Save whole, then rename: another process never reads half a cache. '' or the problem."""
    partial = folder.with_name(f".{folder.name}.{os.getpid()}")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        snapshot.save(partial)
        shutil.rmtree(folder, ignore_errors=True)  # a damaged one
        partial.replace(folder)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        return exc.strerror or str(exc)
    return ""
