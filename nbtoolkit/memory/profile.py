"""Every run of torch's memory profiler, and the one walk of what it records.

``nbt.memory_timeline``, ``nbt.optimize`` and the recompute planner all run a step under
``torch.profiler.profile(profile_memory=True)`` through :func:`run_memory_profiled`, and
read the result through the two walkers here:

* :func:`allocation_series`: the allocator's own events. The profiler reports every
  allocation and free the CPU (or CUDA) allocator makes, with its size and pointer (kineto's
  ``Allocation`` events). Summing sizes per pointer gives the bytes the run allocated and
  still holds after every event: a :class:`MemorySeries`, whose maximum is the run's peak
  working memory above what was live when it started. Frees of blocks from before the
  run (last step's gradients) are not credited, because torch reports them without a size.
  The allocator's own running total is not used: it counts since the process's first
  profile, so blocks from earlier profiles would shift it. Markers put in with :func:`mark`
  are read from the same event tree.
* :func:`tensor_events`: torch's categorized tensor timeline
  (``torch.profiler._memory_profiler.MemoryProfile``, the engine behind
  ``export_memory_timeline``; it needs ``record_shapes`` and ``with_stack``, which
  ``details=True`` turns on). Each event says what happened to which tensor (pre-existing,
  created, a new version written in place, destroyed), its size and the category torch
  gives that version of it: PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION,
  GRADIENT, AUTOGRAD_DETAIL or None. An in-place write (``increment_version``) moves the
  bytes from the old version's category to the new one's, as ``export_memory_timeline``
  does. :func:`peak_by_category` and the timeline builder
  (``nbtoolkit.memory.attribution``) both read these events.

This module is the only one that touches ``torch.profiler._memory_profiler`` (private API).
"""

from __future__ import annotations

import bisect
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import CaptureError
from nbtoolkit.core.native_stderr import native_stderr_filtered, native_stderr_silenced
from nbtoolkit.core.step_runner import synchronize

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

__all__ = [
    "MARK_PREFIX",
    "TOTAL_UNKNOWN",
    "MemorySeries",
    "ProfiledRun",
    "TensorEvent",
    "TensorTimeline",
    "allocation_series",
    "device_total_peak",
    "live_tensor_bytes",
    "mark",
    "peak_by_category",
    "profile_memory_series",
    "refuse_nested_profiler",
    "run_memory_profiled",
    "tensor_events",
]

MARK_PREFIX = "nbt::mark::"

#: torch's native line when a profiled step frees a block from before profiling: noise, held back.
_PROFILER_NOISE = ("Memory block of unknown size was allocated before the profiling started",)

#: What torch's memory profiler may fail with on programs it cannot classify (private API).
_TORCH_MEMORY_PROFILE_ERRORS = (
    RuntimeError, AttributeError, KeyError, ValueError, AssertionError, IndexError,
)


def mark(name: str) -> None:
    """Put an instant marker named ``nbt::mark::NAME`` into a running profile (a no-op otherwise)."""
    from torch.autograd.profiler import record_function

    with record_function(MARK_PREFIX + name):
        pass


def refuse_nested_profiler(caller: str) -> None:
    """A CaptureError naming ``caller`` when a torch.profiler is already recording on this thread."""
    import torch

    if torch.autograd.profiler._is_profiler_enabled:
        raise CaptureError(
            "another torch.profiler is already recording (only one can run at a time): "
            f"call {caller} outside `with torch.profiler.profile(...)` / %%nbt profile"
        )


@dataclass
class ProfiledRun:
    """One run under torch.profiler(profile_memory=True): the stopped profiler and how the run ended.

    ``failure`` is the exception the run raised (also KeyboardInterrupt), or None;
    ``value`` what the last completed call returned.
    """

    profiler: Any
    value: Any = None
    failure: BaseException | None = None


