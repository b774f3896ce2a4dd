"""``nbt.step_metrics(step)``: model and hardware FLOPs, step time, achieved FLOP/s, MFU and HFU.

How it measures (the definitions are in :mod:`nbtoolkit.metrics.step_metrics`):

1. ``warmup`` untimed calls of ``step`` (compilation, allocator and cache warm-up).
2. One call under torch's ``FlopCounterMode``, which files each op's FLOPs under forward,
   backward or recompute (activation checkpointing), per module and per op: see
   :mod:`nbtoolkit.metrics.flop_count`.
3. The peak: ``peak_flops`` when given; else the datasheet table
   (:mod:`nbtoolkit.metrics.device_peaks`) for a known accelerator in the dtype that carried
   most FLOPs; else measured (a CPU: fp32 and bf16 together, re-measured while the machine
   is busy, cached with its conditions: :mod:`nbtoolkit.metrics.cpu_peak`).
4. ``steps`` timed calls WITHOUT the counter (it slows ops down), each synchronised with
   the device; the median is the step time (:mod:`nbtoolkit.core.step_runner`). On a CPU
   the timing is watched (:mod:`nbtoolkit.metrics.cpu_load`): when other processes took
   the cores, the steps are timed again (at most ``STEP_RETRIES`` times) and the quietest
   timing kept, with a note when even that one was busy.
5. The check: a timed step faster than a measured peak gets the peak measured again once;
   still faster (or faster than a datasheet or given peak), MFU and HFU are not given, with
   the reason (``StepMetrics.mfu_unavailable``): a utilization above 100% is never shown.

This module checks the arguments, runs the steps in that order and assembles the
:class:`~nbtoolkit.metrics.step_metrics.StepMetrics`; the counting, timing and peak functions live in
the modules named above.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import MetricsError, NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.core.step_runner import run_steps
from nbtoolkit.core.units import format_flop_rate
from nbtoolkit.metrics.flop_count import FlopCounts, count_step_flops
from nbtoolkit.metrics.peak_flops import device_name, given_peak, resolve_peak
from nbtoolkit.metrics.step_metrics import (
    StepMetrics,
    attach_step_metrics,
    measurement_extra,
    metrics_frame,
    peak_beaten_reason,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "add_step_metrics",
    "attach_step_metrics",
    "measurement_extra",
    "metrics_frame",
    "step_metrics",
    "step_metrics_from_times",
    "step_metrics_note",
]

STEP_RETRIES = 2  # times a busy CPU timing is repeated
STEP_RETRY_MAX_S = 5.0  # a timing longer than this is not repeated (too costly)
BUSY_PAUSE_S = 1.0  # wait before timing again


def _dtype_of(dtype: Any) -> torch.dtype:
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise NbtUsageError(f"dtype={dtype!r} is not a torch dtype: pass e.g. torch.bfloat16 or 'float32'")
    return value


def _positive_int(name: str, value: Any, *, minimum: int, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise NbtUsageError(f"{name}={value!r}: pass an integer >= {minimum}")
    return value


def step_metrics(
    step: Callable[[], Any],
    *,
    model: Any = None,
    steps: int | None = None,
    warmup: int | None = None,
    tokens_per_step: int | None = None,
    samples_per_step: int | None = None,
    dtype: Any = None,
    peak_flops: float | None = None,
    measure_peak: Callable[[torch.device, torch.dtype], float] | None = None,
    config: MeasureConfig | None = None,
    loop: bool = False,
    after: str = "stop",
) -> StepMetrics:
    """Model FLOPs, hardware FLOPs, step time, achieved FLOP/s, MFU and HFU of one training step.

    Args:
        step: a zero-argument callable running one training step (forward, backward, optimizer).
            It is called ``warmup + 1 + steps`` times.
        model: the model (optional): its parameter count is reported, and its parameters'
            device/dtype are used when the step runs no counted op on a device.
        steps: timed steps; the median is the step time (default ``MeasureConfig().steps``).
        warmup: untimed steps first (compilation, caches); default ``MeasureConfig().warmup``.
        tokens_per_step / samples_per_step: how many tokens / samples one step processes, for
            tokens/s and samples/s.
        dtype: the dtype whose peak applies (default: the dtype that carried most FLOPs, so
            autocast to bf16 picks the bf16 peak).
        peak_flops: the device's peak FLOP/s, to override the table and the measurement.
        measure_peak: ``(torch.device, torch.dtype) -> FLOP/s`` used for devices not in the
            table (default: the best of a few timed matrix products up to 2048x2048, cached
            per process).
        config: a :class:`~nbtoolkit.MeasureConfig` (steps, warm-up, synchronisation); ``steps=``
            and ``warmup=`` given as well override its fields.
        loop: ``step`` runs a whole training (``lambda: trainer.train()``, a Lightning ``fit``, a
            plain loop): its setup and ``warmup`` training steps (at least 1) run first, the next
            training step is FLOP-counted, the ``steps`` after it are timed (a step ends at an
            optimizer step), then the loop is stopped (:mod:`nbtoolkit.core.loop_measure`). A busy
            CPU's timing is not repeated (each repeat would take more of the loop's steps); the
            notes say when the CPU was busy. ``metrics.loop`` is the
            :class:`~nbtoolkit.core.training_loop.LoopOutcome`.
        after: with ``loop``: ``"stop"`` (default) stops the loop through the framework's own
            mechanism once its steps are measured; ``"continue"`` lets it run on, unmeasured.

    Raises:
        StepError: the step raised (the original exception is its ``__cause__``).
        MetricsError: the step ran no FLOP-counted op, or the peak is unknown and cannot be
            measured.
        NbtUsageError: bad arguments.
    """
    measure = measure_config(config, steps=steps, warmup=warmup)
    options = _Options.check(step, model=model, tokens_per_step=tokens_per_step,
                             samples_per_step=samples_per_step, dtype=dtype, peak_flops=peak_flops,
                             measure_peak=measure_peak)
    if loop:
        from nbtoolkit.core.loop_measure import measure_loop

        def measure_steps(training: Any) -> StepMetrics:
            return _measure(training, dataclasses.replace(measure, warmup=0), options, retries=0,
                            warmup_shown=max(1, measure.warmup))

        return measure_loop(step, measure_steps, api="nbt.step_metrics", warmup=measure.warmup, after=after,
                            needs=1 + measure.steps)  # the FLOP-counted step, then the timed ones
    return _measure(step, measure, options, retries=STEP_RETRIES, warmup_shown=measure.warmup)


def _measure(step: Callable[[], Any], measure: MeasureConfig, options: _Options, *, retries: int,
             warmup_shown: int) -> StepMetrics:
    # the warm-up runs before the FLOP count (compilation must not land in the counted call),
    # the timed steps after it and without the counter, which slows ops down
    run_steps(step, measure, warmup_only=True)
    counted = _count_and_peak(step, options)
    times, notes = _timed_steps(step, dataclasses.replace(measure, warmup=0), counted.device, retries=retries)
    return _build(counted, times, options, warmup=warmup_shown, notes=notes)


def _timed_steps(step: Callable[[], Any], measure: MeasureConfig,
                 device: str, *, retries: int = STEP_RETRIES) -> tuple[list[float], list[str]]:
    """The timed steps' seconds, and notes on the CPU's load while they ran (see step 4 above)."""
    if not device.startswith("cpu"):
        return run_steps(step, measure, device=device).times_s, []
    import torch

    from nbtoolkit.metrics.cpu_load import CpuWatch, CpuWindow

    tries: list[tuple[list[float], CpuWindow]] = []
    for attempt in range(1 + retries):
        with CpuWatch(torch.get_num_threads()) as watch:
            times = run_steps(step, measure, device=device).times_s
        assert watch.window is not None
        tries.append((times, watch.window))
        if not watch.window.busy() or attempt == retries or watch.window.wall_s > STEP_RETRY_MAX_S:
            break
        time.sleep(BUSY_PAUSE_S)
    times, window = min(tries, key=lambda t: t[1].others_share or 0.0)
    notes = []
    if len(tries) > 1:
        notes.append(
            f"the CPU was busy while the steps were timed: timed {len(tries)} times, kept the quietest"
        )
    if window.busy():
        notes.append(
            f"while the kept steps were timed, {window.describe()}: the step time is long and MFU low"
        )
    return times, notes


def step_metrics_from_times(
    step: Callable[[], Any],
    step_times_s: Sequence[float],
    *,
    times_note: str | None = None,
    model: Any = None,
    tokens_per_step: int | None = None,
    samples_per_step: int | None = None,
    dtype: Any = None,
    peak_flops: float | None = None,
    measure_peak: Callable[[torch.device, torch.dtype], float] | None = None,
) -> StepMetrics:
    """Like :func:`step_metrics`, with step times measured elsewhere (by ``nbt.optimize``'s
    measurement or a profiled run): ``step`` runs once, under the FLOP counter, and nothing is timed.

    ``times_note`` says where the times come from; it becomes a note of the result (e.g.
    ``"step times measured under torch.profiler: MFU is a lower bound"``).
    """
    options = _Options.check(step, model=model, tokens_per_step=tokens_per_step,
                             samples_per_step=samples_per_step, dtype=dtype, peak_flops=peak_flops,
                             measure_peak=measure_peak)
    times = [float(t) for t in step_times_s]
    if not times:
        raise NbtUsageError("step_times_s is empty: pass the seconds of at least one timed step")
    counted = _count_and_peak(step, options)
    notes = [times_note] if times_note else []
    return _build(counted, times, options, warmup=0, notes=notes)


def add_step_metrics(measurement: Any, step: Callable[[], Any], *, errors: str = "note",
                     **options: Any) -> StepMetrics | None:
    """Count the FLOPs of ``step`` once and attach FLOPs, FLOP/s, MFU, HFU (and tokens/s with
    ``tokens_per_step=``) to a :class:`~nbtoolkit.recompute.comparison.Measurement`, using the step
    times it already holds. For ``nbt.optimize``: one line per measured configuration.

    ``errors="note"`` (default): when the metrics cannot be computed (no FLOP-counted op, an
    unknown peak that cannot be measured), the measurement gets one row
    ``step metrics: not available: <why>`` instead, and None is returned; ``"raise"`` raises.
    A step that raises is a StepError either way, as on every path that runs the step.
    ``options`` are those of :func:`step_metrics_from_times`.
    """
    if errors not in ("note", "raise"):
        raise NbtUsageError(f"errors={errors!r}: pass 'note' or 'raise'")
    extra = getattr(measurement, "extra", None)
    times = getattr(measurement, "step_times_s", None)
    if not isinstance(extra, MutableMapping) or not times:
        raise NbtUsageError(
            f"cannot add step metrics to {type(measurement).__name__}: it needs an `extra` mapping and "
            "`step_times_s`; pass a nbtoolkit Measurement with timed steps"
        )
    try:
        metrics = step_metrics_from_times(step, times, **options)
    except MetricsError as exc:
        if errors == "raise":
            raise
        extra["step metrics"] = f"not available: {exc}"
        return None
    attach_step_metrics(measurement, metrics)
    return metrics


def step_metrics_note(step: Callable[[], Any], step_times_s: Sequence[float], **options: Any) -> str:
    """One line for a profile summary: ``"step metrics: MFU 12.3% · HFU ... (peak ..., measured)"``,
    or ``"step metrics not available: <why>"``. Runs ``step`` once under the FLOP counter."""
    try:
        metrics = step_metrics_from_times(step, step_times_s, **options)
    except MetricsError as exc:
        return f"step metrics not available: {exc}"
    return f"step metrics: {metrics.summary_line()}"


@dataclass(frozen=True)
class _Options:
    """Validated arguments shared by the entry points."""

    model: Any
    tokens: int | None
    samples: int | None
    dtype: Any
    peak_flops: float | None
    measure_peak: Callable[[torch.device, torch.dtype], float] | None

    @classmethod
    def check(cls, step: Any, *, model: Any, tokens_per_step: Any, samples_per_step: Any, dtype: Any,
              peak_flops: Any, measure_peak: Any) -> _Options:
        if not callable(step):
            raise NbtUsageError(
                f"step must be a zero-argument callable running one training step, got {type(step).__name__}"
            )
        tokens = _positive_int("tokens_per_step", tokens_per_step, minimum=1, optional=True)
        samples = _positive_int("samples_per_step", samples_per_step, minimum=1, optional=True)
        wanted = _dtype_of(dtype) if dtype is not None else None
        if peak_flops is not None:
            given_peak(peak_flops)  # a bad value fails before any step runs
        if measure_peak is not None and not callable(measure_peak):
            raise NbtUsageError("measure_peak must be a function (torch.device, torch.dtype) -> FLOP/s")
        return cls(model, tokens, samples, wanted, peak_flops, measure_peak)


@dataclass(frozen=True)
class _Counted:
    """One counted step and the peak that applies to it."""

    counts: FlopCounts
    device: str
    dtype: Any
    peak: float
    source: str


def _count_and_peak(step: Callable[[], Any], options: _Options) -> _Counted:
    counts = count_step_flops(step)
    if counts.model_flops <= 0:
        raise MetricsError(
            "the step ran no FLOP-counted operation (matrix product, convolution or attention; torch's "
            "FlopCounterMode counts only those), so model FLOPs are 0 and MFU is undefined. Pass a step "
            "that runs the model's forward and backward"
        )
    device, dtype_name = counts.dominant() or _model_device_dtype(options.model)
    run_dtype = options.dtype or _dtype_of(dtype_name)
    # the peak before any timing: when it cannot be had, no timed step is wasted
    peak, source = resolve_peak(device, run_dtype, peak_flops=options.peak_flops,
                                measure_peak=options.measure_peak)
    return _Counted(counts, device, run_dtype, peak, source)


def _build(counted: _Counted, times: list[float], options: _Options, *, warmup: int,
           notes: list[str] | None = None) -> StepMetrics:
    counts = counted.counts
    notes = list(notes or [])
    if counts.total("backward") == 0:
        notes.append("no backward FLOPs were counted: the step looks like a forward pass only")
    if counts.total("recompute"):
        share = counts.total("recompute") / counts.hardware_flops
        notes.append(f"{100 * share:.1f}% of the executed FLOPs are recomputation (activation checkpointing)")
    parameters = None
    if options.model is not None and hasattr(options.model, "parameters"):
        parameters = int(sum(p.numel() for p in options.model.parameters()))
    metrics = _metrics(counted, times, options, warmup=warmup, notes=notes, parameters=parameters)
    measured = counted.source.startswith("measured") and options.peak_flops is None
    if metrics.peak_beaten and measured:
        # A step beat the measured peak: the peak was taken while the machine was busy. Once more.
        try:
            peak, source = resolve_peak(counted.device, counted.dtype, measure_peak=options.measure_peak,
                                        refresh=True)
        except MetricsError:  # measuring worked a moment ago; now not: keep the first peak
            metrics.mfu_unavailable = peak_beaten_reason(metrics)
            return metrics
        notes.append(
            f"a timed step went faster than the measured peak ({format_flop_rate(counted.peak)}): the peak "
            f"was measured again ({format_flop_rate(peak)})"
        )
        counted = dataclasses.replace(counted, peak=peak, source=source)
        metrics = _metrics(counted, times, options, warmup=warmup, notes=notes, parameters=parameters)
        if metrics.peak_beaten:
            metrics.mfu_unavailable = peak_beaten_reason(metrics, measured_again=True)
    return metrics


def _metrics(counted: _Counted, times: list[float], options: _Options, *, warmup: int, notes: list[str],
             parameters: int | None) -> StepMetrics:
    counts = counted.counts
    return StepMetrics(
        model_flops=counts.model_flops,
        hardware_flops=counts.hardware_flops,
        forward_flops=counts.total("forward"),
        step_times_s=times,
        peak_flops=counted.peak,
        peak_source=counted.source,
        dtype=str(counted.dtype).removeprefix("torch."),
        device=counted.device,
        device_name=device_name(counted.device),
        by_module=counts.module_frame(),
        by_op=counts.op_frame(),
        tokens_per_step=options.tokens,
        samples_per_step=options.samples,
        parameters=parameters,
        warmup=warmup,
        notes=list(notes),
    )


def _model_device_dtype(model: Any) -> tuple[str, str]:
    if model is not None and hasattr(model, "parameters"):
        for p in model.parameters():
            if p.is_floating_point():
                return str(p.device), str(p.dtype).removeprefix("torch.")
    return "cpu", "float32"
