"""Read a large allocator snapshot pickle in bounded memory: columns while the unpickler runs.

A snapshot pickle unpickles to Python dicts that take five to ten times the file's bytes (a
trace entry of ~80 pickled bytes becomes a dict of ~500). Loading a 1 GB snapshot whole needs
5-10 GB; torch's ``memory_viz`` does that and more. Here the file is read by the same
restricted C unpickler as small ones (:func:`nbtoolkit.memory.snapshot_reader.restricted_loads`: it
resolves no global, so nothing in the file can run), and *while it runs* the finished dicts are
turned into numpy columns and emptied:

1. The unpickler reads the file through :class:`_DrainingReader`, which calls :meth:`_Drain.run`
   every ``drain_every`` bytes (the C unpickler asks for data a frame, 64-128 KB, at a time).
2. :meth:`_Drain.run` finds the lists being filled: the containers created since the last
   drain are exactly the garbage collector's youngest generation (collection is off during the
   load and each drain moves what it saw out with ``gc.freeze()``), so finding them costs the
   new objects only. A list of dicts with ``total_size``/``blocks`` is the segment list, a list
   of dicts with ``action`` a device's trace.
3. Items the unpickler has appended to those lists are complete. They are handed to
   :class:`~nbtoolkit.memory.snapshot_columns.SnapshotColumns` (filters applied there), then each
   dict is cleared and removed from its list. The unpickler's memo still refers to the emptied
   dicts (about 64 bytes each instead of ~500), which keeps its indices valid.

Memory therefore stays near the columns kept (~50 bytes a row) plus an empty dict per row
read; time is the C unpickler's plus C-speed column extraction (``map(itemgetter)``).

Limits of the method, said plainly:

* A file in which one dict is referenced twice (torch never writes that; a hand-made "bomb"
  does) meets an emptied dict the second time: :class:`SnapshotError`, asking to load it with
  ``stream=False`` (which counts shared references against ``max_rows`` instead).
* The device of a trace list is only known at the end (entries carry no device; the outer
  list is filled last), so ``devices=`` drops other devices' *segments and blocks* while
  reading and their *trace rows* at the end (as compact columns: the dicts are gone already).
* It relies on CPython's generational collector (``gc.get_objects(generation=0)``,
  ``gc.freeze``). Where that is not available, or something else froze objects, the reader
  falls back to the whole load and says so in the snapshot's notes.
"""

from __future__ import annotations

import gc
import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from nbtoolkit.core.bounded import CorruptGzip, inflate, limit, limit_hint, max_read_bytes, open_regular
from nbtoolkit.core.errors import SnapshotError
from nbtoolkit.memory.snapshot_columns import SnapshotColumns, SnapshotFilter
from nbtoolkit.memory.snapshot_pickle import UNPICKLING_ERRORS, RefusingUnpickler, corrupt_pickle
from nbtoolkit.memory.snapshot_stacks import StackLimits

if TYPE_CHECKING:
    from nbtoolkit.memory.snapshot import MemorySnapshot

__all__ = ["DRAIN_EVERY_BYTES", "stack_limits", "stream_snapshot"]

#: how often (bytes of pickle read) finished dicts are turned into columns and emptied
DRAIN_EVERY_BYTES = 2 << 20


class _Inflated(io.RawIOBase):
    """A gzip file inflated on demand, within the read limit (for io.BufferedReader)."""

    def __init__(self, fh: BinaryIO, path: Path, limit: int) -> None:
        self._chunks = inflate(fh, path, SnapshotError, 4 << 20, limit=limit)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
            except CorruptGzip as exc:
                raise SnapshotError(
                    f"a corrupt or truncated gzip snapshot ({exc}); copy or dump it again"
                ) from None
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