def run_memory_profiled(
    fn: Callable[[], Any],
    *,
    calls: int = 1,
    details: bool = False,
    cuda: bool = False,
    around: AbstractContextManager[Any] | None = None,
    caller: str = "the memory measurement",
) -> ProfiledRun:
    """Call ``fn`` ``calls`` times under ``torch.profiler.profile(profile_memory=True)``.

    ``details`` also records shapes and stacks (what :func:`tensor_events` needs);
    ``cuda`` adds the CUDA activity; ``around`` is a context entered inside the profile
    (e.g. torch's ModTracker). An exception from ``fn`` does not propagate: it is in
    ``.failure``, so the caller decides whether a partial profile is still useful.
    The profiler is always stopped. ``caller`` names the API in the error raised when
    another profiler is already recording.
    """
    from torch.profiler import ProfilerActivity, profile

    refuse_nested_profiler(caller)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, profile_memory=True, record_shapes=details, with_stack=details)
    run = ProfiledRun(profiler=prof)
    with native_stderr_silenced():
        prof.start()
    try:
        held = around if around is not None else contextlib.nullcontext()
        with native_stderr_filtered(_PROFILER_NOISE), held:
            for _ in range(calls):
                run.value = fn()
        synchronize()
    except BaseException as exc:  # handed to the caller in run.failure
        run.failure = exc
    finally:
        with native_stderr_silenced():
            prof.stop()
    return run


# ---- walker 1: the allocator's events -------------------------------------------------------


@dataclass
class MemorySeries:
    """The allocator's running total during one profiled run, with named markers.

    ``times_ns[k]`` and ``levels[k]``: bytes allocated during the run and still live right
    after the k-th allocation or free. ``marks``: marker name -> time (same clock) of its
    first occurrence. ``value``: what the run returned.
    """

    times_ns: list[int] = field(default_factory=list)
    levels: list[int] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)
    value: Any = None
    #: The device's whole peak during the run (everything allocated, also what existed before
    #: it: parameters, optimizer state ...), when measured (``total=True``), else None.
    total_peak_bytes: int | None = None

    @property
    def peak_bytes(self) -> int:
        return max(self.levels, default=0)

    @property
    def outside_bytes(self) -> int | None:
        """Bytes the device held throughout the peak that this series does not count.

        ``total_peak_bytes - peak_bytes``: what was live before the run and still is at its
        peak (parameters, optimizer state, inputs). Adding it to any level gives the device's
        total at that moment, as long as nothing from before the run is freed after the
        step's first stretch (a ``zero_grad(set_to_none=True)`` frees last step's gradients
        at the start, which is fine).
        """
        return None if self.total_peak_bytes is None else self.total_peak_bytes - self.peak_bytes

    def level_at(self, time_ns: int) -> int:
        """The total right after the last allocation event at or before ``time_ns``."""
        index = bisect.bisect_right(self.times_ns, time_ns) - 1
        return self.levels[index] if index >= 0 else 0


def _walk(nodes: Any) -> Iterator[Any]:
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def allocation_series(profiler: Any, *, device: Any = None) -> MemorySeries:
    """The live bytes after every allocation and free of a stopped profile, and its markers.

    ``device`` (a ``torch.device`` or its text): count only that device's allocator (a GPU
    model's step also allocates small CPU tensors, which are not GPU memory); None: all.
    """
    from torch._C._profiler import _EventType

    wanted = None if device is None else _device_key(device)
    keys: dict[str, tuple[str, int]] = {}  # one parse per device name, not per event

    series = MemorySeries()
    results = profiler.profiler.kineto_results if profiler.profiler is not None else None
    if results is None:
        raise CaptureError("torch.profiler produced no results after stop(): nothing was recorded")
    events = []
    for node in _walk(results.experimental_event_tree()):
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            if wanted is not None and (
                keys.get(name := str(fields.device)) or keys.setdefault(name, _device_key(name))
            ) != wanted:
                continue
            events.append((node.start_time_ns, int(fields.alloc_size), int(fields.ptr)))
        elif node.name.startswith(MARK_PREFIX):
            name = node.name[len(MARK_PREFIX):]
            if name not in series.marks or node.start_time_ns < series.marks[name]:
                series.marks[name] = node.start_time_ns
    events.sort()
    live: dict[int, int] = {}
    level = 0
    for t, size, ptr in events:
        if size > 0:
            live[ptr] = live.get(ptr, 0) + size
            level += size
        elif ptr in live:
            level -= live.pop(ptr)
        else:  # a free of a block from before the profile: torch gives no size, nothing to credit
            continue
        series.times_ns.append(t)
        series.levels.append(level)
    return series


def _device_key(device: Any) -> tuple[str, int]:
    """(type, index) of a device; a GPU named without an index is the current one, the CPU is one."""
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        return ("cpu", 0)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (device.type, index)


#: Why a CPU run's total peak can be missing, and what to do (for the errors of callers that need it).
TOTAL_UNKNOWN = (
    "torch's memory profiler could not classify this step's tensors, so the device's total peak "
    "(parameters, gradients, optimizer state and the step's own memory) is unknown on the CPU"
)


