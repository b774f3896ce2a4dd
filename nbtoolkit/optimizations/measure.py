"""Measure one training step: time (median of several after warm-up), peak memory, graphs.

What is measured, and how:

* **Step time**: ``warmup`` steps are run first (compilation happens there), then
  ``steps`` steps are timed one by one with ``time.perf_counter``; the median is
  ``step_time_s`` and the interquartile range (p75 - p25) is ``step_time_spread_s``.
  On CUDA the clock is read after ``torch.cuda.synchronize()``. ``step_cpu_time_s`` is the
  median processor time of the same steps (``time.process_time``): on a machine shared with
  other jobs, wall time includes waiting for a CPU and CPU time does not.
* **Peak memory**: one more step runs under ``torch.profiler.profile(profile_memory=True)``.
  Every allocation and free the CPU (or CUDA) allocator makes is reported with the
  allocator's running total of bytes allocated since profiling began
  and its pointer; summing sizes per pointer gives the bytes this step allocated and still
  holds after every event, and ``peak_bytes`` is the largest such total: the step's peak
  working memory above what was live when it started (frees of blocks from before the step,
  such as last step's gradients, are not credited because torch reports them without a size).
  It is exact on the CPU, where torch keeps no allocator statistics of its own; on a GPU it
  matches ``torch.cuda.max_memory_allocated() - memory_allocated()`` taken before the step,
  up to those uncredited frees.
* **Peak by category**: the same profiled step also records shapes and stacks, so
  torch's own memory profiler (``torch.profiler._memory_profiler.MemoryProfile``, the one
  behind ``export_memory_timeline``) classifies every tensor as PARAMETER, OPTIMIZER_STATE,
  INPUT, TEMPORARY, ACTIVATION, GRADIENT or AUTOGRAD_DETAIL; ``peak_by_category`` is the bytes
  of each category alive at the moment the classified total is largest (tensors that existed
  before the step included).
* **Compile time and graph breaks**: torch._dynamo's counters (``unique_graphs`` and
  ``graph_break``) are read before and after, the difference is what this measurement
  compiled; ``compile_time_s`` is the time the warm-up steps took beyond ``warmup`` times the
  median step.

Running a step trains the model for real (the optimizer updates the weights), as
it would in your training loop.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from nbtoolkit.capture._native import native_stderr_silenced
from nbtoolkit.errors import NbtUsageError
from nbtoolkit.model.comparison import Measurement

__all__ = [
    "MemorySeries",
    "check_step",
    "mark",
    "measure_step",
    "profile_memory_series",
    "run_step",
]

MARK_PREFIX = "nbt::mark::"

Progress = Callable[[int, int, str], None]


def check_step(step: Any) -> Callable[[], Any]:
    """The step, if it is a zero-argument callable; a usage error naming what it got otherwise."""
    if not callable(step):
        raise NbtUsageError(
            f"step must be a zero-argument callable that runs one training step, got {type(step).__name__}: "
            "wrap your loop body in `def step(): ...; return loss`"
        )
    return step


def run_step(step: Callable[[], Any]) -> Any:
    """Call the step once; an exception from the user's code becomes one clear NbtUsageError."""
    try:
        return step()
    except (KeyboardInterrupt, NbtUsageError):
        raise
    except Exception as exc:
        name = getattr(step, "__name__", type(step).__name__)
        raise NbtUsageError(
            f"the step function {name!r} raised {type(exc).__name__}: {exc}. "
            "Run it once on its own to fix it; the model was left as it was"
        ) from exc


def loss_value(value: Any) -> float | None:
    """A step's return value as a float (a 0-d tensor or a number), or None."""
    if value is None:
        return None
    try:
        item = value.detach().float().item() if hasattr(value, "detach") else float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return float(item)


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def mark(name: str) -> None:
    """Put an instant marker named ``nbt::mark::NAME`` into a running profile (a no-op otherwise)."""
    from torch.autograd.profiler import record_function

    with record_function(MARK_PREFIX + name):
        pass


