"""Write a `MemoryTimeline` as a CUDA caching-allocator snapshot, in torch's own format.

``export_memory_snapshot(timeline, "step.pickle")`` writes what
``torch.cuda.memory._dump_snapshot()`` writes: a pickled dict with ``segments`` (the
state at the end) and ``device_traces`` (the history), so a timeline recorded on a CPU
opens in torch's memory_viz (https://pytorch.org/memory_viz), in
``python -m torch.cuda._memory_viz``, and in :func:`nbtoolkit.load_memory_snapshot`.
nbtoolkit's tests use it to exercise the snapshot reader on data the project records
itself, without any GPU.

What is written, and how it maps a timeline onto an allocator:

* Each allocation becomes a block of its size rounded up to 512 bytes (the caching
  allocator's smallest block); ``requested_size`` keeps the exact bytes.
* The allocator modelled is one without caching (as with
  ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``): every block has a segment of its own, reserved by
  a ``segment_alloc`` just before its ``alloc`` and released by a ``segment_free`` just
  after its ``free_completed``. Addresses are never reused, so every trace entry names
  one allocation.
* Memory that existed before recording (``preexisting`` rows) gets no ``alloc`` entry,
  exactly as in a real snapshot: if it is still alive at the end it is an
  ``active_allocated`` block of the segments, and if it is freed during the run its
  ``free_completed`` names an address the trace never allocated.
* ``recategorize`` rows (torch's INCREMENT_VERSION) move bytes between categories
  without allocating: they have no allocator event and are left out. Allocator snapshots
  carry no categories; readers infer them.
* Frames come from the timeline's stacks (the profiler's ``file.py(line): name`` lines,
  innermost first); the optimizer phase is written as ``Optimizer.step`` START/END
  ``external_annotations``, as torch's optimizer annotation does.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError, SnapshotError

if TYPE_CHECKING:
    from nbtoolkit.memory.timeline import MemoryTimeline

__all__ = ["allocator_snapshot", "export_memory_snapshot"]

BLOCK_ROUNDING = 512  # the caching allocator's kMinBlockSize
_SMALL_SEGMENT_LIMIT = 1 << 20  # blocks up to 1 MiB come from the small pool
_FIRST_ADDRESS = 0x7F0000000000  # where CUDA allocations typically live; any value works
# "torch/nn/modules/module.py(1775): _call_impl" (profiler PyCall) or "train.py:42 in step".
_PROFILER_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<name>.*)$")
_SOURCE_FRAME = re.compile(r"^(?P<file>.+?):(?P<line>\d+) in (?P<name>.*)$")


def _rounded(size: int) -> int:
    return max(BLOCK_ROUNDING, -(-size // BLOCK_ROUNDING) * BLOCK_ROUNDING)


def _frames(stack: str) -> list[dict[str, Any]]:
    frames = []
    for line in stack.splitlines():
        match = _PROFILER_FRAME.match(line) or _SOURCE_FRAME.match(line)
        if match:
            frames.append({"filename": match["file"], "line": int(match["line"]), "name": match["name"]})
        elif line.strip():
            frames.append({"filename": "??", "line": 0, "name": line.strip()})
    return frames


def _optimizer_annotation(device: int, stage: str, time_us: float) -> dict[str, Any]:
    """What torch's ``Optimizer.step`` profiling hook records in a snapshot's external annotations."""
    return {"device": device, "stage": stage, "name": "Optimizer.step", "time_us": time_us}


def allocator_snapshot(timeline: MemoryTimeline, *, device: int = 0) -> dict[str, Any]:
    """The timeline as the dict ``torch.cuda.memory._snapshot()`` returns (see the module docstring)."""
    from nbtoolkit.memory.timeline import MemoryTimeline

    if not isinstance(timeline, MemoryTimeline):
        raise NbtUsageError(
            "export_memory_snapshot needs a MemoryTimeline (from nbt.memory_timeline), "
            f"got {type(timeline).__name__}"
        )
    if not isinstance(device, int) or device < 0:
        raise NbtUsageError(f"device must be a CUDA device index >= 0, got {device!r}")
    frames_of: dict[int, list[dict[str, Any]]] = {}

    def frames(stack_id: int) -> list[dict[str, Any]]:
        if stack_id < 0 or stack_id >= len(timeline.stacks):
            return []
        if stack_id not in frames_of:
            frames_of[stack_id] = _frames(timeline.stacks[stack_id])
        return frames_of[stack_id]

    events = timeline.events
    trace: list[dict[str, Any]] = []
    # tensor -> (address, block size, requested bytes, stack id); alive at the current point.
    live: dict[int, tuple[int, int, int, int]] = {}
    next_address = _FIRST_ADDRESS
    optimizer_open: float | None = None
    annotations: list[dict[str, Any]] = []
    last_time = 0.0
    for time_us, action, delta, tensor_id, phase, stack_of_event in zip(
        events["time_us"].to_numpy(dtype="float64"),
        events["action"].astype(str).to_numpy(),
        events["delta_bytes"].to_numpy(dtype="int64"),
        events["tensor"].to_numpy(dtype="int64"),
        events["phase"].astype(str).to_numpy(),
        events["stack_id"].to_numpy(dtype="int64"),
        strict=True,
    ):
        t = float(time_us)
        last_time = t
        tensor = int(tensor_id)
        if action in ("alloc", "preexisting"):
            if phase == "optimizer" and optimizer_open is None:
                optimizer_open = t
                annotations.append(_optimizer_annotation(device, "START", t))
            elif phase not in ("optimizer", "") and optimizer_open is not None:
                annotations.append(_optimizer_annotation(device, "END", t))
                optimizer_open = None
            size = _rounded(int(delta))
            address = next_address
            next_address += size
            live[tensor] = (address, size, int(delta), int(stack_of_event))
            if action == "alloc":
                stack = frames(int(stack_of_event))
                common = {"addr": address, "size": size, "stream": 0, "time_us": t, "frames": stack}
                trace.append({"action": "segment_alloc", **common})
                trace.append({"action": "alloc", **common})
        elif action == "free" and tensor in live:
            address, size, _, allocating_stack = live.pop(tensor)
            stack = frames(allocating_stack)
            common = {"addr": address, "size": size, "stream": 0, "time_us": t, "frames": stack}
            trace.append({"action": "free_requested", **common})
            trace.append({"action": "free_completed", **common})
            trace.append({"action": "segment_free", **common})
        # recategorize rows move bytes between categories: no allocator event.
    if optimizer_open is not None:
        annotations.append(_optimizer_annotation(device, "END", last_time))

    segments = []
    for address, size, requested, stack_id in sorted(live.values()):
        segments.append(
            {
                "device": device,
                "address": address,
                "total_size": size,
                "allocated_size": size,
                "active_size": size,
                "requested_size": requested,
                "stream": 0,
                "segment_type": "small" if size <= _SMALL_SEGMENT_LIMIT else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": [
                    {
                        "address": address,
                        "size": size,
                        "requested_size": requested,
                        "state": "active_allocated",
                        "frames": frames(stack_id),
                    }
                ],
            }
        )
    device_traces: list[list[dict[str, Any]]] = [[] for _ in range(device)] + [trace]
    return {"segments": segments, "device_traces": device_traces, "external_annotations": annotations}


def export_memory_snapshot(timeline: MemoryTimeline, path: str | Path, *, device: int = 0) -> Path:
    """Write ``timeline`` as a pickled allocator snapshot (torch's ``_dump_snapshot`` format).

    The file opens in https://pytorch.org/memory_viz, ``python -m torch.cuda._memory_viz`` and
    ``nbt.load_memory_snapshot``. How allocations map onto allocator blocks and segments is in
    this module's docstring. Returns the path written.
    """
    target = Path(path)
    data = allocator_snapshot(timeline, device=device)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as handle:
            pickle.dump(data, handle, protocol=4)
    except OSError as exc:
        raise SnapshotError(f"cannot write the snapshot to {target}: {exc.strerror or exc}") from None
    return target
