"""Turn torch's memory profile into a :class:`~nbtoolkit.memory.timeline.MemoryTimeline` (steps 2-4 of
``nbtoolkit.memory.capture``).

The tensor events and their categories come from the one walker of torch's memory
profiler (:func:`nbtoolkit.memory.profile.tensor_events`). Each event is joined
here with the profiler's op tree for what torch's timeline lacks: the phase, the module,
the shape and the Python stack; tensors of the model and optimizer the run never touched
are added as a baseline at time 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from nbtoolkit.memory.profile import TensorTimeline
    from nbtoolkit.memory.timeline import MemoryTimeline

__all__ = ["build_timeline", "local_shard"]

_TORCH_CATEGORY_NAMES = {
    "INPUT": "input",
    "TEMPORARY": "temporary",
    "ACTIVATION": "activation",
    "GRADIENT": "gradient",
    "AUTOGRAD_DETAIL": "autograd_detail",
    "PARAMETER": "parameter",
    "OPTIMIZER_STATE": "optimizer_state",
}


def _ancestors(event: Any) -> list[Any]:
    chain = []
    parent = event.parent
    while parent is not None:
        chain.append(parent)
        parent = parent.parent
    return chain


# Frames of the kernel that runs a notebook cell (IPython, ipykernel, tornado, asyncio's loop):
# the same dozens of frames outside every cell's code, so a stack keeps the frames from the cell
# inwards. Profiler frame names are relative to site-packages or the standard library.
_KERNEL_FRAME_PREFIXES = (
    "IPython/",
    "ipykernel/",
    "ipykernel_launcher.py",
    "tornado/",
    "asyncio/",
    "traitlets/",
    "jupyter_client/",
    "zmq/",
    "runpy.py",
    "selectors.py",
)


def _is_user_frame(name: str) -> bool:
    return not (
        name.startswith(("torch/", "nn.Module:", "<built-in", "<frozen", "threading.py", "contextlib.py"))
        or "site-packages" in name
        or "/torch/" in name
        or "nbtoolkit/" in name
    )


class _EventInfo:
    """Phase, module, stack and source of one allocation event, read from its ancestors."""

    __slots__ = ("module", "phase", "seq", "source", "stack")

    def __init__(self, phase: str, module: str, seq: int, stack: str, source: str) -> None:
        self.phase = phase
        self.module = module
        self.seq = seq
        self.stack = stack
        self.source = source


def _describe(event: Any, module_names: dict[int, str], event_type: Any) -> _EventInfo:
    phase = ""
    module = ""
    seq = -1
    frames: list[str] = []
    source = ""
    for parent in _ancestors(event):
        kind = parent.typed[0]
        name = parent.name
        if kind == event_type.TorchOp:
            if name.startswith("autograd::engine::evaluate_function") and not phase:
                phase = "backward"
                seq = int(parent.typed[1].sequence_number)
            elif seq < 0 and int(getattr(parent.typed[1], "sequence_number", -1)) >= 0:
                seq = int(parent.typed[1].sequence_number)
        elif kind == event_type.PyCall:
            info = parent.typed[1].module
            if info is not None:
                if not module:
                    module = module_names.get(int(info.self_ptr), f"{info.cls_name}")
                continue
            if name.startswith(("torch/profiler/", "torch/autograd/profiler")) or "nbtoolkit/" in name:
                continue
            if name.startswith(_KERNEL_FRAME_PREFIXES):
                continue
            if name.startswith("torch/optim/") and not phase:
                phase = "optimizer"
            frames.append(name)
            if not source and _is_user_frame(name):
                source = name
    if not phase:
        phase = "forward" if module else "other"
    return _EventInfo(phase, module, seq, "\n".join(frames[:40]), source)


def _tensor_shapes(op_tree: Any, event_type: Any) -> dict[tuple[int, int], str]:
    """(tensor id, allocation id) -> "[d0, d1] dtype" from every op input that uses the storage."""
    shapes: dict[tuple[int, int], str] = {}

    def visit(meta: Any) -> None:
        if isinstance(meta, list):
            for item in meta:
                visit(item)
            return
        identity = getattr(meta, "id", None)
        allocation = getattr(meta, "allocation_id", None)
        if identity is None or allocation is None:
            return
        key = (int(identity), int(allocation))
        if key not in shapes:
            dtype = str(meta.dtype).removeprefix("torch.")
            shapes[key] = f"[{', '.join(str(s) for s in meta.sizes)}] {dtype}"

    for event in op_tree.sorted_nodes:
        if event.typed[0] == event_type.TorchOp:
            for meta in event.typed[1].inputs:
                visit(meta)
    return shapes


class _OpTreeIndex:
    """The profiler's op tree, indexed for joining tensor events with what torch's timeline lacks."""

    def __init__(self, op_tree: Any, module_names: dict[int, str]) -> None:
        from torch._C._profiler import _EventType

        self._event_type = _EventType
        self._module_names = module_names
        nodes = op_tree.sorted_nodes
        # Allocation events by time, to join torch's timeline rows with the op tree.
        self._allocations: dict[int, list[Any]] = {}
        for event in nodes:
            if event.typed[0] == _EventType.Allocation:
                self._allocations.setdefault(int(event.start_time_ns), []).append(event)
        self.shapes = _tensor_shapes(op_tree, _EventType)
        # torch's optimizers wrap step()/zero_grad() in record_function ranges; in the op tree
        # these are siblings of the Python frames, so they are matched by time, not ancestry.
        self._optimizer_ranges = [
            (int(e.start_time_ns), int(e.end_time_ns))
            for e in nodes
            if e.typed[0] == _EventType.TorchOp
            and e.name.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))
        ]
        # Backward allocations: module of the forward op with the same sequence number.
        self.forward_module_by_seq: dict[int, str] = {}
        for event in nodes:
            if event.typed[0] == _EventType.TorchOp:
                seq = int(getattr(event.typed[1], "sequence_number", -1))
                if seq < 0 or seq in self.forward_module_by_seq or event.name.startswith("autograd::"):
                    continue
                module = self._module_around(event)
                if module:
                    self.forward_module_by_seq[seq] = module
        self._infos: dict[int, _EventInfo] = {}

    def _module_around(self, event: Any) -> str:
        for parent in [event, *_ancestors(event)]:
            info = parent.typed[1].module if parent.typed[0] == self._event_type.PyCall else None
            if info is not None:
                return self._module_names.get(int(info.self_ptr), info.cls_name)
        return ""

    def find_allocation(self, t: int, size: int, is_alloc: bool) -> Any:
        """The allocator event at time ``t`` of this size and direction (else any of that direction)."""
        for event in self._allocations.get(t, ()):
            fields = event.typed[1]
            if (fields.alloc_size > 0) == is_alloc and abs(fields.alloc_size) == size:
                return event
        candidates = [e for e in self._allocations.get(t, ()) if (e.typed[1].alloc_size > 0) == is_alloc]
        return candidates[0] if candidates else None

    def info_of(self, event: Any) -> _EventInfo:
        key = id(event)
        if key not in self._infos:
            info = _describe(event, self._module_names, self._event_type)
            t = int(event.start_time_ns)
            if info.phase != "backward" and any(a <= t <= b for a, b in self._optimizer_ranges):
                info.phase = "optimizer"
            self._infos[key] = info
        return self._infos[key]


def build_timeline(
    recorded: TensorTimeline,
    target: torch.device,
    module_names: dict[int, str],
    *,
    model: Any,
    optimizer: Any,
    shards_before: dict[int, str] | None = None,
) -> MemoryTimeline:
    """The timeline of ``target``'s memory from torch's tensor events of one profile.

    ``shards_before``: :func:`nbtoolkit.memory.sharded.shard_storages` of the model and
    optimizer taken before the run; with it (or DTensor parameters after the run) an FSDP2
    model's tensors are recategorised (see :mod:`nbtoolkit.memory.sharded`).
    """
    import pandas as pd

    from nbtoolkit.memory.schema import EVENT_COLUMNS
    from nbtoolkit.memory.sharded import fsdp_regions, recategorize_sharded, shard_storages
    from nbtoolkit.memory.timeline import MemoryTimeline

    index = _OpTreeIndex(recorded.op_tree, module_names)
    stacks: list[str] = []
    stack_index: dict[str, int] = {}

    def intern(stack: str) -> int:
        if not stack:
            return -1
        if stack not in stack_index:
            stack_index[stack] = len(stacks)
            stacks.append(stack)
        return stack_index[stack]

    def category_name(torch_name: str | None) -> str:
        return _TORCH_CATEGORY_NAMES.get(torch_name, "unknown") if torch_name is not None else "unknown"

    owners = _storage_owners(model, optimizer)
    rows: list[tuple[Any, ...]] = []
    tensor_ids: dict[tuple[int, int], int] = {}
    unknown_live: dict[int, int] = {}  # ptr -> tensor id, for allocations torch could not key
    pointers: dict[int, int] = {}  # tensor id -> storage pointer (for FSDP2's shards)
    seen_storage_ptrs: set[int] = set()
    timed = [e.time_ns for e in recorded.events if e.time_ns >= 0]
    start_ns = min(timed) if timed else 0

    def tensor_id_for(identity: tuple[int, int] | None) -> int:
        if identity is None:
            return -1
        if identity not in tensor_ids:
            tensor_ids[identity] = len(tensor_ids)
        return tensor_ids[identity]

    next_unknown = 1 << 40
    for event in recorded.events:
        if event.device != target:
            continue
        time_us = 0.0 if event.time_ns < 0 else (event.time_ns - start_ns) / 1e3
        shape, owner = "", ""
        keyed = False
        if event.tensor is not None and event.storage_ptr is not None:
            keyed = True
            seen_storage_ptrs.add(event.storage_ptr)
            pointers[tensor_id_for(event.tensor)] = event.storage_ptr
            shape = index.shapes.get(event.tensor, "")
            owner = owners.get(event.storage_ptr, "")
        category = category_name(event.category)
        if event.action == "preexisting":
            tensor = tensor_id_for(event.tensor)
            rows.append((0.0, "preexisting", event.size, category, tensor, owner, "before", shape, "", -1))
            continue
        if event.action == "increment_version":
            tensor = tensor_id_for(event.tensor)
            new = category_name(event.new_category)
            if category != new:
                rows.append((time_us, "recategorize", -event.size, category, tensor, "", "", shape, "", -1))
                rows.append((time_us, "recategorize", event.size, new, tensor, "", "", shape, "", -1))
            continue
        is_alloc = event.action == "create"
        allocation = index.find_allocation(event.time_ns, event.size, is_alloc)
        info = index.info_of(allocation) if allocation is not None else _EventInfo("other", "", -1, "", "")
        if keyed:
            tensor = tensor_id_for(event.tensor)
        elif allocation is not None:
            ptr = int(allocation.typed[1].ptr)
            if is_alloc:
                tensor = unknown_live[ptr] = next_unknown
                pointers[tensor] = ptr
                next_unknown += 1
            else:
                tensor = unknown_live.pop(ptr, -1)
        else:
            tensor = -1
        module = info.module
        if info.phase == "backward" and info.seq >= 0:
            module = index.forward_module_by_seq.get(info.seq, module)
        if owner and (info.phase == "optimizer" or not module):
            module = owner  # a parameter's gradient or optimizer state belongs to its module
        rows.append(
            (
                time_us,
                "alloc" if is_alloc else "free",
                event.size if is_alloc else -event.size,
                category,
                tensor,
                module,
                info.phase,
                shape,
                info.source,
                intern(info.stack) if is_alloc else -1,
            )
        )

    baseline, baseline_note = _baseline_rows(
        model, optimizer, target=target, seen=seen_storage_ptrs, first_id=len(tensor_ids), owners=owners
    )
    frame = pd.DataFrame(baseline + rows, columns=list(EVENT_COLUMNS))
    shards_after = shard_storages(model, optimizer)
    if shards_before or shards_after:  # an FSDP2 model: its shards, and the unsharded memory apart
        frame = recategorize_sharded(
            frame, pointers=pointers, regions=fsdp_regions(recorded.op_tree, start_ns),
            before=shards_before or {}, after=shards_after,
        )
    # Frames of this kernel's cells read as a traceback names them ("Cell In[9], line 1: make"),
    # not as ipykernel's temporary files (only in a kernel; see capture.cell_names).
    frame["source"] = frame["source"].map(_cell_names(frame["source"]))
    stacks = list(map(_cell_names(stacks).__getitem__, stacks))
    # Recategorize rows and frees happen in whatever phase is current: carry the last one forward.
    phase = frame["phase"].replace("", pd.NA).ffill().fillna("other")
    frame["phase"] = phase.astype(str).to_numpy()
    notes = [baseline_note] if baseline_note else []
    if recorded.reused_keys:
        notes.append(
            f"{recorded.reused_keys} allocation(s) reused the address of a block whose free torch's "
            "profiler did not record (another thread freed it, e.g. gloo's): each is counted from the "
            "allocator's events, without torch's category, the old block ending just before it"
        )
    return MemoryTimeline(
        events=frame,
        stacks=stacks,
        device=str(target),
        source="torch.profiler memory profile",
        notes=notes,
        category_method="torch.profiler",
        reused_storages=recorded.reused_keys,
    )


def _cell_names(texts: Any) -> dict[str, str]:
    from nbtoolkit.core.cell_names import name_cells

    return {text: name_cells(text) for text in set(texts)}


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this process holds: a DTensor's local shard (FSDP2's sharded
    parameters, their gradients and the optimizer state made from them are DTensors, whose
    wrapper has no storage of its own), any other tensor itself."""
    local = getattr(tensor, "_local_tensor", None)
    return local if local is not None else tensor