class _DrainingReader:
    """What the C unpickler reads from: counts bytes, stops at the limit, drains every so often."""

    def __init__(self, fh: BinaryIO, path: Path, every: int, drain: Callable[[], None]) -> None:
        self._fh: Any = fh  # a buffered reader (peek): the file, or the inflated gzip stream
        self._path = path
        self._every = every
        self._next = every
        self._drain = drain
        self._limit = max_read_bytes()
        self.position = 0

    def _advance(self, n: int) -> None:
        self.position += n
        if self.position > self._limit:
            raise SnapshotError(
                f"{self._path}: stopped reading after {self.position:,} bytes, over the limit of "
                f"{self._limit:,}; raise it with max_bytes= or NBT_MAX_READ_BYTES if the file is real"
            )
        if self.position >= self._next:
            self._next = self.position + self._every
            self._drain()

    def peek(self, n: int = 0) -> bytes:
        return self._fh.peek(n)

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self._advance(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        n = self._fh.readinto(buffer)
        self._advance(n or 0)
        return n or 0

    def readline(self) -> bytes:
        data = self._fh.readline()
        self._advance(len(data))
        return data


def _is_segment(item: Any) -> bool:
    return type(item) is dict and "total_size" in item and "address" in item


def _is_trace_entry(item: Any) -> bool:
    return type(item) is dict and "action" in item and "addr" in item


class _EnoughRead(Exception):
    """Raised from the reader to stop the unpickler: everything asked for has been read."""


class _Drain:
    """Finds the segment list and the trace lists as they fill, and empties what is complete."""

    def __init__(self, columns: SnapshotColumns, source: str, max_rows: int) -> None:
        self.columns = columns
        self.source = source
        self.max_rows = max_rows
        self.segments: list[Any] | None = None
        self.traces: list[list[Any]] = []  # in creation order: device order
        self._traced: set[int] = set()
        self._pending: list[list[Any]] = []  # lists that were still empty at the last look
        self.trace_chunks: dict[int, int] = {}  # id(trace list) -> its provisional key
        # True once a trace list began after the segment list: the segments are complete then
        self.segments_complete = False
        self.finished = False  # the unpickler has returned: nothing left to stop

    def _classify(self, candidate: list[Any]) -> None:
        first = candidate[0]
        if _is_segment(first) and self.segments is None:
            self.segments = candidate
        elif _is_trace_entry(first) and id(candidate) not in self._traced:
            self.segments_complete = self.segments_complete or self.segments is not None
            self._traced.add(id(candidate))
            self.trace_chunks[id(candidate)] = len(self.traces)
            self.traces.append(candidate)

    def run(self) -> None:
        fresh = gc.get_objects(generation=0)
        gc.freeze()
        pending, self._pending = self._pending, []
        for candidate in pending:
            if candidate:
                self._classify(candidate)
        for obj in fresh:
            if type(obj) is list:
                if obj:
                    self._classify(obj)
                else:
                    self._pending.append(obj)
        del fresh
        self.empty_lists()
        if self.segments_complete and not self.columns.keep.history and not self.finished:
            raise _EnoughRead  # the history is not wanted and follows the segments: stop here

    def empty_lists(self) -> None:
        if self.segments:
            batch = self.segments[:]
            del self.segments[:]
            self._segments(batch)
        for trace in self.traces:
            if trace:
                batch = trace[:]
                del trace[:]
                self._trace(self.trace_chunks[id(trace)], batch)
        if self.columns.rows_kept > self.max_rows:
            raise SnapshotError(
                f"{self.source} stands for more than {self.max_rows:,} rows kept (segments, blocks and "
                "trace entries); raise the budget with max_rows= or NBT_MAX_SNAPSHOT_ROWS, or keep fewer "
                "rows with devices= / time_range_us="
            )

    def _segments(self, batch: list[Any]) -> None:
        if len(set(map(id, batch))) != len(batch):
            raise _shared_or_malformed(self.source, ValueError("one segment appears twice"))
        try:
            self.columns.add_segments(batch)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise _shared_or_malformed(self.source, exc) from None
        for segment in batch:
            for block in segment.get("blocks") or []:
                if type(block) is dict:
                    block.clear()
            segment.clear()

    def _trace(self, key: int, batch: list[Any]) -> None:
        if len(set(map(id, batch))) != len(batch):
            raise _shared_or_malformed(self.source, ValueError("one trace entry appears twice"))
        try:
            self.columns.add_trace(key, batch, device_known=False)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise _shared_or_malformed(self.source, exc) from None
        for entry in batch:
            entry.clear()


def _shared_or_malformed(source: str, exc: Exception) -> SnapshotError:
    return SnapshotError(
        f"{source}: a segment, block or trace entry is malformed or referred to twice "
        f"({type(exc).__name__}: {exc}); torch never writes shared entries. Load it with "
        "stream=False (shared references then count against max_rows)"
    )


def stack_limits() -> StackLimits:
    """What a snapshot's stacks may cost (``NBT_MAX_STACK_FRAMES``, ``NBT_MAX_STACK_TEXT_BYTES``)."""
    return StackLimits(
        frames=limit("stack_frames"),
        frames_hint=limit_hint("stack_frames"),
        text_bytes=limit("stack_text_bytes"),
        text_hint=limit_hint("stack_text_bytes"),
    )


def stream_snapshot(
    path: Path,
    *,
    keep: SnapshotFilter,
    max_rows: int,
    drain_every: int = DRAIN_EVERY_BYTES,
) -> MemorySnapshot | None:
    """The snapshot at ``path`` read in bounded memory; None when this interpreter cannot stream.

    The caller falls back to the whole load on None (see the module docstring for when).
    """

    if not hasattr(gc, "freeze") or gc.get_freeze_count() > 0:
        return None
    columns = SnapshotColumns(keep, source=str(path), stack_limits=stack_limits())
    drain = _Drain(columns, str(path), max_rows)
    was_enabled = gc.isenabled()
    gc.disable()
    gc.freeze()  # what existed before the load is not ours to look at
    try:
        with open_regular(path, SnapshotError, "memory snapshot") as fh:
            source: BinaryIO = fh
            if fh.read(2) == b"\x1f\x8b":
                fh.seek(0)
                source = io.BufferedReader(_Inflated(fh, path, max_read_bytes()), 1 << 20)
            else:
                fh.seek(0)
            reader = _DrainingReader(source, path, drain_every, drain.run)
            try:
                raw = RefusingUnpickler(reader).load()
            except _EnoughRead:
                return _segments_only(drain, columns, path, reader.position)
            except SnapshotError as exc:
                message = str(exc)
                raise SnapshotError(message if str(path) in message else f"{path}: {message}") from None
            except UNPICKLING_ERRORS as exc:
                raise corrupt_pickle(str(path), exc) from None
        drain.finished = True
        drain.run()  # what the unpickler appended after the last drain
        return _finish(raw, drain, columns, path)
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def _segments_only(drain: _Drain, columns: SnapshotColumns, path: Path, read: int) -> MemorySnapshot:
    """The snapshot of the segments read so far (history=False stopped the unpickler after them)."""
    from nbtoolkit.memory.snapshot import MemorySnapshot

    result = MemorySnapshot.from_columns(columns, source=str(path))
    result.notes.append(
        f"read streaming, segments only: stopped after {read:,} bytes, where the history begins"
    )
    return result


def _finish(raw: Any, drain: _Drain, columns: SnapshotColumns, path: Path) -> MemorySnapshot:
    """Rows left in lists never drained (small files), device numbers of the trace lists, the object."""
    from nbtoolkit.memory.snapshot import MemorySnapshot

    legacy = isinstance(raw, list)
    snapshot: dict[str, Any] = {"segments": raw} if legacy else raw
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        kind = type(raw).__name__
        raise SnapshotError(
            f"{path} holds a {kind}, not a CUDA allocator snapshot "
            "(expected a dict with 'segments' or a list of segments from torch.cuda.memory._snapshot())"
        )
    segments = snapshot.get("segments") or []
    if segments and segments is not drain.segments:
        drain._segments(list(segments))
    device_of: dict[int, int] = {}
    for device, entries in enumerate(snapshot.get("device_traces") or []):
        key = drain.trace_chunks.get(id(entries))
        if key is None:  # never drained (a small trace): read it now
            key = len(drain.traces)
            drain.trace_chunks[id(entries)] = key
            drain.traces.append(entries)
            if entries:
                drain._trace(key, list(entries))
        device_of[key] = device
    columns.relabel_trace_devices(device_of)
    columns.add_annotations(snapshot.get("external_annotations") or [])
    result = MemorySnapshot.from_columns(
        columns,
        source=str(path),
        allocator_settings=dict(snapshot.get("allocator_settings") or {}),
        legacy_segment_list=legacy,
    )
    result.notes.append(f"read streaming: {columns.rows_kept:,} rows kept")
    return result
