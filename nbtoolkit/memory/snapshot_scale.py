"""Write a large allocator snapshot by scaling a real one (for benchmarks and tests).

Real snapshots of long multi-GPU runs reach gigabytes; the ones we can share are megabytes.
:func:`write_scaled_snapshot` writes ``copies`` copies of a real snapshot into one pickle, the
way a longer run would look: copy ``j`` has its segment, block and trace addresses shifted past
the previous copies (``j * address_span``), its trace times shifted after them (``j *
(duration + 1 us)``), and lives on device ``j % devices``. Frames (stacks) stay shared, as torch
shares them. The result is a valid ``torch.cuda.memory._snapshot()`` pickle that torch's own
``_memory_viz`` reads.

The pickle is written opcode by opcode as it goes (never built in memory), so a 1 GB file costs
the writer only the source snapshot. Protocols 2 to 5 are written like :mod:`pickle` writes
them (``MEMOIZE`` and 64 KB frames from protocol 4, ``BINPUT`` before); for protocols 0 and 1 use
``pickle.dump`` on :func:`scaled_snapshot_dict` (small sizes only: it builds the dict).

Totals of a scaled snapshot exceed the device it came from on purpose (``copies / devices``
times its reserved bytes per device): the reader's capacity check must flag them.
"""

from __future__ import annotations

import math
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from nbtoolkit.core.errors import NbtUsageError

__all__ = ["copies_for", "copy_times", "scaled_snapshot_dict", "write_scaled_snapshot"]

_FRAME_TARGET = 64 * 1024
_BATCH = 1000  # items per APPENDS, as pickle writes them


def _span(snapshot: dict[str, Any]) -> tuple[int, int, float, float]:
    """(lowest address, address span as a power of two, first time_us, duration in us)."""
    lows, highs = [], []
    for seg in snapshot.get("segments") or []:
        lows.append(int(seg["address"]))
        highs.append(int(seg["address"]) + int(seg["total_size"]))
    for trace in snapshot.get("device_traces") or []:
        for entry in trace:
            if entry.get("addr"):
                lows.append(int(entry["addr"]))
                highs.append(int(entry["addr"]) + int(entry.get("size", 0)))
    low, high = (min(lows), max(highs)) if lows else (0, 1)
    span = 1 << max(int(high - low).bit_length(), 20)
    times = [float(e["time_us"]) for t in snapshot.get("device_traces") or [] for e in t if "time_us" in e]
    times += [float(a["time_us"]) for a in snapshot.get("external_annotations") or [] if "time_us" in a]
    first, last = (min(times), max(times)) if times else (0.0, 0.0)
    return low, span, first, last - first + 1.0


def _copies(snapshot: dict[str, Any], copies: int, devices: int) -> Iterator[tuple[int, int, int, float]]:
    """(copy, device, address shift, time shift) per copy."""
    _, span, _, duration = _span(snapshot)
    for j in range(copies):
        yield j, j % devices, j * span, j * duration


def _shift_segment(seg: dict[str, Any], device: int, shift: int) -> dict[str, Any]:
    out = dict(seg, device=device, address=int(seg["address"]) + shift)
    # Always a copy: a block shared between copies would be one dict referenced twice.
    blocks = [
        dict(block, address=int(block["address"]) + shift) if "address" in block else dict(block)
        for block in seg.get("blocks") or []
    ]
    out["blocks"] = blocks
    return out


def _shift_entry(entry: dict[str, Any], shift: int, dt: float) -> dict[str, Any]:
    out = dict(entry)
    if out.get("addr"):
        out["addr"] = int(out["addr"]) + shift
    if "time_us" in out:
        out["time_us"] = type(out["time_us"])(out["time_us"] + dt)
    return out


def _checked(snapshot: Any, copies: int, devices: int) -> dict[str, Any]:
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        raise NbtUsageError("scaling needs a snapshot dict (segments, device_traces), not the legacy list")
    if copies < 1 or devices < 1:
        raise NbtUsageError(f"copies and devices must be at least 1, got copies={copies}, devices={devices}")
    return snapshot


def scaled_snapshot_dict(snapshot: dict[str, Any], copies: int, *, devices: int = 1) -> dict[str, Any]:
    """The scaled snapshot as a dict (see the module docstring); for small sizes and any protocol."""
    snapshot = _checked(snapshot, copies, devices)
    traces: list[list[dict[str, Any]]] = [[] for _ in range(devices)]
    segments = []
    annotations = []
    original_traces = snapshot.get("device_traces") or []
    for j, device, shift, dt in _copies(snapshot, copies, devices):
        segments += [_shift_segment(seg, device, shift) for seg in snapshot.get("segments") or []]
        for trace in original_traces:
            traces[device] += [_shift_entry(e, shift, dt) for e in trace]
        annotations += [
            dict(a, device=device, time_us=type(a["time_us"])(a["time_us"] + dt)) if "time_us" in a else a
            for a in snapshot.get("external_annotations") or []
        ]
        del j
    out = dict(snapshot, segments=segments, device_traces=traces)
    if "external_annotations" in snapshot:
        out["external_annotations"] = annotations
    return out