def _storage_owners(model: Any, optimizer: Any) -> dict[int, str]:
    """Storage pointer -> path of the module owning it (its parameters, their grads and optimizer state).

    Pointers are read after the run: grads and optimizer state created during it are
    still alive then (unless freed, e.g. by ``zero_grad(set_to_none=True)``).
    """
    import torch

    owners: dict[int, str] = {}

    def pointer(tensor: torch.Tensor) -> int:
        return int(local_shard(tensor).untyped_storage().data_ptr())

    if model is None:
        return owners
    by_parameter: dict[int, str] = {}
    for name, parameter in model.named_parameters():
        module = name.rpartition(".")[0] or type(model).__name__
        by_parameter[id(parameter)] = module
        owners.setdefault(pointer(parameter), module)
        if parameter.grad is not None:
            owners.setdefault(pointer(parameter.grad), module)
    for name, buffer in model.named_buffers():
        owners.setdefault(pointer(buffer), name.rpartition(".")[0] or type(model).__name__)
    if optimizer is not None:
        for parameter, state in optimizer.state.items():
            module = by_parameter.get(id(parameter))
            if module is None:
                continue
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    owners.setdefault(pointer(value), module)
    owners.pop(0, None)
    return owners


def _baseline_rows(
    model: Any,
    optimizer: Any,
    *,
    target: torch.device,
    seen: set[int],
    first_id: int,
    owners: dict[int, str],
) -> tuple[list[tuple[Any, ...]], str]:
    """Pre-existing rows for model/optimizer tensors the profiled run never touched."""
    import torch

    candidates: list[tuple[torch.Tensor, str]] = []
    if model is not None:
        for parameter in model.parameters():
            candidates.append((parameter, "parameter"))
            if parameter.grad is not None:
                candidates.append((parameter.grad, "gradient"))
        # torch's categories have no "buffer"; running stats and the like count as parameters.
        candidates.extend((buffer, "parameter") for buffer in model.buffers())
    if optimizer is not None:
        for state in optimizer.state.values():
            candidates.extend((v, "optimizer_state") for v in state.values() if isinstance(v, torch.Tensor))
    rows: list[tuple[Any, ...]] = []
    counted: set[int] = set()
    for candidate, category in candidates:
        tensor = local_shard(candidate)
        if tensor.device != target:
            continue
        storage = tensor.untyped_storage()
        ptr = int(storage.data_ptr())
        if ptr == 0 or ptr in seen or ptr in counted:
            continue
        counted.add(ptr)
        shape = f"[{', '.join(str(s) for s in tensor.shape)}] {str(tensor.dtype).removeprefix('torch.')}"
        rows.append(
            (
                0.0,
                "preexisting",
                int(storage.nbytes()),
                category,
                first_id + len(rows),
                owners.get(ptr, ""),
                "before",
                shape,
                "",
                -1,
            )
        )
    note = ""
    if rows:
        from nbtoolkit.core.units import format_bytes

        total = sum(r[2] for r in rows)
        note = (
            f"{len(rows)} model/optimizer tensors ({format_bytes(total)}) existed before recording and were "
            "not touched by the run: added as 'preexisting' at time 0"
        )
    return rows, note
