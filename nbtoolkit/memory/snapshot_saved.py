"""What ``MemorySnapshot.load`` checks in a saved snapshot folder (see :mod:`nbtoolkit.core.saved`).

``snapshot.json`` holds the interned stacks and, per stack, its phase hint, user source and
Mosaic category (lists as long as ``stacks``); ``segments``, ``blocks``, ``trace`` and
``annotations`` ``.parquet`` hold the frames of :mod:`nbtoolkit.memory.snapshot` with the dtypes
:class:`~nbtoolkit.memory.snapshot_columns.SnapshotColumns` gives them. A stack id is -1 or an
index into ``stacks``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nbtoolkit.core.errors import SnapshotError
from nbtoolkit.core.paths import shown_path
from nbtoolkit.core.saved import (
    ANY,
    BOOL,
    INT,
    TEXT,
    Check,
    check_fields,
    check_range,
    check_version,
    dict_of,
    list_of,
    read_frame,
    read_json,
    saved_folder,
)

__all__ = ["FRAME_DTYPES", "META_FIELDS", "read_snapshot_folder"]

_SIZES = ("total_size", "allocated_size", "active_size", "requested_size")
#: frame -> column -> the pandas dtype SnapshotColumns gives it (and MemorySnapshot.save writes)
FRAME_DTYPES: dict[str, dict[str, str]] = {
    "segments": {
        "segment": "int64",
        "device": "int64",
        "address": "int64",
        **dict.fromkeys(_SIZES, "int64"),
        "stream": "int64",
        "segment_type": "category",
        "pool": "category",
        "is_expandable": "bool",
    },
    "blocks": {
        "segment": "int64",
        "device": "int64",
        "address": "int64",
        "offset": "int64",
        "size": "int64",
        "requested_size": "int64",
        "state": "category",
        "stack_id": "int64",
    },
    "trace": {
        "device": "int64",
        "seq": "int64",
        "action": "category",
        "addr": "int64",
        "size": "int64",
        "stream": "int64",
        "time_us": "float64",
        "compile_context": "category",
        "user_metadata": "category",
        "device_free": "int64",
        "stack_id": "int64",
    },
    "annotations": {"device": "int64", "stage": "object", "name": "object", "time_us": "float64"},
}
#: snapshot.json key -> (check, default)
META_FIELDS: dict[str, tuple[Check, Any]] = {
    "stacks": (list_of(TEXT), []),
    "stack_hints": (list_of(TEXT), []),
    "stack_sources": (list_of(TEXT), []),
    "stack_mosaic": (list_of(TEXT), []),
    "allocator_settings": (dict_of(TEXT, ANY), {}),
    "source": (TEXT, ""),
    "legacy_segment_list": (BOOL, False),
    "notes": (list_of(TEXT), []),
    "version": (INT, 1),
}
_SAVED_FORMAT = "nbtoolkit.MemorySnapshot"


def read_snapshot_folder(path: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(frames, metadata)`` of a folder written by ``MemorySnapshot.save``, all checked."""
    folder, meta_path = saved_folder(path, "snapshot.json", what="MemorySnapshot", error=SnapshotError)
    where = shown_path(meta_path)
    raw = read_json(meta_path, what="MemorySnapshot", error=SnapshotError)
    if raw.get("format") != _SAVED_FORMAT:
        raise SnapshotError(f"{where} was not written by MemorySnapshot.save (no format {_SAVED_FORMAT!r})")
    meta = check_fields(raw, META_FIELDS, where=where, error=SnapshotError, required=("stacks",))
    check_version(meta["version"], 1, meta_path, what="MemorySnapshot", error=SnapshotError)
    stacks = len(meta["stacks"])
    for name in ("stack_hints", "stack_sources", "stack_mosaic"):
        if len(meta[name]) != stacks and not (name == "stack_mosaic" and not meta[name]):
            raise SnapshotError(
                f"{where}: the saved MemorySnapshot is damaged: {name!r} has {len(meta[name]):,} entries for "
                f"{stacks:,} stacks; save it again"
            )
    frames = {}
    for name, dtypes in FRAME_DTYPES.items():
        file = Path(folder) / f"{name}.parquet"
        frames[name] = frame = read_frame(
            file, dtypes, what="MemorySnapshot", error=SnapshotError, self_destruct=True
        )
        if "stack_id" in frame.columns and len(frame):
            check_range(
                frame,
                "stack_id",
                -1,
                stacks,
                where=shown_path(file),
                what="MemorySnapshot",
                error=SnapshotError,
                meaning="-1 or an index into the stacks",
            )
    meta.pop("version")
    return frames, meta