@dataclass
class MemorySeries:
    """The allocator's running total during one profiled step, with named markers.

    ``times_ns[k]`` and ``levels[k]``: bytes allocated during the step and still live right
    after the k-th allocation or free. ``marks``: marker name -> time (same clock) of its
    first occurrence.
    """

    times_ns: list[int] = field(default_factory=list)
    levels: list[int] = field(default_factory=list)
    marks: dict[str, int] = field(default_factory=dict)
    value: Any = None

    @property
    def peak_bytes(self) -> int:
        return max(self.levels, default=0)

    def level_at(self, time_ns: int) -> int:
        """The total right after the last allocation event at or before ``time_ns``."""
        import bisect

        index = bisect.bisect_right(self.times_ns, time_ns) - 1
        return self.levels[index] if index >= 0 else 0


def _walk(nodes: Any) -> Iterator[Any]:
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def profile_memory_series(
    step: Callable[[], Any], *, categories: bool = False
) -> tuple[MemorySeries, dict[str, int], int]:
    """Run the step once under torch.profiler(profile_memory=True); the allocator series and markers.

    With ``categories=True`` shapes and stacks are recorded too and the second value is the
    bytes per torch memory category alive at the classified peak (see the module docstring);
    otherwise it is empty. The third value is the bytes of tensors that existed before the
    step (parameters, optimizer state ...) as torch's memory profiler saw them (0 without categories).
    """
    import torch
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(
        activities=activities,
        profile_memory=True,
        record_shapes=categories,
        with_stack=categories,
    )
    with native_stderr_silenced():
        prof.start()
    try:
        value = run_step(step)
        _synchronize()
    finally:
        with native_stderr_silenced():
            prof.stop()
    series = MemorySeries(value=value)
    events = []
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    assert results is not None, "torch.profiler produced no results after stop()"
    for node in _walk(results.experimental_event_tree()):
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            events.append((node.start_time_ns, int(fields.alloc_size), int(fields.ptr)))
        elif node.name.startswith(MARK_PREFIX):
            name = node.name[len(MARK_PREFIX):]
            if name not in series.marks or node.start_time_ns < series.marks[name]:
                series.marks[name] = node.start_time_ns
    events.sort()
    # The allocator's own total_allocated counts since the process's first profile, so blocks
    # from earlier profiles shift it; live bytes are summed here per pointer instead. A free of a
    # block allocated before this profile began (last step's gradients) has no known size
    # in torch's report and is left out: the level is what this step allocated and still holds.
    live: dict[int, int] = {}
    level = 0
    for t, size, ptr in events:
        if size > 0:
            live[ptr] = live.get(ptr, 0) + size
            level += size
        elif ptr in live:
            level -= live.pop(ptr)
        else:
            continue
        series.times_ns.append(t)
        series.levels.append(level)
    by_category: dict[str, int] = {}
    resident = 0
    if categories:
        by_category, resident = _peak_by_category(prof)
    return series, by_category, resident




def _peak_by_category(prof: Any) -> tuple[dict[str, int], int]:
    """Bytes per category at the peak of torch's own categorized memory timeline."""
    try:
        from torch.profiler._memory_profiler import Action

        memory_profile = prof._memory_profile()
        live: dict[str, int] = {}
        resident = 0
        peak_total = -1
        at_peak: dict[str, int] = {}

        def category(key: Any, version: int) -> str:
            found = memory_profile._categories.get(key, version)
            return found.name if found is not None else "unknown"

        for _, action, (key, version), size in memory_profile.timeline:
            if action in (Action.CREATE, Action.PREEXISTING):
                if action == Action.PREEXISTING:
                    resident += size
                name = category(key, version)
                live[name] = live.get(name, 0) + size
            elif action == Action.DESTROY:
                name = category(key, version)
                live[name] = live.get(name, 0) - size
            elif action == Action.INCREMENT_VERSION:
                old, new = category(key, version - 1), category(key, version)
                live[old] = live.get(old, 0) - size
                live[new] = live.get(new, 0) + size
            total = sum(live.values())
            if total > peak_total:
                peak_total, at_peak = total, dict(live)
        return {k: int(v) for k, v in sorted(at_peak.items()) if v > 0}, resident
    except (RuntimeError, AttributeError, KeyError, ValueError, AssertionError, IndexError):
        # torch's memory profiler is private API and may not classify every program;
        # the measurement is still valid without the split.
        return {}, 0


