"""Columns of an allocator snapshot, built batch by batch from the dicts torch wrote.

``torch.cuda.memory._snapshot()`` is a dict of Python objects: a list of segment dicts (each
with a list of block dicts) and one list of trace-entry dicts per device. A snapshot of a long
run holds tens of millions of them, and as Python objects they take five to ten times the bytes
of the pickle. :class:`SnapshotColumns` turns them into typed numpy columns *batch by batch*,
so a reader can hand over a thousand finished dicts, then drop them
(:mod:`nbtoolkit.memory.snapshot_stream` does, while the unpickler is still running); the
in-memory path (:meth:`MemorySnapshot.from_dict`) gives it everything at once. One
implementation for both, so both give the same frames.

Speed: each column of a batch is taken with ``map(itemgetter(key), batch)`` (C loops, no
Python-level loop per row); strings (``action``, ``compile_context``, ``user_metadata``,
``state``) become int codes through a dict that adds unseen values, stacks are interned once per
distinct frames list object (torch shares one list among every entry with the same stack).

Filters applied while reading (rows outside are never kept):

* ``devices``: keep segments, blocks, trace entries and annotations of these devices only;
* ``time_range_us``: ``(start, end)`` in the snapshot's own ``time_us`` clock (microseconds
  since the epoch in torch's snapshots; None on a side leaves it open): keep trace entries and
  annotations with ``start <= time_us <= end``. Entries of snapshots that record no time are
  kept (there is nothing to filter on; a note says so). Segments and blocks are the state at
  the end and are always kept (for the kept devices).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter, methodcaller
from typing import TYPE_CHECKING, Any

from nbtoolkit.memory.snapshot_stacks import StackInterner, StackLimits

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = ["SEGMENT_COLUMNS", "SnapshotColumns", "SnapshotFilter"]

SEGMENT_COLUMNS = (
    "segment",
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
    "segment_type",
    "pool",
    "is_expandable",
)
BLOCK_COLUMNS = ("segment", "device", "address", "offset", "size", "requested_size", "state", "stack_id")
TRACE_COLUMNS = (
    "device",
    "seq",
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "compile_context",
    "user_metadata",
    "device_free",
    "stack_id",
)


@dataclass(frozen=True)
class SnapshotFilter:
    """What to keep while reading: ``devices`` (None: all) and ``time_range_us`` (None: all)."""

    devices: frozenset[int] | None = None
    time_range_us: tuple[float | None, float | None] | None = None
    #: False: segments and blocks only (the state at the end); no trace entries nor annotations
    history: bool = True

    def keeps_device(self, device: int) -> bool:
        return self.devices is None or device in self.devices

    @property
    def active(self) -> bool:
        return self.devices is not None or self.time_range_us is not None or not self.history

    def describe(self) -> str:
        parts = []
        if self.devices is not None:
            parts.append(f"devices {sorted(self.devices)}")
        if self.time_range_us is not None:
            start, end = self.time_range_us
            parts.append(
                f"time_us from {'the start' if start is None else f'{start:,.0f}'} "
                f"to {'the end' if end is None else f'{end:,.0f}'}"
            )
        if not self.history:
            parts.append("no history (segments and blocks only)")
        return ", ".join(parts) or "everything"


class _Codes(dict[Any, int]):
    """value -> int code, adding unseen values (so ``map(codes.__getitem__, values)`` runs in C)."""

    def __missing__(self, key: Any) -> int:
        code = len(self)
        self[key] = code
        return code

    def decode(self, codes: np.ndarray) -> pd.Categorical:
        """The codes as a categorical of text (one byte or two a row, whatever the row count)."""
        import numpy as np
        import pandas as pd

        names = [""] * len(self)
        for value, code in self.items():
            names[code] = "" if value is None else str(value)
        unique = list(dict.fromkeys(names))  # None and "" both read "": categories must be unique
        remap = np.asarray([unique.index(n) for n in names] or [0], dtype="int32")
        return pd.Categorical.from_codes(remap[codes] if len(codes) else codes, categories=unique)


def _column(
    batch: Sequence[dict[str, Any]], key: str, default: Any, keys: set[Any] | None = None
) -> list[Any]:
    """``[entry.get(key, default) ...]`` in C loops (no Python-level loop per entry).

    ``keys``: every key any entry of the batch has (``set().union(*batch)``), when known.
    """
    if keys is not None and key not in keys:
        return [default] * len(batch)  # older formats, or only OOM entries have it: nobody here
    try:
        return list(map(itemgetter(key), batch))
    except KeyError:
        return list(map(methodcaller("get", key, default), batch))


def _ints(values: list[Any]) -> np.ndarray:
    """int64 column of Python ints (bools and None-free lists; one C conversion)."""
    import numpy as np

    try:
        return np.array(values, dtype="int64")
    except (TypeError, ValueError, OverflowError):
        return np.fromiter(map(int, values), dtype="int64", count=len(values))


def _sizes(source: str, what: str, field: str, values: np.ndarray) -> np.ndarray:
    """``values`` (byte counts), or a SnapshotError when one is negative (the snapshot is corrupt)."""
    if len(values) and int(values.min()) < 0:
        from nbtoolkit.core.errors import SnapshotError
        from nbtoolkit.core.units import format_bytes

        bad = values[values < 0]
        raise SnapshotError(
            f"{source + ': ' if source else ''}{len(bad):,} {what}(s) have a negative {field} "
            f"(e.g. {int(bad[0]):,} bytes, "
            f"{format_bytes(int(bad[0]))}); sizes are byte counts, so the snapshot is corrupt or was "
            "edited: dump it again with torch.cuda.memory._dump_snapshot()"
        )
    return values


class SnapshotColumns:
    """Accumulates segments, blocks and trace entries as numpy columns; :meth:`frames` at the end."""

    def __init__(
        self,
        keep: SnapshotFilter | None = None,
        *,
        source: str = "",
        stack_limits: StackLimits | None = None,
    ) -> None:
        """``source`` starts error messages; ``stack_limits``: what stacks may cost (None: no limits)."""
        self.keep = keep or SnapshotFilter()
        self.source = source
        self.interner = StackInterner(stack_limits, source=source)
        self._stack_of: dict[int, int] = {}  # id(frames list) -> stack id (the interner holds the list)
        self._segment_chunks: list[dict[str, Any]] = []
        self._block_chunks: list[dict[str, Any]] = []
        self._trace_chunks: list[dict[str, Any]] = []
        self._codes = {name: _Codes() for name in ("segment_type", "pool", "state", "action", "cc", "um")}
        self.segments_seen = 0
        self.rows_kept = 0
        self.trace_seen: dict[int, int] = {}  # device -> entries read (kept or not)
        self.untimed_entries = 0
        self.annotations: list[tuple[int, str, str, float]] = []

    # -- stacks ------------------------------------------------------------------------
    def _stack_ids(self, frame_lists: Iterable[Any]) -> np.ndarray:
        """Stack id per entry; entries without frames get -1.

        Only non-empty frames lists are remembered by identity: the interner keeps each alive,
        so its ``id`` cannot be reused by another list while we read.
        """
        import numpy as np

        lists = list(frame_lists)
        known = self._stack_of
        by_id = dict(zip(map(id, lists), lists, strict=True))  # first-seen order: ids as torch's order gives
        if not known.keys() >= by_id.keys():
            for key, frames in by_id.items():
                if frames and key not in known:
                    known[key] = self.interner.intern(frames)
        return np.fromiter(map(known.get, map(id, lists), repeat(-1)), dtype="int64", count=len(lists))

    # -- segments and their blocks -----------------------------------------------------
    def add_segments(self, batch: Sequence[dict[str, Any]]) -> None:
        """Segment dicts (with their ``blocks``), in snapshot order."""
        import numpy as np

        first = self.segments_seen
        self.segments_seen += len(batch)
        if not batch:
            return
        index = np.arange(first, first + len(batch), dtype="int64")
        devices = _ints(list(_column(batch, "device", 0)))
        kept = [i for i, d in enumerate(devices.tolist()) if self.keep.keeps_device(d)]
        if len(kept) < len(batch):
            batch = [batch[i] for i in kept]
            index, devices = index[kept], devices[kept]
        if not batch:
            return
        n = len(batch)

        def ints(key: str, default: int = 0) -> np.ndarray:
            return _ints(list(_column(batch, key, default)))

        addresses = _ints(list(map(itemgetter("address"), batch)))
        chunk: dict[str, Any] = {
            "segment": index,
            "device": devices,
            "address": addresses,
            "total_size": _sizes(
                self.source, "segment", "total_size", _ints(list(map(itemgetter("total_size"), batch)))
            ),
            "allocated_size": _sizes(self.source, "segment", "allocated_size", ints("allocated_size")),
            "active_size": _sizes(self.source, "segment", "active_size", ints("active_size")),
            "requested_size": _sizes(self.source, "segment", "requested_size", ints("requested_size")),
            "stream": ints("stream"),
            "segment_type": self._coded("segment_type", _column(batch, "segment_type", "")),
            "pool": self._coded("pool", map(str, _column(batch, "segment_pool_id", ""))),
            "is_expandable": np.fromiter(
                map(bool, _column(batch, "is_expandable", False)), dtype=bool, count=n
            ),
        }
        self._segment_chunks.append(chunk)
        self.rows_kept += n
        self._add_blocks(batch, index, devices, addresses)

    def _add_blocks(
        self,
        segments: Sequence[dict[str, Any]],
        index: np.ndarray,
        devices: np.ndarray,
        addresses: np.ndarray,
    ) -> None:
        import numpy as np

        block_lists = [seg.get("blocks") or [] for seg in segments]
        counts = np.fromiter(map(len, block_lists), dtype="int64", count=len(block_lists))
        blocks = [b for blist in block_lists for b in blist]
        n = len(blocks)
        if not n:
            return
        sizes = _sizes(self.source, "block", "size", _ints(list(map(itemgetter("size"), blocks))))
        requested, frames = _block_requested_and_frames(blocks, sizes)
        _sizes(self.source, "block", "requested_size", requested)
        # A block's offset in its segment: the sizes of the blocks before it (blocks tile the segment).
        ends = np.cumsum(sizes)
        starts_of_segment = np.repeat(np.r_[0, np.cumsum(counts)[:-1]], counts)
        offsets = ends - sizes - np.r_[0, ends][starts_of_segment]
        seg_address = np.repeat(addresses, counts)
        given = _column(blocks, "address", None)
        address = (
            np.fromiter((a if a is not None else -1 for a in given), dtype="int64", count=n)
            if None in given
            else _ints(list(given))
        )
        address = np.where(address < 0, seg_address + offsets, address)
        self._block_chunks.append(
            {
                "segment": np.repeat(index, counts),
                "device": np.repeat(devices, counts),
                "address": address,
                "offset": offsets,
                "size": sizes,
                "requested_size": requested,
                "state": self._coded("state", map(str, _column(blocks, "state", ""))),
                "stack_id": self._stack_ids(frames),
            }
        )
        self.rows_kept += n

    # -- trace entries -----------------------------------------------------------------
    def add_trace(self, device: int, batch: Sequence[dict[str, Any]], *, device_known: bool = True) -> None:
        """Trace-entry dicts of ``device``, in recorded order (``seq`` counts every entry read).

        ``device_known=False``: ``device`` is a provisional key that :meth:`relabel_trace_devices`
        replaces at the end (the streaming reader learns a list's device only then).
        """
        import numpy as np

        first = self.trace_seen.get(device, 0)
        self.trace_seen[device] = first + len(batch)
        if not batch or not self.keep.history or (device_known and not self.keep.keeps_device(device)):
            return
        n = len(batch)
        keys: set[Any] = set().union(*batch)
        raw_time = _column(batch, "time_us", None, keys)
        if None in raw_time:
            times = np.fromiter(
                (math.nan if t is None else float(t) for t in raw_time), dtype="float64", count=n
            )
        else:
            times = np.array(raw_time, dtype="float64")
        keep_rows: np.ndarray | None = None
        window = self.keep.time_range_us
        if window is not None:
            start, end = window
            untimed = np.isnan(times)
            self.untimed_entries += int(untimed.sum())
            inside = untimed.copy()
            inside |= (times >= (-math.inf if start is None else start)) & (
                times <= (math.inf if end is None else end)
            )
            if not inside.all():
                keep_rows = np.flatnonzero(inside)
                batch = [batch[i] for i in keep_rows.tolist()]
                times = times[keep_rows]
                n = len(batch)
        if not n:
            return
        seq = np.arange(first, first + len(raw_time), dtype="int64")
        if keep_rows is not None:
            seq = seq[keep_rows]

        def ints(key: str, default: int) -> np.ndarray:
            return _ints(_column(batch, key, default, keys))

        self._trace_chunks.append(
            {
                "device": np.full(n, device, dtype="int64"),
                "seq": seq,
                "action": self._coded("action", _column(batch, "action", "", keys)),
                "addr": ints("addr", 0),
                "size": _sizes(self.source, "trace entry", "size", ints("size", 0)),
                "stream": ints("stream", 0),
                "time_us": times,
                "compile_context": self._coded("cc", _column(batch, "compile_context", "", keys)),
                "user_metadata": self._coded("um", _column(batch, "user_metadata", "", keys)),
                "device_free": ints("device_free", -1),
                "stack_id": self._stack_ids(_column(batch, "frames", None, keys)),
            }
        )
        self.rows_kept += n

    def relabel_trace_devices(self, device_of: dict[int, int]) -> None:
        """Replace provisional trace keys by device numbers; drop devices not kept; device order."""
        kept = []
        for chunk in self._trace_chunks:
            device = device_of[int(chunk["device"][0])]
            if self.keep.keeps_device(device):
                chunk["device"][:] = device
                kept.append(chunk)
            else:
                self.rows_kept -= len(chunk["device"])
        kept.sort(key=lambda chunk: int(chunk["device"][0]))  # stable: recorded order within a device
        self._trace_chunks = kept
        self.trace_seen = {device_of.get(k, k): v for k, v in self.trace_seen.items()}

    def add_annotations(self, annotations: Iterable[dict[str, Any]]) -> None:
        window = self.keep.time_range_us
        if not self.keep.history:
            return
        for a in annotations:
            device, time_us = int(a.get("device", 0)), float(a.get("time_us", math.nan))
            if not self.keep.keeps_device(device):
                continue
            if window is not None and not math.isnan(time_us):
                start, end = window
                if (start is not None and time_us < start) or (end is not None and time_us > end):
                    continue
            self.annotations.append((device, str(a.get("stage", "")), str(a.get("name", "")), time_us))

    # -- the frames --------------------------------------------------------------------
    def _coded(self, name: str, values: Iterable[Any]) -> np.ndarray:
        import numpy as np

        return np.fromiter(map(self._codes[name].__getitem__, values), dtype="int32")

    def frames(self) -> dict[str, pd.DataFrame]:
        """``segments``, ``blocks``, ``trace``, ``annotations`` frames (the MemorySnapshot columns)."""
        import pandas as pd

        decode: dict[str, Callable[[Any], Any]] = {
            "segment_type": self._codes["segment_type"].decode,
            "pool": self._codes["pool"].decode,
            "state": self._codes["state"].decode,
            "action": self._codes["action"].decode,
            "compile_context": self._codes["cc"].decode,
            "user_metadata": self._codes["um"].decode,
        }
        return {
            "segments": _concat(self._segment_chunks, SEGMENT_COLUMNS, decode),
            "blocks": _concat(self._block_chunks, BLOCK_COLUMNS, decode),
            "trace": _concat(self._trace_chunks, TRACE_COLUMNS, decode),
            "annotations": pd.DataFrame(self.annotations, columns=["device", "stage", "name", "time_us"]),
        }


_EMPTY_DTYPES = {"time_us": "float64", "is_expandable": "bool"}
_TEXT = {"segment_type", "pool", "state", "action", "compile_context", "user_metadata"}


def _concat(
    chunks: list[dict[str, Any]], columns: Sequence[str], decode: dict[str, Callable[[Any], Any]]
) -> pd.DataFrame:
    """One frame from the chunks, column by column, releasing each column's chunks once joined.

    Memory: the frame plus one column's chunks at a time, not twice the frame. Columns are
    added one by one (not ``DataFrame(dict)``, which copies same-typed columns into one block).
    """
    import numpy as np
    import pandas as pd

    n = sum(len(c[columns[0]]) for c in chunks) if chunks else 0
    frame = pd.DataFrame(index=pd.RangeIndex(n))
    for name in columns:
        if chunks:
            values = np.concatenate([c.pop(name) for c in chunks])
        else:
            values = np.zeros(0, dtype="int32" if name in _TEXT else _EMPTY_DTYPES.get(name, "int64"))
        # Text columns are categoricals: a few distinct values over millions of rows.
        frame[name] = decode[name](values) if name in decode else values
        del values
    chunks.clear()
    return frame


def _block_requested_and_frames(
    blocks: Sequence[dict[str, Any]], sizes: np.ndarray
) -> tuple[np.ndarray, list[Any]]:
    """Per block: the bytes requested and its frames, in each of torch's block formats.

    Newer snapshots carry ``requested_size`` and ``frames``; the oldest carry ``history``
    (``real_size`` and ``frames`` of its first record) instead.
    """
    import numpy as np

    if all("frames" in b for b in blocks):
        requested = _column(blocks, "requested_size", None)
        frames = list(map(itemgetter("frames"), blocks))
        if None not in requested:
            return np.fromiter(map(int, requested), dtype="int64", count=len(blocks)), frames
    out = np.empty(len(blocks), dtype="int64")
    frames = []
    for i, block in enumerate(blocks):
        size = int(sizes[i])
        if "frames" in block:
            out[i] = int(block.get("requested_size", size))
            frames.append(block["frames"])
        elif block.get("history"):
            out[i] = int(block["history"][0].get("real_size", size))
            frames.append(block["history"][0].get("frames", []))
        else:
            out[i] = int(block.get("requested_size", size))
            frames.append([])
    return out, frames