class _PickleWriter:
    """Writes builtin containers and scalars as pickle opcodes, memoizing the source's objects."""

    def __init__(self, out: BinaryIO, protocol: int) -> None:
        self.out = out
        self.protocol = protocol
        self.buffer = bytearray()
        self.memo: dict[int, int] = {}
        self.next_memo = 0
        self._alive: list[Any] = []
        self.written = 0
        self._fresh: set[int] = set()  # ids of the copies being written (never memoized by identity)

    # -- framing -------------------------------------------------------------------------
    def boundary(self) -> None:
        """A point between whole objects: flush a frame once it is big enough."""
        if len(self.buffer) >= _FRAME_TARGET:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        if self.protocol >= 4:
            self.out.write(pickle.FRAME + struct.pack("<Q", len(self.buffer)))
            self.written += 9
        self.out.write(self.buffer)
        self.written += len(self.buffer)
        self.buffer = bytearray()

    # -- memo ----------------------------------------------------------------------------
    def _put(self) -> None:
        index = self.next_memo
        self.next_memo += 1
        if self.protocol >= 4:
            self.buffer += pickle.MEMOIZE
        elif index < 256:
            self.buffer += pickle.BINPUT + bytes([index])
        else:
            self.buffer += pickle.LONG_BINPUT + struct.pack("<I", index)

    def _get(self, index: int) -> None:
        if index < 256:
            self.buffer += pickle.BINGET + bytes([index])
        else:
            self.buffer += pickle.LONG_BINGET + struct.pack("<I", index)

    def _remember(self, obj: Any) -> None:
        self.memo[id(obj)] = self.next_memo
        self._alive.append(obj)
        self._put()

    # -- values --------------------------------------------------------------------------
    def save_list(self, copies: Iterator[dict[str, Any]]) -> None:
        """A fresh list of copies made for this file, written as they come (APPENDS per 1000)."""
        self.buffer += pickle.EMPTY_LIST
        self._put()
        batch = 0
        for item in copies:
            if batch == 0:
                self.buffer += pickle.MARK
            self.save_copy(item)
            batch += 1
            if batch == _BATCH:
                self.buffer += pickle.APPENDS
                batch = 0
                self.boundary()
        if batch:
            self.buffer += pickle.APPENDS

    def save_copy(self, obj: Any) -> None:
        """Write a copy made for this file: it and the containers in it made with it are fresh."""
        fresh = {id(obj)}
        if type(obj) is dict:
            for value in obj.values():
                if type(value) is list and value is not obj.get("frames"):
                    fresh.add(id(value))
                    fresh.update(id(item) for item in value if type(item) is dict)
        self._fresh = fresh
        try:
            self.save(obj, shared=False)
        finally:
            self._fresh = set()

    def save(self, obj: Any, *, shared: bool = True) -> None:
        """Write ``obj``; ``shared``: the source's object (memoized by identity), else a fresh one."""
        kind = type(obj)
        if kind is int:
            self._int(obj)
        elif kind is float:
            self.buffer += pickle.BINFLOAT + struct.pack(">d", obj)
        elif obj is None:
            self.buffer += pickle.NONE
        elif kind is bool:
            self.buffer += pickle.NEWTRUE if obj else pickle.NEWFALSE
        elif shared and id(obj) in self.memo:
            self._get(self.memo[id(obj)])
        elif kind is str:
            data = obj.encode("utf-8", "surrogatepass")
            if len(data) < 256 and self.protocol >= 4:
                self.buffer += pickle.SHORT_BINUNICODE + bytes([len(data)]) + data
            else:
                self.buffer += pickle.BINUNICODE + struct.pack("<I", len(data)) + data
            self._memo_or_put(obj, shared)
        elif kind is dict:
            self.buffer += pickle.EMPTY_DICT
            self._memo_or_put(obj, shared)
            if obj:
                self.buffer += pickle.MARK
                for key, value in obj.items():
                    self.save(key)
                    self.save(value, shared=id(value) not in self._fresh)
                self.buffer += pickle.SETITEMS
        elif kind is list:
            self.buffer += pickle.EMPTY_LIST
            self._memo_or_put(obj, shared)
            for start in range(0, len(obj), _BATCH):
                self.buffer += pickle.MARK
                for item in obj[start : start + _BATCH]:
                    self.save(item, shared=id(item) not in self._fresh)
                self.buffer += pickle.APPENDS
        elif kind is tuple:
            self.buffer += pickle.MARK
            for item in obj:
                self.save(item)
            self.buffer += pickle.TUPLE
        else:
            raise NbtUsageError(f"a snapshot holds only builtin values; found {kind.__name__}")

    def _memo_or_put(self, obj: Any, shared: bool) -> None:
        if shared:
            self._remember(obj)
        else:
            self._put()  # the unpickler counts it; nothing refers to it again

    def _int(self, value: int) -> None:
        if 0 <= value < 256:
            self.buffer += pickle.BININT1 + bytes([value])
        elif 0 <= value < 65536:
            self.buffer += pickle.BININT2 + struct.pack("<H", value)
        elif -(2**31) <= value < 2**31:
            self.buffer += pickle.BININT + struct.pack("<i", value)
        else:
            data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.buffer += pickle.LONG1 + bytes([len(data)]) + data


