"""Are a snapshot's totals possible on the device it came from?

A snapshot states no device size, but three things bound it:

* **What the user knows**: ``capacity_bytes=`` (one number, or one per device).
* **What the snapshot states at an OOM**: a trace entry of action ``oom`` records
  ``device_free``, the bytes CUDA still reported free; the device then held at least the bytes
  reserved at that moment plus ``device_free`` (a lower bound on its size).
* **What exists**: no accelerator has more than :data:`LARGEST_DEVICE_BYTES` (288 GB, NVIDIA
  B300; AMD MI355X has the same), so more reserved on one device is impossible.

:func:`capacity_check` gives one row per device with the reserved and allocated bytes, the
capacity used and where it came from, and a ``problem`` (empty when the totals are possible):
reserved over the capacity, allocated over reserved, or two segments overlapping in address
(which a single allocator never produces: snapshots of several runs or processes merged into one
file do). :func:`impossible_notes` words the problems for the snapshot's notes at load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbtoolkit.core.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LARGEST_DEVICE_BYTES", "capacity_check", "impossible_notes"]

#: the most memory any accelerator has (288 GB of HBM3e on an NVIDIA B300 / AMD MI355X)
LARGEST_DEVICE_BYTES = 288 * 10**9


def _overlapping_segments(segments: pd.DataFrame) -> int:
    """Segments whose address range starts inside the previous one's (sorted by address)."""
    import numpy as np

    if len(segments) < 2:
        return 0
    ordered = segments.sort_values("address", kind="stable")
    starts = ordered["address"].to_numpy(dtype="int64")
    ends = starts + ordered["total_size"].to_numpy(dtype="int64")
    running_end = np.maximum.accumulate(ends)[:-1]
    return int((starts[1:] < running_end).sum())


def _oom_lower_bound(snapshot: Any, device: int) -> int | None:
    """reserved + device_free at the device's first OOM entry, if the trace has one."""
    trace = snapshot.trace
    ooms = trace[(trace["device"] == device) & (trace["action"] == "oom") & (trace["device_free"] >= 0)]
    if ooms.empty:
        return None
    reserved = snapshot.reserved_series(device)["reserved_bytes"].to_numpy()
    positions = trace[trace["device"] == device].reset_index(drop=True)
    first = positions.index[positions["action"] == "oom"][0]
    return int(reserved[min(first + 1, len(reserved) - 1)]) + int(ooms["device_free"].iloc[0])


def capacity_check(snapshot: Any, capacity_bytes: int | dict[int, int] | None = None) -> pd.DataFrame:
    """Per device: ``device, reserved_bytes, allocated_bytes, capacity_bytes, capacity_from, problem``."""
    import pandas as pd

    rows = []
    devices = sorted(set(snapshot.segments["device"].tolist()) | set(snapshot.trace["device"].tolist()))
    blocks = snapshot.blocks
    for device in devices:
        segs = snapshot.segments[snapshot.segments["device"] == device]
        reserved = int(segs["total_size"].sum())
        on = blocks[(blocks["device"] == device) & (blocks["state"] == "active_allocated")]
        allocated = int(on["requested_size"].sum())
        given = capacity_bytes.get(device) if isinstance(capacity_bytes, dict) else capacity_bytes
        if given is not None:
            capacity, origin = int(given), "given"
        else:
            capacity, origin = LARGEST_DEVICE_BYTES, "largest device made"
        at_least = _oom_lower_bound(snapshot, device) if len(snapshot.trace) else None
        problems = []
        if reserved > capacity:
            problems.append(
                f"reserves {format_bytes(reserved)}, more than the {format_bytes(capacity)} of the "
                f"{'device given' if origin == 'given' else 'largest device made'}"
            )
        if allocated > reserved:
            problems.append(
                f"allocates {format_bytes(allocated)}, more than it reserves ({format_bytes(reserved)})"
            )
        overlaps = _overlapping_segments(segs)
        if overlaps:
            problems.append(f"{overlaps} segment(s) overlap another's addresses (merged from several runs?)")
        rows.append(
            {
                "device": int(device),
                "reserved_bytes": reserved,
                "allocated_bytes": allocated,
                "capacity_bytes": capacity,
                "capacity_from": origin,
                "oom_says_at_least_bytes": at_least if at_least is not None else -1,
                "problem": "; ".join(problems),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "device",
            "reserved_bytes",
            "allocated_bytes",
            "capacity_bytes",
            "capacity_from",
            "oom_says_at_least_bytes",
            "problem",
        ],
    )


def impossible_notes(snapshot: Any, capacity_bytes: int | dict[int, int] | None = None) -> list[str]:
    """One note naming the devices whose totals are impossible (empty when all are possible)."""
    table = capacity_check(snapshot, capacity_bytes)
    bad = table[table["problem"] != ""]
    if bad.empty:
        return []
    first = bad.iloc[0]
    others = f" (and devices {bad['device'].tolist()[1:]})" if len(bad) > 1 else ""
    note = (
        f"impossible totals: device {first['device']} {first['problem']}{others}; this snapshot was not "
        "written by one process on one real device (scaled, merged or corrupt), so read its totals with "
        "care (details: snapshot.capacity_check())"
    )
    return [note]