def live_tensor_bytes() -> int:
    """Bytes of all tensors the garbage collector can reach, each storage counted once."""
    import gc

    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        try:
            # type(), not isinstance(): isinstance reads __class__, which some module-level
            # proxies (torch.distributed.reduce_op) answer with a deprecation warning.
            # Fake tensors (left alive by torch.compile's tracing) hold no memory, and reading
            # their data pointer warns: they are skipped like meta tensors.
            kind = type(obj)
            if not issubclass(kind, torch.Tensor) or issubclass(kind, FakeTensor) or obj.is_meta:
                continue
            storage = obj.untyped_storage()
            key = storage.data_ptr()
            if key in seen or key == 0:
                continue
            seen.add(key)
            total += storage.nbytes()
        except (RuntimeError, ReferenceError):  # tensors without storage (sparse, fake)
            continue
    return total


# ---- walker 2: torch's categorized tensor timeline ------------------------------------------


@dataclass(frozen=True, slots=True)
class TensorEvent:
    """One row of torch's memory timeline, with the categories resolved.

    ``action``: ``preexisting`` (alive before the profile; ``time_ns`` is -1), ``create``,
    ``increment_version`` (written in place: its bytes move from ``category`` to
    ``new_category``) or ``destroy``. ``category``: torch's category name of the version
    the event is about (``ACTIVATION`` ...), None when torch could not classify it.
    ``tensor``: (tensor id, storage allocation id) and ``storage_ptr`` when torch identified
    the tensor; None for allocations it only knows by pointer.
    """

    time_ns: int
    action: str
    size: int
    device: Any
    category: str | None
    new_category: str | None = None
    tensor: tuple[int, int] | None = None
    storage_ptr: int | None = None


@dataclass
class TensorTimeline:
    """torch's categorized timeline of one profile (``events``, in torch's order) and its op tree."""

    events: list[TensorEvent]
    op_tree: Any
    #: allocations torch keyed like a storage still live (its free went unrecorded: a backend
    #: thread freed it); torch merges both into one tensor, so their categories are unreliable
    reused_keys: int = 0


def tensor_events(profiler: Any, *, tolerant: bool = False) -> TensorTimeline:
    """Walk torch's memory profile of a stopped ``details=True`` profile (see the module docstring).

    ``tolerant``: when torch's data-flow checks fail because a storage was allocated twice at one
    address (a free on another thread went unrecorded: gloo under FSDP2), rebuild the profile
    without them (:func:`_tolerant_memory_profile`) instead of raising. ``nbt.memory_timeline``
    asks for it; the budget measurements keep the failure, which sends them to their fallback.
    """
    from torch.profiler._memory_profiler import Action, MemoryProfile, TensorKey

    try:
        memory_profile = (
            profiler._memory_profile()
            if hasattr(profiler, "_memory_profile")
            else MemoryProfile(profiler.profiler.kineto_results)
        )
    except AssertionError as exc:
        # both are torch's data-flow checks failing on a storage allocated twice at one address
        if not tolerant or not str(exc).startswith(("version mismatch", "duplicate outputs")):
            raise
        memory_profile = _tolerant_memory_profile(profiler)
    categories = memory_profile._categories

    def category(key: Any, version: int) -> str | None:
        found = categories.get(key, version) if isinstance(key, TensorKey) else None
        return found.name if found is not None else None

    actions = {
        Action.PREEXISTING: "preexisting",
        Action.CREATE: "create",
        Action.INCREMENT_VERSION: "increment_version",
        Action.DESTROY: "destroy",
    }
    events = []
    key: Any  # a TensorKey, or torch's bare Key for allocations it could not identify
    for t, action, (key, version), size in memory_profile.timeline:
        keyed = isinstance(key, TensorKey)
        events.append(
            TensorEvent(
                time_ns=int(t),
                action=actions[action],
                size=int(size),
                device=key.device,
                category=category(key, version),
                # torch's timeline gives the version written over; the new one is the next
                new_category=category(key, version + 1) if action == Action.INCREMENT_VERSION else None,
                tensor=(int(key.id), int(key.storage.allocation_id)) if keyed else None,
                storage_ptr=int(key.storage.ptr) if keyed else None,
            )
        )
    events, reused = _split_reused_keys(events, memory_profile._op_tree)
    return TensorTimeline(events=events, op_tree=memory_profile._op_tree, reused_keys=reused)


