"""Measure one training step: time (median of several after warm-up), peak memory, graphs.

What is measured, and how:

* **Step time**: ``warmup`` steps are run first (compilation happens there), then
  ``steps`` steps are timed one by one, interleaved with the other configuration's
  (:mod:`nbtoolkit.recompute.paired_measure`); the
  median is ``step_time_s`` and the interquartile range (p75 - p25) is ``step_time_spread_s``.
  The clock is read after a device synchronisation. ``step_cpu_time_s`` is the
  median processor time of the same steps (``time.process_time``): on a machine shared with
  other jobs, wall time includes waiting for a CPU and CPU time does not.
* **Peak memory**: one more step runs under ``torch.profiler.profile(profile_memory=True)``
  (run and read by ``nbtoolkit.memory.profile``, shared with ``nbt.memory_timeline``).
  Summing the allocator's event sizes per pointer gives the bytes this step allocated and
  still holds after every event, and ``peak_bytes`` is the largest such total: the step's
  peak working memory above what was live when it started (frees of blocks from before the
  step, such as last step's gradients, are not credited because torch reports them without
  a size). It is exact on the CPU, where torch keeps no allocator statistics of its own; on
  a GPU it matches ``torch.cuda.max_memory_allocated() - memory_allocated()`` taken before
  the step, up to those uncredited frees.
* **Device total**: ``total_peak_bytes`` is the device's whole peak in the same profiled
  step, what a memory budget is compared with: ``torch.cuda.max_memory_allocated`` on a GPU,
  and on the CPU the total torch's memory profiler classifies at its peak (everything alive,
  parameters and optimizer state included; it agrees with torch's MemTracker).
* **Peak by category**: the same profiled step also records shapes and stacks, so
  torch's own memory profiler (the one behind ``export_memory_timeline``) classifies every
  tensor as PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION, GRADIENT or
  AUTOGRAD_DETAIL; ``peak_by_category`` is the bytes of each category alive at the moment
  the classified total is largest (tensors that existed before the step included).
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
from collections.abc import Callable
from typing import Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.core.step_runner import call_step
from nbtoolkit.memory import profile as memory_profile
from nbtoolkit.memory.profile import MARK_PREFIX, MemorySeries, mark
from nbtoolkit.recompute.comparison import Measurement

__all__ = [
    "MARK_PREFIX",
    "MemorySeries",
    "check_step",
    "mark",
    "profile_memory_series",
    "run_step",
]

Progress = Callable[[int, int, str], None]


def check_step(step: Any) -> Callable[[], Any]:
    """The step, if it is a zero-argument callable; a usage error naming what it got otherwise."""
    if not callable(step):
        raise NbtUsageError(
            f"step must be a zero-argument callable that runs one training step, got {type(step).__name__}: "
            "wrap your loop body in `def step(): ...; return loss`"
        )
    return step


def run_step(step: Callable[[], Any], what: str = "profiled step") -> Any:
    """Call the step once, outside a timing loop (under the memory profiler); an exception from
    the user's code becomes the runner's StepError, as in the timed steps."""
    return call_step(step, what)


def loss_value(value: Any) -> float | None:
    """A step's return value as a float (a 0-d tensor or a number), or None."""
    if value is None:
        return None
    try:
        item = value.detach().float().item() if hasattr(value, "detach") else float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return float(item)


def profile_memory_series(
    step: Callable[[], Any], *, categories: bool = False, total: bool = False, device: Any = None
) -> tuple[MemorySeries, dict[str, int], int]:
    """One step under the memory profiler (``nbtoolkit.memory.profile.profile_memory_series``).

    Returns (the allocator series with markers and the step's value, bytes per torch
    category at the classified peak or ``{}``, bytes that existed before the step or 0);
    ``total=True`` also measures the device's whole peak (``series.total_peak_bytes``);
    ``device`` limits the series to that device's allocations.
    An exception from the step becomes one StepError (:func:`run_step`).
    """
    return memory_profile.profile_memory_series(
        lambda: run_step(step), categories=categories, total=total, device=device
    )


def _gpu_in_use() -> Any:
    """The current GPU when CUDA is in use (its total peak is then the allocator's), else None."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def dynamo_counts() -> tuple[int, dict[str, int]]:
    """(graphs compiled so far, graph-break reason -> count) from torch._dynamo's counters."""
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


def keeping_values(step: Callable[[], Any], values: list[Any]) -> Callable[[], Any]:
    """The step, also keeping what each call returned (warm-up ones included) in ``values``;
    they become floats after the loop, since ``.item()`` would wait for the device mid-step."""

    def call() -> Any:
        value = step()
        values.append(value)
        return value

    return call


def timed_measurement(
    label: str,
    *,
    times: list[float],
    cpu_times: list[float],
    warm_times: list[float],
    values: list[Any],
    applied: dict[str, Any] | None,
) -> Measurement:
    """A :class:`Measurement` of the timed steps (median, spread) and the losses of every step run."""
    return Measurement(
        label=label,
        step_time_s=statistics.median(times),
        step_time_spread_s=_quantile(times, 0.75) - _quantile(times, 0.25),
        step_times_s=list(times),
        step_cpu_time_s=statistics.median(cpu_times) if cpu_times else None,
        warmup_times_s=list(warm_times),
        losses=[loss_value(value) for value in values],
        config=dict(applied or {}),
    )


def add_compile_counts(
    measurement: Measurement, before: tuple[int, dict[str, int]], after: tuple[int, dict[str, int]]
) -> None:
    """Graphs and graph breaks compiled between two :func:`dynamo_counts` readings, and the compile
    time: what the warm-up steps took beyond as many steady (median) steps, so that
    ``compile_time_s + len(warmup_times_s) * step_time_s`` is the warm-up's wall time."""
    graphs_before, breaks_before = before
    graphs_after, breaks_after = after
    measurement.graph_count = graphs_after - graphs_before
    reasons = {
        reason.strip().splitlines()[0] if reason.strip() else reason: n - breaks_before.get(reason, 0)
        for reason, n in breaks_after.items()
        if n - breaks_before.get(reason, 0) > 0
    }
    measurement.break_reasons = reasons
    measurement.graph_breaks = sum(reasons.values())
    warm = measurement.warmup_times_s
    measurement.compile_time_s = max(0.0, sum(warm) - measurement.step_time_s * len(warm))


def add_flops_and_memory(
    measurement: Measurement, step: Callable[[], Any], settings: MeasureConfig, tick: Callable[[str], None]
) -> None:
    """With ``settings.memory``, one step under the memory profiler (peaks, categories); with
    ``settings.metrics``, one FLOP-counted step (MFU, HFU... in ``measurement.extra``). ``tick(what)``
    after each.

    Memory first: a compiled forward called under torch's FlopCounterMode runs eagerly from then on
    (until ``torch._dynamo.reset()``), so a memory step after the FLOP count measured the eager
    peak of a compiled side; with torch's partitioner budget that is the whole baseline peak."""
    if settings.memory:
        series, by_category, resident = profile_memory_series(
            step, categories=settings.categories, total=True, device=_gpu_in_use()
        )
        measurement.peak_bytes = series.peak_bytes
        measurement.total_peak_bytes = series.total_peak_bytes
        measurement.resident_bytes = resident
        measurement.peak_by_category = by_category
        measurement.losses.append(loss_value(series.value))
        tick("memory step")
    if settings.metrics:
        from nbtoolkit.metrics.measure import add_step_metrics

        add_step_metrics(measurement, step, tokens_per_step=settings.tokens_per_step)  # a row, never an error
        tick("FLOP-counted step")
