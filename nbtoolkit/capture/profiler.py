"""``nbt.profile``: run a function under ``torch.profiler`` and get a :class:`Trace` back.

The function runs ``warmup`` times unprofiled (first-call costs such as lazy
initialisation or compilation would otherwise dominate), then ``steps`` times under the
profiler with one ``ProfilerStep#N`` per call. The Chrome trace the profiler exports
is read back through :func:`nbtoolkit.load_trace`, so a profiled cell feeds exactly the
same analyses and views as a trace file from a GPU cluster.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.capture._native import native_stderr_silenced
from nbtoolkit.errors import CaptureError, NbtUsageError

if TYPE_CHECKING:
    from nbtoolkit.model.trace import Trace

__all__ = ["profile"]


def profile(
    fn: Callable[[], Any],
    steps: int = 3,
    *,
    warmup: int = 1,
    record_shapes: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    trace_path: str | Path | None = None,
    metrics: bool = False,
    tokens_per_step: int | None = None,
) -> Trace:
    """Profile ``steps`` calls of ``fn`` (after ``warmup`` unprofiled calls) and return the Trace.

    Args:
        fn: a zero-argument callable, e.g. one training step.
        steps: profiled calls, one ``ProfilerStep#N`` each (N counts from 0).
        warmup: calls before profiling starts.
        record_shapes, profile_memory, with_stack: passed to ``torch.profiler.profile``.
        trace_path: also keep the exported Chrome trace at this path (``.json``), e.g.
            to open it in Perfetto; by default it goes to a temporary file that is removed.
        metrics: also count the step's FLOPs (one more, unprofiled run under torch's FLOP
            counter) and attach :class:`~nbtoolkit.model.metrics.StepMetrics` as
            ``trace.step_metrics``, with MFU/HFU in the summary. The step times are the
            profiled ones, so MFU is a lower bound (the profiler adds overhead).
        tokens_per_step: tokens one call of ``fn`` processes, for tokens/s (with ``metrics``).

    CPU activities are always recorded, CUDA ones when CUDA is available. The profiler
    is stopped in a ``finally`` block, so an exception or a KeyboardInterrupt inside
    ``fn`` leaves no profiler running; the exception propagates unchanged.
    The value ``fn`` returned last is kept in ``trace.value``.
    """
    if not callable(fn):
        raise NbtUsageError(f"profile() needs a zero-argument callable, got {type(fn).__name__}")
    if not isinstance(steps, int) or steps < 1:
        raise NbtUsageError(f"steps must be a positive integer, got {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise NbtUsageError(f"warmup must be a non-negative integer, got {warmup!r}")

    import torch
    from torch.profiler import ProfilerActivity

    from nbtoolkit.io.kineto import load_trace

    value: Any = None
    for _ in range(warmup):
        value = fn()

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)

    keep = trace_path is not None
    if trace_path is None:
        handle, name = tempfile.mkstemp(prefix="nbt-profile-", suffix=".json")
        os.close(handle)
        out = Path(name)
    else:
        out = Path(trace_path)
        out.parent.mkdir(parents=True, exist_ok=True)

    prof = torch.profiler.profile(
        activities=activities,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
    )
    try:
        with native_stderr_silenced():  # Kineto's "USDT ... profiler_start" lines
            prof.start()
        try:
            for step in range(steps):
                # The same label torch writes with a schedule, so HTA-style step logic applies.
                with torch.profiler.record_function(f"ProfilerStep#{step}"):
                    value = fn()
                prof.step()
        finally:
            with native_stderr_silenced():
                prof.stop()  # also on exceptions and KeyboardInterrupt: never leave a profiler running
        try:
            prof.export_chrome_trace(str(out))
        except Exception as exc:  # torch raises bare RuntimeError on export problems
            raise CaptureError(f"torch.profiler could not export its trace to {out}: {exc}") from exc
        trace = load_trace(out)
    finally:
        if not keep:
            out.unlink(missing_ok=True)
    for info in trace.info.values():
        # load_trace notes that a temporary file name carries no rank; here we know why.
        info.notes = [n for n in info.notes if "file name" not in n]
        info.source = str(out) if keep else "nbt.profile (in this process)"
    trace.value = value
    if metrics:
        _attach_step_metrics(trace, fn, tokens_per_step)
    return trace


def _attach_step_metrics(trace: Trace, fn: Callable[[], Any], tokens_per_step: int | None) -> None:
    """Count FLOPs of one more call of ``fn`` and rate them against the profiled step times."""
    from nbtoolkit.capture.step_metrics import step_metrics_from_times
    from nbtoolkit.errors import MetricsError

    durations_us = trace.steps["dur"].tolist() if len(trace.steps) else []
    step_times_s = [float(d) / 1e6 for d in durations_us]
    try:
        trace.step_metrics = step_metrics_from_times(
            fn,
            step_times_s,
            times_note="step times of the profiled steps: MFU is a lower bound",
            tokens_per_step=tokens_per_step,
        )
    except MetricsError as exc:  # metrics are an extra: the profile itself stands
        trace.notes.append(f"step metrics not available: {exc}")
        return
    trace.notes.append(f"step metrics: {trace.step_metrics.summary_line()}")