_ACTION_ORDER = {"preexisting": 0, "create": 1, "increment_version": 2, "destroy": 3}  # torch's


def _split_reused_keys(events: list[TensorEvent], op_tree: Any) -> tuple[list[TensorEvent], int]:
    """``events`` with each storage torch merged from several allocations split into them again,
    and how many allocations were merged into a storage still live.

    torch keys a storage by its address and an id it gives each address on allocation; when the
    profiler misses a free (it records the profiled thread only; gloo frees some buffers on its
    own threads), the next allocation at that address gets the old key. torch then merges the
    two: one tensor, created twice at the later time, with the first one's size and category
    (an unsharded parameter's PARAMETER passed on to a backward buffer, counted until the end).
    Such a key's events are replaced by the allocator's own: each allocation with its time and
    size, as a tensor of its own (allocation id -1, -2 ...), uncategorised (torch's category
    was the merged storage's), ended by the next allocation at its address when its own free
    was not seen (the latest it can have been freed).
    """
    from torch._C._profiler import _EventType
    from torch.profiler._memory_profiler import TensorKey

    raw: dict[Any, list[tuple[int, int]]] = {}  # key -> its allocations and frees (time, size)
    live: set[Any] = set()
    merged: set[Any] = set()
    reused = 0
    for node in op_tree.sorted_nodes:
        if node.typed[0] != _EventType.Allocation:
            continue
        fields = node.typed[1]
        key = TensorKey.from_allocation(fields)
        if key is None:
            continue
        raw.setdefault(key, []).append((int(node.start_time_ns), int(fields.alloc_size)))
        if fields.alloc_size > 0:
            if key in live:
                reused += 1
                merged.add(key)
            live.add(key)
        else:
            live.discard(key)
    if not merged:
        return events, 0
    identities = {(int(k.id), int(k.storage.allocation_id)) for k in merged}
    kept = [e for e in events if e.tensor not in identities]
    for key in merged:
        def event(t: int, action: str, size: int, identity: tuple[int, int], key: Any = key) -> TensorEvent:
            ptr = key.storage.ptr
            return TensorEvent(t, action, size, key.device, None, tensor=identity, storage_ptr=ptr)

        lifetimes = 0
        open_size: int | None = None
        identity = (int(key.id), 0)
        for t, size in raw[key]:
            if open_size is not None:  # its free, or (unseen) just before the next allocation here
                end = t if size <= 0 else t - 1
                kept.append(event(end, "destroy", open_size, identity))
                open_size = None
            if size > 0:
                lifetimes += 1
                identity, open_size = (int(key.id), -lifetimes), size
                kept.append(event(t, "create", size, identity))
    kept.sort(key=lambda e: (e.time_ns, _ACTION_ORDER[e.action]))
    return kept, reused


def _tolerant_memory_profile(profiler: Any) -> Any:
    """torch's MemoryProfile built without its checks that each op's outputs have the version
    its data-flow graph expects and that no version is output twice.

    The check fails when an allocation reuses the address of a block whose free was not
    recorded: the profiler records memory events of the profiled thread only, and collective
    backends free some buffers on their own threads (gloo's work threads under FSDP2's
    all-gathers, about one profile in five). torch then sees the same storage allocated
    twice and stops. Without the check the second allocation continues the first one's
    versions; :func:`_split_reused_keys` then splits that storage into its allocations again.
    """
    import torch.profiler._memory_profiler as memory_profiler

    checked = memory_profiler.DataFlowNode

    class UncheckedNode(checked):  # type: ignore[misc,valid-type]
        def __init__(self, event: Any, graph: Any) -> None:
            # DataFlowNode.__init__ less its final version check
            self._event = event
            self._graph = graph
            self._edges = self._determine_edges()
            for key, edge in self._edges.items():
                if edge.mutated and not edge.is_allocation:
                    self._graph.bump(key)

    checked_graph = memory_profiler.DataFlowGraph

    class UncheckedGraph(checked_graph):  # type: ignore[misc,valid-type]
        def validate(self) -> None:  # its check that no storage version is output twice
            return None

    # both are read by name (as module globals) while MemoryProfile builds its data-flow graph
    module: Any = memory_profiler  # assigned to: a module's globals, not its declared types
    module.DataFlowNode, module.DataFlowGraph = UncheckedNode, UncheckedGraph
    try:
        return memory_profiler.MemoryProfile(profiler.profiler.kineto_results)
    finally:
        module.DataFlowNode, module.DataFlowGraph = checked, checked_graph


