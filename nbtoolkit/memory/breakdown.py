"""Where the memory at the peak comes from: its stack, and memory grouped by what made it.

Pure functions over :class:`~nbtoolkit.memory.timeline.MemoryTimeline` and
:class:`~nbtoolkit.memory.snapshot.MemorySnapshot` (a snapshot is read through its
``timeline(device)``). Definitions:

* **bytes at the peak** of a group: the bytes of its allocations live at the timeline's peak
  event (:func:`nbtoolkit.memory.timeline_analysis.alive_at_peak`); **allocated**: the bytes of all its
  allocations over the run (pre-existing ones included).
* **by annotation**: an allocation belongs to the innermost ``external_annotations`` range
  (START/END pair of one name, e.g. ``Optimizer.step#AdamW.step`` or a ``record_function``
  recorded into the snapshot) open on its device when it was made; else ``(none)``.
* **by compile_context / user_metadata**: the trace entry's own field (torch records the
  compiled frame's context and ``torch._C._cuda_setMemoryMetadata`` text there).
* **by pattern**: the first frame of the allocating stack (innermost first) matching the regex
  groups the allocation (the frame's text, or the regex's first group when it has one).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Protocol

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.memory.reports import PeakStack

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "GROUPINGS",
    "as_timeline",
    "group_memory",
    "is_snapshot",
    "memory_by",
    "mosaic_peak",
    "peak_stack",
    "stack_bytes_at_peak",
    "timeline_peak_stack",
]


# What these functions read of nbtoolkit.memory.timeline.MemoryTimeline and
# nbtoolkit.memory.snapshot.MemorySnapshot. Named here rather than imported: those classes'
# methods import this module, and importing them back (even for annotations) would close an
# import cycle. The objects are told apart by what they hold (is_snapshot / _is_timeline).
class MemoryTimeline(Protocol):
    events: pd.DataFrame
    stacks: list[str]
    device: str

    @property
    def peak_bytes(self) -> int: ...

    @property
    def peak_time(self) -> float: ...


class MemorySnapshot(Protocol):
    annotations: pd.DataFrame
    trace: pd.DataFrame
    stacks: list[str]
    stack_mosaic: list[str]

    def timeline(self, device: int | None = None) -> MemoryTimeline: ...


def is_snapshot(data: Any) -> bool:
    """Whether ``data`` is a MemorySnapshot (an allocator snapshot: segments, a per-device history)."""
    timeline = getattr(data, "timeline", None)
    return hasattr(data, "segments") and hasattr(data, "stack_mosaic") and callable(timeline)


def _is_timeline(data: Any) -> bool:
    import pandas as pd

    return isinstance(getattr(data, "events", None), pd.DataFrame) and hasattr(data, "stacks")

GROUPINGS = (
    "category",
    "module",
    "phase",
    "annotation",
    "compile_context",
    "user_metadata",
    "stack",
    "pattern",
    "mosaic",
)
NONE = "(none)"


def as_timeline(data: Any, device: int | None = None) -> MemoryTimeline:
    """A timeline from a MemoryTimeline (as it is) or a MemorySnapshot (its ``timeline(device)``)."""
    if is_snapshot(data):
        timeline: MemoryTimeline = data.timeline(device)
        return timeline
    if _is_timeline(data):
        return data
    raise NbtUsageError(
        f"expected a MemoryTimeline or a MemorySnapshot (nbt.load_memory_snapshot), got {type(data).__name__}"
    )


def stack_bytes_at_peak(timeline: MemoryTimeline) -> pd.DataFrame:
    """Bytes live at the peak per allocating stack: ``stack, bytes, allocations`` largest first."""
    import pandas as pd

    from nbtoolkit.memory.timeline_analysis import alive_at_peak

    alive = alive_at_peak(timeline.events, top=None)
    stacks = timeline.stacks
    alive["stack"] = [
        stacks[int(i)] if 0 <= int(i) < len(stacks) else (str(s) or "(no stack recorded)")
        for i, s in zip(alive["stack_id"], alive["source"], strict=True)
    ]
    if alive.empty:
        return pd.DataFrame({"stack": [], "bytes": [], "allocations": []})
    grouped = alive.groupby("stack", sort=False)["bytes"].agg(["sum", "count"]).reset_index()
    grouped.columns = ["stack", "bytes", "allocations"]
    return grouped.sort_values(["bytes", "stack"], ascending=[False, True]).reset_index(drop=True)


def peak_stack(data: Any, *, device: int | None = None) -> PeakStack:
    """The peak, what is alive at it, and the full stack of its largest allocation that has one.

    ``data``: a MemoryTimeline or a MemorySnapshot (``device``: which of its devices).
    """
    return timeline_peak_stack(as_timeline(data, device))


def timeline_peak_stack(timeline: MemoryTimeline) -> PeakStack:
    """:func:`peak_stack` of one timeline (what ``MemoryTimeline.peak_stack()`` returns)."""
    from nbtoolkit.memory.timeline_analysis import alive_at_peak

    alive = alive_at_peak(timeline.events, top=None)
    stacks = timeline.stacks
    alive["stack"] = [stacks[int(i)] if 0 <= int(i) < len(stacks) else "" for i in alive["stack_id"]]
    by_stack = stack_bytes_at_peak(timeline)
    # The largest live allocation that kept its stack (memory from before recording has none).
    with_stack = alive[alive["stack"] != ""]
    top = str(with_stack["stack"].iloc[0]) if len(with_stack) else ""
    return PeakStack(
        peak_bytes=timeline.peak_bytes,
        peak_time_us=timeline.peak_time,
        alive=alive,
        by_stack=by_stack,
        stack=top,
        device=timeline.device,
    )


def _annotation_at(snapshot: MemorySnapshot, device: int, times_us: Any, origin: float) -> list[str]:
    """Per time (timeline clock), the innermost annotation range open then, else NONE."""
    ann = snapshot.annotations
    ann = ann[ann["device"] == device].sort_values("time_us", kind="stable")
    ranges: list[tuple[float, float, str]] = []
    open_at: dict[str, list[float]] = {}
    for row in ann.itertuples():
        name = str(row.name)
        if row.stage == "START":
            open_at.setdefault(name, []).append(float(row.time_us) - origin)
        elif row.stage == "END" and open_at.get(name):
            ranges.append((open_at[name].pop(), float(row.time_us) - origin, name))
    out = []
    for t in times_us:
        inside = [(b - a, name) for a, b, name in ranges if a <= t <= b]
        out.append(min(inside)[1] if inside else NONE)  # innermost: the shortest range
    return out


def memory_by(
    data: Any,
    by: str = "category",
    *,
    pattern: str | None = None,
    device: int | None = None,
) -> pd.DataFrame:
    """Memory grouped by ``by`` (one of :data:`GROUPINGS`): ``group, allocations, allocated_bytes,
    at_peak_bytes``, sorted by bytes at the peak. ``by="pattern"`` takes ``pattern`` (a regex over
    stack frames); ``annotation``, ``compile_context`` and ``user_metadata`` need a snapshot.
    """
    _check_grouping(by, pattern, snapshot=is_snapshot(data))
    if is_snapshot(data):  # its method picks the default device, then calls group_memory
        frame: pd.DataFrame = data.memory_by(by, pattern=pattern, device=device)
        return frame
    return group_memory(as_timeline(data, device), by, pattern=pattern)


def _check_grouping(by: str, pattern: str | None, *, snapshot: bool) -> None:
    if by not in GROUPINGS:
        raise NbtUsageError(f"memory_by(by={by!r}): use one of {list(GROUPINGS)}")
    if by == "pattern" and not pattern:
        raise NbtUsageError("memory_by(by='pattern') needs pattern=, a regex matched against stack frames")
    if by in ("annotation", "compile_context", "user_metadata", "mosaic") and not snapshot:
        raise NbtUsageError(f"memory_by(by={by!r}) needs a MemorySnapshot (allocator snapshots record it)")


def group_memory(
    timeline: MemoryTimeline,
    by: str = "category",
    *,
    pattern: str | None = None,
    snapshot: MemorySnapshot | None = None,
    device: int | None = None,
) -> pd.DataFrame:
    """:func:`memory_by` of one timeline; ``snapshot``: the snapshot it is ``device``'s timeline of."""
    import numpy as np
    import pandas as pd

    from nbtoolkit.memory.timeline_analysis import alive_at_peak

    _check_grouping(by, pattern, snapshot=snapshot is not None)
    events = timeline.events
    made = events["action"].isin(["alloc", "preexisting"]).to_numpy()
    labels = np.full(len(events), NONE, dtype=object)
    if by in ("category", "module", "phase"):
        labels = events[by].astype(str).replace("", NONE).to_numpy(dtype=object)
    elif by == "mosaic" and snapshot is not None:
        labels = _mosaic_labels(snapshot, events)
    elif by in ("stack", "pattern"):
        regex = re.compile(pattern) if pattern else None
        per_stack = [_stack_label(text, regex) for text in timeline.stacks]
        ids = events["stack_id"].to_numpy()
        labels = np.array([per_stack[i] if 0 <= i < len(per_stack) else NONE for i in ids], dtype=object)
    elif snapshot is not None and device is not None:
        trace = snapshot.trace[snapshot.trace["device"] == device]
        origin = float(trace["time_us"].min()) if len(trace) and trace["time_us"].notna().all() else 0.0
        alloc_rows = np.flatnonzero((events["action"] == "alloc").to_numpy())
        if by == "annotation":
            times = events["time_us"].to_numpy()[alloc_rows]
            labels[alloc_rows] = _annotation_at(snapshot, device, times, origin) if origin else NONE
        else:
            values = trace.loc[trace["action"] == "alloc", by].astype(str).to_numpy(dtype=object)
            values = np.where((values == "") | (values == "N/A") | (values == "None"), NONE, values)
            labels[alloc_rows] = values[: len(alloc_rows)]
    # A free and a later row of an allocation belong to the group of the row that made it.
    tensor_label = dict(zip(events["tensor"].to_numpy()[made].tolist(), labels[made].tolist(), strict=True))
    frame = pd.DataFrame({"group": labels[made], "bytes": events["delta_bytes"].to_numpy()[made]})
    allocated = frame.groupby("group", sort=False)["bytes"].agg(["count", "sum"])
    allocated.columns = ["allocations", "allocated_bytes"]
    alive = alive_at_peak(events, top=None)
    alive["group"] = [tensor_label.get(int(t), NONE) for t in alive["tensor"]]
    at_peak = alive.groupby("group", sort=False)["bytes"].sum().rename("at_peak_bytes")
    out = allocated.join(at_peak, how="outer").fillna(0).astype("int64").reset_index()
    out = out.rename(columns={"index": "group"})
    out = out.sort_values(["at_peak_bytes", "allocated_bytes"], ascending=False, kind="stable")
    return pd.DataFrame(out).reset_index(drop=True)


