"""`MemorySnapshot`: a CUDA caching-allocator snapshot as frames.

Made by :func:`nbtoolkit.memory.snapshot_reader.load_memory_snapshot` from what
``torch.cuda.memory._snapshot()`` returns. The allocator reserves *segments* from CUDA
(``cudaMalloc``) and splits them into *blocks*; an ``active_allocated`` block holds a
tensor, the rest is cached free memory. With ``_record_memory_history`` enabled, the
snapshot also carries a *trace* per device: every alloc / free / segment event with the
stack that caused it.

Frames:

* ``segments``: one row per segment (``segment, device, address, total_size,
  allocated_size, active_size, requested_size, stream, segment_type, pool, is_expandable``).
* ``blocks``: one row per block (``segment, device, address, offset, size,
  requested_size, state, stack_id``); ``requested_size`` is what the program asked for,
  ``size`` what the allocator handed out after rounding.
* ``trace``: one row per trace entry (``device, seq, action, addr, size, stream,
  time_us, compile_context, user_metadata, device_free, stack_id``); ``time_us`` is NaN
  in older snapshots that did not record it.
* ``annotations``: ``external_annotations`` (``device, stage, name, time_us``), e.g. the
  ``Optimizer.step#AdamW.step`` START/END ranges torch emits.
* ``stacks``: interned stacks, innermost frame first, one ``file:line in function`` per line.

How stacks are turned into text and phase hints is in :mod:`nbtoolkit.memory.snapshot_stacks`;
how the trace becomes a :class:`~nbtoolkit.memory.timeline.MemoryTimeline` (:meth:`MemorySnapshot.timeline`)
is in :mod:`nbtoolkit.memory.snapshot_timeline`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes, memory_viz_size
from nbtoolkit.memory.snapshot_capacity import capacity_check, impossible_notes
from nbtoolkit.memory.snapshot_columns import SnapshotColumns, SnapshotFilter
from nbtoolkit.memory.snapshot_stacks import StackLimits
from nbtoolkit.memory.snapshot_timeline import snapshot_events

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.memory.timeline import MemoryTimeline

__all__ = ["MemorySnapshot", "SnapshotStats", "memory_viz_size"]

_FRAMES = ("segments", "blocks", "trace", "annotations")
_SAVED_FORMAT = "nbtoolkit.MemorySnapshot"


@dataclass(repr=False)
class SnapshotStats(Result):
    """Totals of a snapshot's segments, defined exactly as ``python -m torch.cuda._memory_viz stats``.

    * ``total_reserved``: sum of ``total_size`` over all segments (memory taken from CUDA).
    * ``total_allocated``: sum over ``active_allocated`` blocks of the size the program
      requested (``requested_size``; in the oldest format ``history[0].real_size``).
    * ``free_internal``: for active blocks, ``size - requested_size`` (lost to rounding).
    * ``free_external``: sum of the sizes of blocks that are not active (cached, free).
    * ``total_free = free_internal + free_external``; ``internal_pct = 100 * internal / total_free``.
    """

    segments: int
    total_reserved: int
    total_allocated: int
    free_internal: int
    free_external: int

    @property
    def total_free(self) -> int:
        return self.free_internal + self.free_external

    @property
    def internal_pct(self) -> float:
        return 100.0 * self.free_internal / self.total_free if self.total_free else 0.0

    def lines(self) -> list[str]:
        """The four total lines of ``_memory_viz stats``, formatted the same way."""
        free = memory_viz_size(self.total_free)
        if self.total_free:
            free += f" ({self.internal_pct:.1f}% internal)"
        return [
            f"segments: {self.segments}",
            f"total_reserved: {memory_viz_size(self.total_reserved)}",
            f"total_allocated: {memory_viz_size(self.total_allocated)}",
            f"total_free: {free}",
        ]

    def _text(self) -> str:
        return "\n".join(self.lines())

    def _html(self) -> str:
        return "<pre>" + escape(self._text()) + "</pre>"


@dataclass(repr=False)
class MemorySnapshot(Result):
    """A CUDA allocator snapshot: segments, blocks, per-device traces, annotations."""

    segments: pd.DataFrame
    blocks: pd.DataFrame
    trace: pd.DataFrame
    annotations: pd.DataFrame
    stacks: list[str] = field(default_factory=list)
    stack_hints: list[str] = field(default_factory=list)
    stack_sources: list[str] = field(default_factory=list)
    allocator_settings: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    legacy_segment_list: bool = False
    #: what the reader wants the user to know (filters applied, impossible totals)
    notes: list[str] = field(default_factory=list)
    #: per stack: Mosaic's category of it (nbtoolkit.memory.snapshot_mosaic); [] in older saves
    stack_mosaic: list[str] = field(default_factory=list)

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_dict(
        cls,
        snapshot: dict[str, Any],
        *,
        source: str = "",
        keep: SnapshotFilter | None = None,
        stack_limits: StackLimits | None = None,
    ) -> MemorySnapshot:
        """Build from the dict ``torch.cuda.memory._snapshot()`` returns (already unpickled safely).

        ``keep``: devices and a time range to keep (see :mod:`nbtoolkit.memory.snapshot_columns`).
        ``stack_limits``: what the stacks may cost (the readers pass ``NBT_MAX_STACK_FRAMES`` and
        ``NBT_MAX_STACK_TEXT_BYTES``); None: no limits.
        """
        columns = SnapshotColumns(keep, source=source, stack_limits=stack_limits)
        columns.add_segments(list(snapshot.get("segments") or []))
        for device, entries in enumerate(snapshot.get("device_traces") or []):
            columns.add_trace(device, list(entries or []))
        columns.add_annotations(snapshot.get("external_annotations") or [])
        return cls.from_columns(
            columns,
            source=source,
            allocator_settings=dict(snapshot.get("allocator_settings") or {}),
            legacy_segment_list=bool(snapshot.get("legacy_segment_list", False)),
        )

    @classmethod
    def from_columns(
        cls,
        columns: SnapshotColumns,
        *,
        source: str = "",
        allocator_settings: dict[str, Any] | None = None,
        legacy_segment_list: bool = False,
    ) -> MemorySnapshot:
        """The snapshot from columns filled batch by batch (what the streaming reader builds)."""
        frames = columns.frames()
        notes = []
        if columns.keep.active:
            notes.append(f"filtered while reading: {columns.keep.describe()}")
        if columns.keep.time_range_us is not None and columns.untimed_entries:
            notes.append(
                f"{columns.untimed_entries:,} trace entries record no time_us and were kept: "
                "the time range could not apply to them"
            )
        snapshot = cls(
            **frames,
            stacks=columns.interner.stacks,
            stack_hints=columns.interner.hints,
            stack_sources=columns.interner.sources,
            stack_mosaic=columns.interner.mosaic,
            allocator_settings=dict(allocator_settings or {}),
            source=source,
            legacy_segment_list=legacy_segment_list,
            notes=notes,
        )
        snapshot.notes.extend(impossible_notes(snapshot))
        return snapshot

    # -- persistence -------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the snapshot to a folder: one Parquet file per frame plus ``snapshot.json``.

        Plain data only (no pickle), so a saved snapshot is safe to share and to load.
        """
        from nbtoolkit.core.errors import SaveError
        from nbtoolkit.core.paths import path_errors
        from nbtoolkit.core.saved import folder_to_save

        folder = folder_to_save(path, "snapshot.json", what="MemorySnapshot")
        meta = {
            "format": _SAVED_FORMAT,
            "version": 1,
            "stacks": self.stacks,
            "stack_hints": self.stack_hints,
            "stack_sources": self.stack_sources,
            "allocator_settings": self.allocator_settings,
            "source": self.source,
            "legacy_segment_list": self.legacy_segment_list,
            "notes": self.notes,
            "stack_mosaic": self.stack_mosaic,
        }
        with path_errors(folder, "save the MemorySnapshot into", error=SaveError):
            for name in _FRAMES:
                getattr(self, name).to_parquet(folder / f"{name}.parquet", index=False)
            (folder / "snapshot.json").write_text(json.dumps(meta, default=str))
        return folder

    @classmethod
    def load(cls, path: str | Path) -> MemorySnapshot:
        """Read a snapshot folder written by :meth:`save`; a damaged or edited one is a SnapshotError."""
        from nbtoolkit.memory.snapshot_saved import read_snapshot_folder

        frames, meta = read_snapshot_folder(path)
        return cls(**frames, **meta)

    # -- the allocator's view ----------------------------------------------------------
    def stats(self) -> SnapshotStats:
        """Totals exactly as ``python -m torch.cuda._memory_viz stats`` computes them (see SnapshotStats)."""
        blocks = self.blocks
        active = blocks["state"] == "active_allocated"
        allocated = int(blocks.loc[active, "requested_size"].sum())
        internal = int((blocks.loc[active, "size"] - blocks.loc[active, "requested_size"]).sum())
        external = int(blocks.loc[~active, "size"].sum())
        return SnapshotStats(
            segments=len(self.segments),
            total_reserved=int(self.segments["total_size"].sum()),
            total_allocated=allocated,
            free_internal=internal,
            free_external=external,
        )

    def segment_summary(self) -> pd.DataFrame:
        """Per segment: reserved, allocated (requested bytes of active blocks), free split, fragmentation.

        ``largest_free`` is the largest inactive block; ``fragmentation`` = ``1 - largest_free /
        free_external`` (0 when all cached free memory is one block, near 1 when it is
        scattered in many small holes; 0 for a segment with no free block).
        """
        import numpy as np

        blocks = self.blocks
        active = blocks["state"] == "active_allocated"
        per = blocks.assign(
            allocated=np.where(active, blocks["requested_size"], 0),
            free_internal=np.where(active, blocks["size"] - blocks["requested_size"], 0),
            free_external=np.where(active, 0, blocks["size"]),
            active_blocks=active.astype("int64"),
        ).groupby("segment")
        summary = self.segments[
            ["segment", "device", "address", "total_size", "stream", "segment_type"]
        ].copy()
        summary = summary.rename(columns={"total_size": "reserved"})
        for name in ("allocated", "free_internal", "free_external", "active_blocks"):
            summary[name] = summary["segment"].map(per[name].sum()).fillna(0).astype("int64")
        summary["largest_free"] = summary["segment"].map(per["free_external"].max()).fillna(0).astype("int64")
        summary["fragmentation"] = np.where(
            summary["free_external"] > 0,
            1.0 - summary["largest_free"] / summary["free_external"].clip(lower=1),
            0.0,
        )
        return summary

    def fragmentation(self) -> float:
        """``1 - largest free block / all free cached bytes`` over every segment (0 if nothing is free).

        Memory that is free but split into many blocks cannot serve one large request:
        a value near 1 means a big allocation may fail (or force a new segment) although
        ``free_external`` looks ample.
        """
        inactive = self.blocks.loc[self.blocks["state"] != "active_allocated", "size"]
        total = int(inactive.sum())
        return 1.0 - int(inactive.max()) / total if total else 0.0

    @property
    def ooms(self) -> pd.DataFrame:
        """Trace entries of out-of-memory events (``size`` requested, ``device_free`` bytes free in CUDA)."""
        return self.trace[self.trace["action"] == "oom"].reset_index(drop=True)

    def reserved_series(self, device: int | None = None) -> pd.DataFrame:
        """Bytes reserved from CUDA over the trace of one device: ``time_us``, ``reserved_bytes``.

        Replayed backwards from the segments in the snapshot: reserved at the start =
        reserved at the end - ``segment_alloc`` sizes + ``segment_free``/``segment_unmap``
        sizes in the trace (+ ``segment_map``); then forwards event by event. ``time_us``
        uses the same origin as :meth:`timeline` (0 = first trace entry; the entry index
        for snapshots without ``time_us``). Compare it with the timeline's allocated
        bytes to see how much the caching allocator holds back.
        """
        import numpy as np
        import pandas as pd

        if device is None:
            device = _default_device(self)
        trace = self.trace[self.trace["device"] == device]
        change = np.zeros(len(trace), dtype="int64")
        actions = trace["action"].to_numpy()
        sizes = trace["size"].to_numpy(dtype="int64")
        grow = np.isin(actions, ["segment_alloc", "segment_map"])
        shrink = np.isin(actions, ["segment_free", "segment_unmap"])
        change[grow] = sizes[grow]
        change[shrink] = -sizes[shrink]
        final = int(self.segments.loc[self.segments["device"] == device, "total_size"].sum())
        start = final - int(change.sum())
        has_time = bool(len(trace)) and not trace["time_us"].isna().any()
        times = (
            trace["time_us"].to_numpy(dtype="float64") if has_time else np.arange(len(trace), dtype="float64")
        )
        origin = float(times.min()) if len(times) else 0.0
        return pd.DataFrame(
            {
                "time_us": np.r_[0.0, times - origin],
                "reserved_bytes": np.r_[start, start + np.cumsum(change)],
            }
        )

    def capacity_check(self, capacity_bytes: int | dict[int, int] | None = None) -> pd.DataFrame:
        """Per device: reserved and allocated bytes against the device's capacity, and any problem.

        See :mod:`nbtoolkit.memory.snapshot_capacity` (a given capacity, what an OOM entry states,
        the largest device made). Impossible totals are also in :attr:`notes` from loading.
        """
        return capacity_check(self, capacity_bytes)

    # -- analyses (nbtoolkit.memory.breakdown / memory_diff) -------------------
    def peak_stack(self, device: int | None = None) -> Any:
        """The peak of ``device``'s timeline, what is alive then and the stacks (a PeakStack)."""
        from nbtoolkit.memory.breakdown import timeline_peak_stack

        return timeline_peak_stack(self.timeline(device))

    def memory_by(
        self, by: str = "category", *, pattern: str | None = None, device: int | None = None
    ) -> Any:
        """Memory grouped by category, annotation, compile_context, user_metadata, stack or a
        regex ``pattern`` over frames (``nbtoolkit.memory.breakdown.memory_by``)."""
        from nbtoolkit.memory.breakdown import group_memory

        device = _default_device(self) if device is None else device
        return group_memory(self.timeline(device), by, pattern=pattern, snapshot=self, device=device)

    def mosaic_peak(self, device: int | None = None) -> pd.DataFrame:
        """Bytes per Mosaic category at Mosaic's peak (``analysis.memory_breakdown.mosaic_peak``)."""
        from nbtoolkit.memory.breakdown import mosaic_peak

        return mosaic_peak(self, device=device)

    def diff(self, other: Any, *, labels: tuple[str, str] = ("a", "b")) -> Any:
        """What grew from this snapshot to ``other`` (a MemoryDiff; ``nbt.memory_diff``)."""
        from nbtoolkit.memory.diff import memory_diff

        return memory_diff(self, other, labels=labels)

    def devices(self) -> list[int]:
        """Devices with segments or trace entries, sorted."""
        found = set(self.segments["device"].tolist()) | set(self.trace["device"].tolist())
        return sorted(found)

    # -- as a timeline -----------------------------------------------------------------
    def timeline(self, device: int | None = None) -> MemoryTimeline:
        """The allocation history of one device as a :class:`MemoryTimeline`.

        ``device`` defaults to the device with the most trace entries (else the most segments).
        See :func:`nbtoolkit.memory.snapshot_timeline.snapshot_events` for how phases
        and categories are inferred (allocator snapshots record no categories).
        """
        from nbtoolkit.memory.timeline import MemoryTimeline

        if device is None:
            device = _default_device(self)
        events, notes = snapshot_events(self, device)
        return MemoryTimeline(
            events=events,
            stacks=list(self.stacks),
            device=f"cuda:{device}",
            source=self.source,
            notes=notes,
            category_method="heuristic (allocator stacks and annotations)",
            reserved=self.reserved_series(device),
        )

    def figure(self, **options: Any) -> Any:
        """The allocator's segments: allocated vs free (rounding / cached) per segment (plotly)."""
        from nbtoolkit.memory.figures import segment_figure

        return segment_figure(self, **options)

    def _report_figures(self) -> list[Any]:
        figures = [self.figure()]
        if len(self.trace):
            figures.append(self.timeline().figure())
        return figures

    # -- display -----------------------------------------------------------------------
    def _text(self) -> str:
        stats = self.stats()
        head = (
            f"MemorySnapshot {self.source or '(in memory)'}: {len(self.segments):,} segments, "
            f"{len(self.blocks):,} blocks, {len(self.trace):,} trace entries on devices {self.devices()}"
        )
        lines = [head, *("  " + line for line in stats.lines())]
        lines += [f"  note: {note}" for note in self.notes]
        lines.append(f"  fragmentation of free memory: {100 * self.fragmentation():.1f}%")
        if len(self.ooms):
            lines.append(f"  out-of-memory events recorded: {len(self.ooms)}")
        if len(self.trace) == 0:
            lines.append(
                "  no allocation history (record it with torch.cuda.memory._record_memory_history())"
            )
        return "\n".join(lines)

    def _html(self) -> str:
        import pandas as pd

        stats = self.stats()
        summary = pd.DataFrame(
            {
                "reserved": [format_bytes(stats.total_reserved)],
                "allocated": [format_bytes(stats.total_allocated)],
                "free (cached)": [format_bytes(stats.free_external)],
                "free (rounding)": [format_bytes(stats.free_internal)],
                "fragmentation": [f"{100 * self.fragmentation():.1f}%"],
                "segments": [len(self.segments)],
                "trace entries": [len(self.trace)],
                "OOM events": [len(self.ooms)],
            }
        )
        notes = "".join(f"<p><i>{escape(note)}</i></p>" for note in self.notes)
        return (
            f"<div class='nbt-snapshot'><b>MemorySnapshot</b> {escape(self.source)}"
            f"{html_table(summary)}{notes}</div>"
        )


def _default_device(snapshot: MemorySnapshot) -> int:
    """The device with the most trace entries, else the one with the most segments, else 0."""
    counts = snapshot.trace["device"].value_counts()
    if len(counts):
        return int(counts.idxmax())
    if len(snapshot.segments):
        return int(snapshot.segments["device"].value_counts().idxmax())
    return 0
