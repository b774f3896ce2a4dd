"""``nbt.memory_timeline``: run code and see where its memory goes.

How the timeline is made (CPU, and CUDA when the model lives there):

1. ``fn`` runs ``steps`` times under ``torch.profiler.profile(profile_memory=True,
   record_shapes=True, with_stack=True)``, inside torch's ``ModTracker`` (which names
   every ``nn.Module`` that runs by its fully qualified path).
2. torch's memory profiler (``torch.profiler._memory_profiler.MemoryProfile``, the
   engine behind ``prof.export_memory_timeline``) turns the profile into allocation
   events with torch's categories: parameter, optimizer_state, input, temporary,
   activation, gradient, autograd_detail, or None (kept as ``unknown``). The event list
   and the categories are torch's own, so the totals per category equal what
   ``export_memory_timeline`` plots.
3. Each event is joined with the profiler's op tree for what torch's timeline lacks:
   the **phase** (``optimizer`` inside ``Optimizer.step#``/``Optimizer.zero_grad#``,
   ``backward`` inside ``autograd::engine::evaluate_function``, ``forward`` inside an
   ``nn.Module`` call, else ``other``), the **module** (the innermost ``nn.Module``
   around the allocating op; in backward, the module of the forward op with the same
   autograd sequence number), the **shape** (from the op inputs that use the storage)
   and the Python **stack**.
4. **Memory that existed before recording**: torch reports tensors the run touched as
   ``preexisting``. Parameters, gradients and optimizer state of ``model``/``optimizer``
   that the run did not touch (frozen weights, unused state) are added as a baseline at
   time 0 from their storages, so the timeline starts at the real resident size.
5. On CUDA the allocator history (``torch.cuda.memory._record_memory_history``) is
   recorded as well and kept in ``timeline.allocator_snapshot`` (a ``MemorySnapshot``).

**Failures**: if ``fn`` raises (an error, an out-of-memory, a KeyboardInterrupt), the
profiler and the allocator history are stopped, the timeline up to the failure is
built, attached to the exception as ``exc.timeline``, and the exception propagates
unchanged (with a note saying where the timeline is). Recording is always turned off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtoolkit.capture._native import native_stderr_silenced
from nbtoolkit.errors import CaptureError, NbtUsageError

if TYPE_CHECKING:
    import torch

    from nbtoolkit.model.memory import MemoryTimeline

__all__ = ["memory_timeline"]

#: The note memory_timeline adds to an exception raised by the captured function.
PARTIAL_TIMELINE_NOTE = "nbtoolkit: the memory timeline up to this failure is in exc.timeline"

_TORCH_CATEGORY_NAMES = {
    "INPUT": "input",
    "TEMPORARY": "temporary",
    "ACTIVATION": "activation",
    "GRADIENT": "gradient",
    "AUTOGRAD_DETAIL": "autograd_detail",
    "PARAMETER": "parameter",
    "OPTIMIZER_STATE": "optimizer_state",
}


def memory_timeline(
    fn: Callable[[], Any],
    steps: int = 1,
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    device: str | None = None,
) -> MemoryTimeline:
    """Run ``fn`` ``steps`` times and return its :class:`~nbtoolkit.model.memory.MemoryTimeline`.

    Args:
        fn: a zero-argument callable, e.g. one training step (forward, backward, optimizer).
        steps: how many times to call it while recording.
        model: the model, to name modules by their path in it (``layers.0.attn``) and to
            count its parameters/gradients/buffers that the run does not touch.
        optimizer: the optimizer, to count its state that the run does not touch.
        device: the device whose memory to show (``cpu``, ``cuda:0``); by default the
            model's device, else ``cpu``.

    The value ``fn`` returned last is in ``timeline.value``. See the module docstring for
    the method and for what happens when ``fn`` raises (``exc.timeline``).
    """
    if not callable(fn):
        raise NbtUsageError(f"memory_timeline() needs a zero-argument callable, got {type(fn).__name__}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise NbtUsageError(f"steps must be a positive integer, got {steps!r}")

    import torch
    from torch.distributed._tools.mod_tracker import ModTracker
    from torch.profiler import ProfilerActivity

    if torch.autograd.profiler._is_profiler_enabled:
        raise CaptureError(
            "another torch.profiler is already recording (only one can run at a time): "
            "call memory_timeline outside `with torch.profiler.profile(...)` / %%nbt profile"
        )
    target = torch.device(device) if device is not None else _model_device(model)
    use_cuda = target.type == "cuda" and torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])

    module_names: dict[int, str] = {}
    if model is not None:
        module_names.update({id(m): name or type(m).__name__ for name, m in model.named_modules()})
    tracker = ModTracker()

    def remember_module(module: torch.nn.Module, _inputs: Any) -> None:
        # ModTracker has just named this module (Root.child.grandchild); keep it by id.
        if id(module) not in module_names:
            module_names[id(module)] = tracker.get_known_fqn(module) or type(module).__name__

    tracker.register_user_hooks(pre_fw_hook=remember_module)
    failure: BaseException | None = None
    value: Any = None
    snapshot_dict: dict[str, Any] | None = None
    prof = torch.profiler.profile(
        activities=activities, profile_memory=True, record_shapes=True, with_stack=True
    )
    recording_history = False
    try:
        if use_cuda:
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
            recording_history = True
        with native_stderr_silenced():
            prof.start()
        try:
            with tracker:
                for _ in range(steps):
                    value = fn()
        except BaseException as exc:  # re-raised below, with the partial timeline attached
            failure = exc
        finally:
            with native_stderr_silenced():
                prof.stop()
        if recording_history:
            snapshot_dict = torch.cuda.memory._snapshot()
    finally:
        tracker.clear_user_hooks()
        if recording_history:
            torch.cuda.memory._record_memory_history(enabled=None)

    try:
        timeline = _build_timeline(prof, target, module_names, model=model, optimizer=optimizer)
    except Exception as exc:
        if failure is not None:
            raise failure from None
        raise CaptureError(
            f"the run finished but its memory profile could not be turned into a timeline: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if snapshot_dict is not None:
        from nbtoolkit.model.snapshot import MemorySnapshot

        timeline.allocator_snapshot = MemorySnapshot.from_dict(snapshot_dict, source="memory_timeline")
    timeline.value = value
    if failure is not None:
        timeline.notes.append(
            f"partial: the run raised {type(failure).__name__} during it; the timeline stops at the failure"
        )
        with contextlib.suppress(AttributeError, TypeError):  # exceptions with __slots__
            failure.timeline = timeline  # type: ignore[attr-defined]  # documented: exc.timeline
            failure.add_note(PARTIAL_TIMELINE_NOTE)
        raise failure
    return timeline


def _model_device(model: Any) -> torch.device:
    import torch

    if model is not None:
        for parameter in model.parameters():
            return torch.device(parameter.device)
    return torch.device("cpu")


def _ancestors(event: Any) -> list[Any]:
    chain = []
    parent = event.parent
    while parent is not None:
        chain.append(parent)
        parent = parent.parent
    return chain


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


def _build_timeline(
    prof: Any,
    target: torch.device,
    module_names: dict[int, str],
    *,
    model: Any,
    optimizer: Any,
) -> MemoryTimeline:
    import pandas as pd
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import Action, MemoryProfile, TensorKey

    from nbtoolkit.model.memory import EVENT_COLUMNS, MemoryTimeline

    profile = (
        prof._memory_profile()
        if hasattr(prof, "_memory_profile")
        else MemoryProfile(prof.profiler.kineto_results)
    )
    op_tree = profile._op_tree
    categories = profile._categories

    # Allocation events by time, to join torch's timeline rows with the op tree.
    allocations: dict[int, list[Any]] = {}
    for event in op_tree.sorted_nodes:
        if event.typed[0] == _EventType.Allocation:
            allocations.setdefault(int(event.start_time_ns), []).append(event)

    def find_allocation(t: int, size: int, is_alloc: bool) -> Any:
        for event in allocations.get(t, ()):
            fields = event.typed[1]
            if (fields.alloc_size > 0) == is_alloc and abs(fields.alloc_size) == size:
                return event
        candidates = [e for e in allocations.get(t, ()) if (e.typed[1].alloc_size > 0) == is_alloc]
        return candidates[0] if candidates else None

    shapes = _tensor_shapes(op_tree, _EventType)
    infos: dict[int, _EventInfo] = {}
    # torch's optimizers wrap step()/zero_grad() in record_function ranges; in the op tree
    # these are siblings of the Python frames, so they are matched by time, not ancestry.
    optimizer_ranges = [
        (int(e.start_time_ns), int(e.end_time_ns))
        for e in op_tree.sorted_nodes
        if e.typed[0] == _EventType.TorchOp and e.name.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))
    ]

    def info_of(event: Any) -> _EventInfo:
        key = id(event)
        if key not in infos:
            info = _describe(event, module_names, _EventType)
            t = int(event.start_time_ns)
            if info.phase != "backward" and any(a <= t <= b for a, b in optimizer_ranges):
                info.phase = "optimizer"
            infos[key] = info
        return infos[key]

    # Backward allocations: module of the forward op with the same sequence number.
    forward_module_by_seq: dict[int, str] = {}
    for event in op_tree.sorted_nodes:
        if event.typed[0] == _EventType.TorchOp:
            seq = int(getattr(event.typed[1], "sequence_number", -1))
            if seq >= 0 and seq not in forward_module_by_seq and not event.name.startswith("autograd::"):
                module = ""
                for parent in [event, *_ancestors(event)]:
                    module_info = parent.typed[1].module if parent.typed[0] == _EventType.PyCall else None
                    if module_info is not None:
                        module = module_names.get(int(module_info.self_ptr), module_info.cls_name)
                        break
                if module:
                    forward_module_by_seq[seq] = module

    stacks: list[str] = []
    stack_index: dict[str, int] = {}

    def intern(stack: str) -> int:
        if not stack:
            return -1
        if stack not in stack_index:
            stack_index[stack] = len(stacks)
            stacks.append(stack)
        return stack_index[stack]

    def category_name(key: Any, version: int) -> str:
        found = categories.get(key, version) if isinstance(key, TensorKey) else None
        return _TORCH_CATEGORY_NAMES.get(found.name, "unknown") if found is not None else "unknown"

    owners = _storage_owners(model, optimizer)
    rows: list[tuple[Any, ...]] = []
    tensor_ids: dict[Any, int] = {}
    unknown_live: dict[int, int] = {}  # ptr -> tensor id, for allocations torch could not key
    seen_storage_ptrs: set[int] = set()
    timed = [t for t, *_ in profile.timeline if t >= 0]
    start_ns = min(timed) if timed else 0

    def tensor_id_for(key: Any) -> int:
        identity = (key.id, key.storage.allocation_id)
        if identity not in tensor_ids:
            tensor_ids[identity] = len(tensor_ids)
        return tensor_ids[identity]

    next_unknown = 1 << 40
    key: Any  # a TensorKey, or torch's bare Key for allocations it could not identify
    for t, action, (key, version), size in profile.timeline:
        if key.device != target:
            continue
        time_us = 0.0 if t < 0 else (t - start_ns) / 1e3
        keyed = isinstance(key, TensorKey)
        if keyed:
            seen_storage_ptrs.add(int(key.storage.ptr))
        shape = shapes.get((key.id, key.storage.allocation_id), "") if keyed else ""
        owner = owners.get(int(key.storage.ptr), "") if keyed else ""
        if action == Action.PREEXISTING:
            tensor = tensor_id_for(key) if keyed else -1
            rows.append(
                (
                    0.0,
                    "preexisting",
                    int(size),
                    category_name(key, version),
                    tensor,
                    owner,
                    "before",
                    shape,
                    "",
                    -1,
                )
            )
            continue
        if action == Action.INCREMENT_VERSION:
            tensor = tensor_id_for(key)
            old, new = category_name(key, version), category_name(key, version + 1)
            if old != new:
                rows.append((time_us, "recategorize", -int(size), old, tensor, "", "", shape, "", -1))
                rows.append((time_us, "recategorize", int(size), new, tensor, "", "", shape, "", -1))
            continue
        is_alloc = action == Action.CREATE
        event = find_allocation(t, int(size), is_alloc)
        info = info_of(event) if event is not None else _EventInfo("other", "", -1, "", "")
        if keyed:
            tensor = tensor_id_for(key)
        elif event is not None:
            ptr = int(event.typed[1].ptr)
            if is_alloc:
                tensor = unknown_live[ptr] = next_unknown
                next_unknown += 1
            else:
                tensor = unknown_live.pop(ptr, -1)
        else:
            tensor = -1
        module = info.module
        if info.phase == "backward" and info.seq >= 0:
            module = forward_module_by_seq.get(info.seq, module)
        if owner and (info.phase == "optimizer" or not module):
            module = owner  # a parameter's gradient or optimizer state belongs to its module
        rows.append(
            (
                time_us,
                "alloc" if is_alloc else "free",
                int(size) if is_alloc else -int(size),
                category_name(key, version),
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
    # Recategorize rows and frees happen in whatever phase is current: carry the last one forward.
    phase = frame["phase"].replace("", pd.NA).ffill().fillna("other")
    frame["phase"] = phase.astype(str).to_numpy()
    notes = [baseline_note] if baseline_note else []
    return MemoryTimeline(
        events=frame,
        stacks=stacks,
        device=str(target),
        source="torch.profiler memory profile",
        notes=notes,
        category_method="torch.profiler",
    )


def _storage_owners(model: Any, optimizer: Any) -> dict[int, str]:
    """Storage pointer -> path of the module owning it (its parameters, their grads and optimizer state).

    Pointers are read after the run: grads and optimizer state created during it are
    still alive then (unless freed, e.g. by ``zero_grad(set_to_none=True)``).
    """
    import torch

    owners: dict[int, str] = {}
    if model is None:
        return owners
    by_parameter: dict[int, str] = {}
    for name, parameter in model.named_parameters():
        module = name.rpartition(".")[0] or type(model).__name__
        by_parameter[id(parameter)] = module
        owners.setdefault(int(parameter.untyped_storage().data_ptr()), module)
        if parameter.grad is not None:
            owners.setdefault(int(parameter.grad.untyped_storage().data_ptr()), module)
    for name, buffer in model.named_buffers():
        owners.setdefault(
            int(buffer.untyped_storage().data_ptr()), name.rpartition(".")[0] or type(model).__name__
        )
    if optimizer is not None:
        for parameter, state in optimizer.state.items():
            module = by_parameter.get(id(parameter))
            if module is None:
                continue
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    owners.setdefault(int(value.untyped_storage().data_ptr()), module)
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
    for tensor, category in candidates:
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
        from nbtoolkit.units import format_bytes

        total = sum(r[2] for r in rows)
        note = (
            f"{len(rows)} model/optimizer tensors ({format_bytes(total)}) existed before recording and were "
            "not touched by the run: added as 'preexisting' at time 0"
        )
    return rows, note
