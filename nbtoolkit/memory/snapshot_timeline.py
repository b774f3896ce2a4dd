"""A snapshot's allocation history as :class:`~nbtoolkit.memory.timeline.MemoryTimeline` events.

An allocator snapshot (:class:`nbtoolkit.memory.snapshot.MemorySnapshot`) records addresses,
sizes and stacks, not what a tensor was for. :func:`snapshot_events` replays one device's
trace into the timeline's events (one row per allocation and per free) and infers each
allocation's phase and category from its stack and the optimizer annotations;
``MemorySnapshot.timeline`` wraps the result in a ``MemoryTimeline``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from nbtoolkit.core.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["infer_categories", "snapshot_events"]


class MemorySnapshot(Protocol):
    """What the replay reads of a :class:`nbtoolkit.memory.snapshot.MemorySnapshot` (whose
    ``timeline()`` imports this module, so the fields are named here instead of importing it back)."""

    blocks: pd.DataFrame
    trace: pd.DataFrame
    annotations: pd.DataFrame
    stack_hints: list[str]
    stack_sources: list[str]


def snapshot_events(snapshot: MemorySnapshot, device: int) -> tuple[pd.DataFrame, list[str]]:
    """Memory events of one device from a snapshot's trace plus its live blocks.

    Algorithm:

    1. Walk the device's trace in order. ``alloc`` opens an allocation (+size);
       ``free_completed`` closes it (-size). A ``free_completed`` of an address that was
       never allocated in the trace was allocated before recording started: it gets a
       ``preexisting`` row at time 0. ``free_requested`` (the free is only queued),
       ``segment_*`` (reserved, not allocated, memory) and ``oom`` do not change
       allocated bytes.
    2. Blocks still ``active_allocated`` in the segments whose address was not opened
       by the trace also existed before recording: ``preexisting`` rows at time 0.
    3. Phase per allocation: ``optimizer`` if inside an ``Optimizer.*`` annotation range
       or its stack runs in ``torch/optim``; ``backward`` if its stack runs in the autograd
       engine; ``forward`` if it runs inside ``nn.Module.__call__``; else ``other``.
    4. Category per allocation, from its phase and whether it outlives the run of
       consecutive events of that phase: optimizer -> optimizer_state (outlives) or
       temporary; backward -> gradient or autograd_detail; forward -> activation or
       temporary; stacks under ``nn.Module._apply``/``to``/``Parameter`` -> parameter;
       pre-existing blocks whose stack shows parameter creation -> parameter, optimizer
       code -> optimizer_state; everything else -> unknown.
    """
    import numpy as np
    import pandas as pd

    trace = snapshot.trace[snapshot.trace["device"] == device]
    notes: list[str] = []
    has_time = bool(len(trace)) and not trace["time_us"].isna().any()
    if len(trace) and not has_time:
        notes.append("this snapshot records no time_us: the time axis is the trace entry index")
    times_raw = (
        trace["time_us"].to_numpy(dtype="float64") if has_time else np.arange(len(trace), dtype="float64")
    )
    start = float(times_raw.min()) if len(times_raw) else 0.0

    # Optimizer ranges from annotations (START/END pairs by name).
    optimizer_ranges: list[tuple[float, float]] = []
    open_at: dict[str, float] = {}
    ann = snapshot.annotations
    for row in ann[ann["device"] == device].itertuples():
        if not str(row.name).startswith("Optimizer."):
            continue
        if row.stage == "START":
            open_at[str(row.name)] = float(row.time_us)
        elif row.stage == "END" and str(row.name) in open_at:
            optimizer_ranges.append((open_at.pop(str(row.name)), float(row.time_us)))

    hints = snapshot.stack_hints
    sources: dict[int, str] = {}

    rows: list[
        tuple[float, str, int, int, str, int, str]
    ] = []  # time, action, delta, tensor, phase, stack, src
    pre_rows: list[tuple[float, str, int, int, str, int, str]] = []
    live: dict[int, tuple[int, int]] = {}  # addr -> (tensor id, size)
    next_id = 0
    actions = trace["action"].to_numpy()
    addrs = trace["addr"].to_numpy()
    sizes = trace["size"].to_numpy()
    stack_ids = trace["stack_id"].to_numpy()
    ooms = 0
    for i in range(len(trace)):
        action = actions[i]
        t = float(times_raw[i]) - start
        if action == "alloc":
            sid = int(stack_ids[i])
            phase = hints[sid] if sid >= 0 and hints[sid] in ("forward", "backward", "optimizer") else "other"
            if has_time and any(a <= times_raw[i] <= b for a, b in optimizer_ranges):
                phase = "optimizer"
            if sid not in sources:
                sources[sid] = snapshot.stack_sources[sid] if sid >= 0 else ""
            live[int(addrs[i])] = (next_id, int(sizes[i]))
            rows.append((t, "alloc", int(sizes[i]), next_id, phase, sid, sources[sid]))
            next_id += 1
        elif action in ("free_completed", "free"):  # "free": snapshots of torch < 2.1
            addr = int(addrs[i])
            if addr in live:
                tensor, size = live.pop(addr)
            else:
                tensor, size = next_id, int(sizes[i])
                next_id += 1
                pre_rows.append((0.0, "preexisting", size, tensor, "before", -1, ""))
            rows.append((t, "free", -size, tensor, "", int(stack_ids[i]), ""))
        elif action == "oom":
            ooms += 1
    if ooms:
        notes.append(f"{ooms} out-of-memory event(s) in the trace: see MemorySnapshot.ooms")
    opened = {addr for addr, _ in live.items()}
    blocks = snapshot.blocks
    still = blocks[(blocks["device"] == device) & (blocks["state"] == "active_allocated")]
    for block in still.itertuples():
        if int(block.address) in opened:
            continue
        sid = int(block.stack_id)
        # requested_size: the trace records the bytes asked for, not the rounded block size.
        pre_rows.append(
            (
                0.0,
                "preexisting",
                int(block.requested_size),
                next_id,
                "before",
                sid,
                snapshot.stack_sources[sid] if sid >= 0 else "",
            )
        )
        next_id += 1
    if pre_rows:
        notes.append(
            f"{len(pre_rows):,} allocations existed before recording started "
            f"({format_bytes(sum(r[2] for r in pre_rows))}): shown as 'preexisting' at time 0"
        )
    frame = pd.DataFrame(
        pre_rows + rows, columns=["time_us", "action", "delta_bytes", "tensor", "phase", "stack_id", "source"]
    )
    frame["category"] = infer_categories(frame, hints)
    # A free inherits the phase of the moment it happens: the phase of the previous alloc.
    phase = frame["phase"].replace("", np.nan).ffill().fillna("other")
    frame["phase"] = phase.to_numpy()
    return frame, notes


def infer_categories(frame: pd.DataFrame, hints: list[str]) -> Any:
    """Step 4 of :func:`snapshot_events`: category per row (frees copy their allocation's)."""
    import numpy as np

    n = len(frame)
    categories = np.full(n, "unknown", dtype=object)
    if n == 0:
        return categories
    phases = frame["phase"].to_numpy(dtype=object)
    actions = frame["action"].to_numpy(dtype=object)
    tensors = frame["tensor"].to_numpy()
    stack_ids = frame["stack_id"].to_numpy()
    # Runs of the same phase over alloc rows; a free belongs to the run that is open.
    run_id = np.zeros(n, dtype="int64")
    current = -1
    last_phase = None
    for i in range(n):
        if actions[i] == "alloc" and phases[i] != last_phase:
            current += 1
            last_phase = phases[i]
        run_id[i] = max(current, 0)
    free_run: dict[int, int] = {}
    for i in range(n):
        if actions[i] == "free":
            free_run[int(tensors[i])] = int(run_id[i])
    survives_to = {
        "optimizer": ("optimizer_state", "temporary"),
        "backward": ("gradient", "autograd_detail"),
        "forward": ("activation", "temporary"),
    }
    by_tensor: dict[int, str] = {}
    for i in range(n):
        if actions[i] not in ("alloc", "preexisting"):
            continue
        tensor = int(tensors[i])
        phase = phases[i]
        sid = int(stack_ids[i])
        if actions[i] == "preexisting":
            # Only its stack (if the block kept one) tells what it was.
            hint = hints[sid] if sid >= 0 else ""
            category = {"parameter": "parameter", "optimizer": "optimizer_state"}.get(hint, "unknown")
        elif sid >= 0 and hints[sid] == "parameter" and phase != "optimizer":
            category = "parameter"
        elif phase in survives_to:
            outlives = free_run.get(tensor, run_id[i] + 1) > run_id[i]
            category = survives_to[phase][0 if outlives else 1]
        else:
            category = "unknown"
        by_tensor[tensor] = category
        categories[i] = category
    for i in range(n):
        if actions[i] == "free":
            categories[i] = by_tensor.get(int(tensors[i]), "unknown")
    return categories