def copies_for(
    source: dict[str, Any], target_bytes: int, probe: Path, *, devices: int = 1, protocol: int = 5
) -> int:
    """How many copies make a file of at least ``target_bytes`` (two small probe files measure one copy)."""
    sizes = [
        write_scaled_snapshot(source, probe, copies=n, devices=devices, protocol=protocol).stat().st_size
        for n in (devices, 2 * devices)
    ]
    probe.unlink()
    per_copy = max((sizes[1] - sizes[0]) / devices, 1.0)  # the parts written once do not count
    return max(1, math.ceil((target_bytes - sizes[0]) / per_copy) + devices)


def copy_times(source: dict[str, Any], copies: int) -> tuple[float, float]:
    """(first time_us, time_us span of one copy): copy ``j`` runs from ``first + j * span``."""
    _, _, first, duration = _span(source)
    return first, duration


def write_scaled_snapshot(
    source: dict[str, Any],
    path: str | Path,
    *,
    copies: int | None = None,
    target_bytes: int | None = None,
    devices: int = 1,
    protocol: int = 5,
) -> Path:
    """Write the scaled snapshot of ``source`` (an unpickled snapshot dict) to ``path``.

    Give ``copies``, or ``target_bytes`` (copies are then chosen to reach at least that size).
    ``protocol``: 2 to 5 (0 and 1: ``pickle.dump(scaled_snapshot_dict(...))``).
    """
    source = _checked(source, copies or 1, devices)
    if protocol not in (2, 3, 4, 5):
        raise NbtUsageError(
            f"protocol={protocol}: write protocols 0 and 1 with pickle.dump(scaled_snapshot_dict(...))"
        )
    if copies is None:
        if target_bytes is None:
            raise NbtUsageError("give copies= or target_bytes=")
        copies = copies_for(
            source, target_bytes, Path(path).with_suffix(".probe"), devices=devices, protocol=protocol
        )
    target = Path(path)
    with open(target, "wb") as out:
        writer = _PickleWriter(out, protocol)
        out.write(pickle.PROTO + bytes([protocol]))  # before the first frame, as pickle writes it
        writer.buffer += pickle.EMPTY_DICT
        writer._put()
        writer.buffer += pickle.MARK
        plan = list(_copies(source, copies, devices))
        writer.save("segments")
        writer.save_list(
            _shift_segment(seg, device, shift)
            for _, device, shift, _dt in plan
            for seg in source.get("segments") or []
        )
        writer.save("device_traces")
        writer.buffer += pickle.EMPTY_LIST
        writer._put()
        writer.buffer += pickle.MARK
        originals = source.get("device_traces") or []
        for device in range(devices):
            writer.save_list(
                _shift_entry(entry, shift, dt)
                for _, on, shift, dt in plan
                if on == device
                for trace in originals
                for entry in trace
            )
        writer.buffer += pickle.APPENDS
        for key, value in source.items():
            if key in ("segments", "device_traces"):
                continue
            writer.save(key)
            if key == "external_annotations":
                copies_of = [
                    dict(a, device=device, time_us=type(a["time_us"])(a["time_us"] + dt))
                    if "time_us" in a
                    else a
                    for _, device, _s, dt in plan
                    for a in value
                ]
                writer.save_copy(copies_of)
            else:
                writer.save(value)
            writer.boundary()
        writer.buffer += pickle.SETITEMS + pickle.STOP
        writer.flush()
    return target