def peak_by_category(events: list[TensorEvent]) -> tuple[dict[str, int], int]:
    """(bytes per category alive when the classified total is largest, bytes that pre-existed).

    Categories are torch's names (``ACTIVATION`` ...), ``unknown`` for unclassified memory;
    tensors that existed before the profile count, on every device.
    """
    live: dict[str, int] = {}
    resident = 0
    peak_total = -1
    at_peak: dict[str, int] = {}
    for event in events:
        name = event.category or "unknown"
        if event.action in ("create", "preexisting"):
            if event.action == "preexisting":
                resident += event.size
            live[name] = live.get(name, 0) + event.size
        elif event.action == "destroy":
            live[name] = live.get(name, 0) - event.size
        else:  # increment_version
            new = event.new_category or "unknown"
            live[name] = live.get(name, 0) - event.size
            live[new] = live.get(new, 0) + event.size
        total = sum(live.values())
        if total > peak_total:
            peak_total, at_peak = total, dict(live)
    return {k: int(v) for k, v in sorted(at_peak.items()) if v > 0}, resident


def profile_memory_series(
    fn: Callable[[], Any], *, categories: bool = False, total: bool = False, device: Any = None
) -> tuple[MemorySeries, dict[str, int], int]:
    """Run ``fn`` once under the memory profiler; its allocator series, and optionally its categories.

    With ``categories=True`` shapes and stacks are recorded too and the second value is
    :func:`peak_by_category` and the third the bytes that existed before the run (parameters,
    optimizer state ...) as torch's memory profiler saw them; otherwise ``{}`` and 0.
    With ``total=True`` the series also gets ``total_peak_bytes``, the device's whole peak
    (see :func:`device_total_peak`). ``device``: count only that device's allocations in the
    series (see :func:`allocation_series`).
    An exception from ``fn`` propagates after the profiler is stopped.
    """
    import torch

    on_gpu = device is not None and torch.device(device).type == "cuda"
    if on_gpu:
        synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    details = categories or (total and not on_gpu)
    # the fallback for a CPU total when torch cannot classify the run (see device_total_peak)
    live_before = None
    if total and not on_gpu:
        import gc

        gc.collect()  # garbage from earlier steps would count as live
        live_before = live_tensor_bytes()
    run = run_memory_profiled(fn, details=details, cuda=torch.cuda.is_available())
    if run.failure is not None:
        raise run.failure
    series = allocation_series(run.profiler, device=device)
    series.value = run.value
    by_category: dict[str, int] = {}
    resident = 0
    classified = False
    if details:
        try:
            by_category, resident = peak_by_category(tensor_events(run.profiler).events)
            classified = True
        except _TORCH_MEMORY_PROFILE_ERRORS:
            # torch's memory profiler is private API and may not classify every program;
            # the series is still valid without the split.
            by_category, resident = {}, 0
    if total:
        series.total_peak_bytes = device_total_peak(
            series, by_category if classified else None, device=device if on_gpu else None,
            live_before=live_before,
        )
    if not categories:
        by_category, resident = {}, 0
    return series, by_category, resident


def device_total_peak(
    series: MemorySeries,
    by_category: dict[str, int] | None,
    *,
    device: Any = None,
    live_before: int | None = None,
) -> int | None:
    """The device's whole peak during a profiled run: what a memory budget is compared with.

    On a GPU (``device`` given) it is ``torch.cuda.max_memory_allocated`` since the peak
    statistics were reset before the run (the caller resets them). On the CPU, which keeps no
    allocator statistics, it is the total torch's memory profiler classifies at its peak:
    every tensor alive then, also those from before the run (parameters, optimizer state,
    inputs); it agrees with ``torch.distributed._tools.mem_tracker.MemTracker``'s total
    (tested). When torch's memory profiler cannot classify the run (private API; it fails on
    some DeepSpeed ZeRO-3 steps), ``live_before`` (:func:`live_tensor_bytes` before the run)
    plus the series' peak stands in: an upper bound, since frees of tensors from before the run
    are not credited. Never below the series' own peak; None when neither is known.
    """
    import torch

    if device is not None:
        synchronize()
        return max(int(torch.cuda.max_memory_allocated(device)), series.peak_bytes)
    if by_category is None:
        return None if live_before is None else live_before + series.peak_bytes
    return max(sum(by_category.values()), series.peak_bytes)