def _mosaic_labels(snapshot: MemorySnapshot, events: pd.DataFrame) -> Any:
    """Mosaic's category per event, from its stack (memory without a stack: unknown)."""
    import numpy as np

    per_stack = snapshot.stack_mosaic or ["unknown"] * len(snapshot.stacks)
    ids = events["stack_id"].to_numpy()
    return np.array([per_stack[i] if 0 <= i < len(per_stack) else "unknown" for i in ids], dtype=object)


def mosaic_peak(snapshot: MemorySnapshot, *, device: int | None = None) -> pd.DataFrame:
    """Bytes per Mosaic category at the peak as Mosaic defines it: ``category, at_peak_bytes``.

    Mosaic replays the trace from zero (memory that existed before recording is not counted;
    its frees lower the sum) and takes the highest running sum; each allocation made in the
    trace and live then counts in the category of its stack
    (:mod:`nbtoolkit.memory.snapshot_mosaic`). The last row, ``total``, is that peak.
    """
    import pandas as pd

    from nbtoolkit.memory.timeline_analysis import alive_at_peak, peak

    timeline = snapshot.timeline(device)
    events = timeline.events[timeline.events["action"] != "preexisting"].reset_index(drop=True)
    index, total = peak(events)
    alive = alive_at_peak(events, top=None, at_index=index) if index >= 0 else alive_at_peak(events.iloc[:0])
    alive["category"] = _mosaic_labels(snapshot, alive.assign(stack_id=alive["stack_id"].astype("int64")))
    grouped = alive.groupby("category", sort=False)["bytes"].sum()
    rows = [(c, int(grouped.get(c, 0))) for c in dict.fromkeys(snapshot.stack_mosaic) if grouped.get(c, 0)]
    rows += [(c, int(v)) for c, v in grouped.items() if c not in dict(rows)]
    rows.sort(key=lambda r: -r[1])
    rows.append(("total", int(total)))
    return pd.DataFrame(rows, columns=["category", "at_peak_bytes"])


def _stack_label(text: str, regex: re.Pattern[str] | None) -> str:
    if regex is None:
        return text or NONE
    for line in text.splitlines():
        found = regex.search(line)
        if found:
            return found.group(1) if found.groups() and found.group(1) else line
    return "(no match)"