def _dynamo_counts() -> tuple[int, dict[str, int]]:
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"].get("unique_graphs", 0))
    breaks = {str(reason): int(n) for reason, n in counters["graph_break"].items()}
    return graphs, breaks


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def time_steps(
    step: Callable[[], Any], count: int
) -> tuple[list[float], list[float | None], list[float]]:
    """Run ``count`` steps, each timed on its own; (wall seconds, losses, CPU seconds) per step.

    CPU seconds are ``time.process_time()`` differences: the processor time this process
    spent (all its threads, user and system), which waiting for a busy machine's CPU does
    not inflate.
    """
    times: list[float] = []
    cpu: list[float] = []
    losses: list[float | None] = []
    for _ in range(count):
        _synchronize()
        start, start_cpu = time.perf_counter(), time.process_time()
        value = run_step(step)
        _synchronize()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        losses.append(loss_value(value))
    return times, losses, cpu


def measure_step(
    step: Callable[[], Any],
    *,
    label: str = "step",
    steps: int = 5,
    warmup: int = 2,
    memory: bool = True,
    categories: bool = True,
    compiled: bool = False,
    config: dict[str, Any] | None = None,
    progress: Progress | None = None,
    flops: bool = False,
    tokens_per_step: int | None = None,
) -> Measurement:
    """Measure a step as the module docstring describes; returns a :class:`Measurement`.

    Runs ``warmup + steps`` steps, plus one profiled step when ``memory`` is true, plus one
    step under torch's FLOP counter when ``flops`` is true (model/hardware FLOPs, MFU, HFU
    and, with ``tokens_per_step``, tokens/s land in ``measurement.extra``).
    ``compiled`` says the step runs compiled code, so compile time and graph breaks are reported.
    ``progress(done, total, what)`` is called after every step.
    """
    check_step(step)
    if steps < 1 or warmup < 0:
        raise NbtUsageError(f"steps must be >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    total = warmup + steps + (1 if memory else 0) + (1 if flops else 0)
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, f"{label}: {what}")

    graphs_before, breaks_before = _dynamo_counts() if compiled else (0, {})
    warm_times: list[float] = []
    losses: list[float | None] = []
    for _ in range(warmup):
        t, loss, _ = time_steps(step, 1)
        warm_times += t
        losses += loss
        tick("warm-up step")
    times: list[float] = []
    cpu_times: list[float] = []
    for _ in range(steps):
        t, loss, cpu = time_steps(step, 1)
        times += t
        cpu_times += cpu
        losses += loss
        tick("timed step")
    median = statistics.median(times)
    spread = _quantile(times, 0.75) - _quantile(times, 0.25)
    measurement = Measurement(
        label=label,
        step_time_s=median,
        step_time_spread_s=spread,
        step_times_s=times,
        step_cpu_time_s=statistics.median(cpu_times),
        losses=losses,
        config=dict(config or {}),
    )
    if compiled:
        graphs_after, breaks_after = _dynamo_counts()
        measurement.graph_count = graphs_after - graphs_before
        reasons = {
            reason.strip().splitlines()[0] if reason.strip() else reason: n - breaks_before.get(reason, 0)
            for reason, n in breaks_after.items()
            if n - breaks_before.get(reason, 0) > 0
        }
        measurement.break_reasons = reasons
        measurement.graph_breaks = sum(reasons.values())
        measurement.compile_time_s = max(0.0, sum(warm_times) - median * len(warm_times))
    if flops:
        from nbtoolkit.capture.step_metrics import add_step_metrics

        add_step_metrics(measurement, step, tokens_per_step=tokens_per_step)  # a row, never an error
        tick("FLOP-counted step")
    if memory:
        series, by_category, resident = profile_memory_series(step, categories=categories)
        measurement.peak_bytes = series.peak_bytes
        measurement.resident_bytes = resident
        measurement.peak_by_category = by_category
        measurement.losses.append(loss_value(series.value))
        tick("memory step")
    return measurement

