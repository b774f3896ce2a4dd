"""The one way nbtoolkit runs a step under ``torch.profiler`` and exports its Chrome trace.

``nbt.profile`` (in the notebook's process) and the cluster's rank tool (on each rank,
``nbtoolkit.cluster.rank_tools.profile_to_bytes``) both call :func:`record_step_trace`, so
the same step profiled locally and on a rank gives the same trace: the same
``ProfilerStep#N`` labels (N counts the profiled calls from 0), the same activities, the
same synchronisation.

How a step is recorded, and why:

- ``warmup`` calls run first, unprofiled: first-call costs (lazy initialisation,
  compilation, allocator growth) would otherwise dominate the first profiled step.
- Activities: CPU always, CUDA when CUDA is available.
- Each profiled call runs inside ``record_function("ProfilerStep#N")`` (the label
  torch.profiler writes when it has a schedule, so HTA-style step logic applies), and
  the device is synchronised *inside* the label: the step's duration then covers its
  device work, as a training loop that reads the loss each step sees it, and no kernel
  of one step runs while the next step is being recorded. The device is also
  synchronised before the profiler starts, so warm-up work does not spill into step 0.
- The profiler is stopped in a ``finally`` block: an exception or a KeyboardInterrupt in
  the step leaves no profiler running, and propagates unchanged.
- With a :class:`~nbtoolkit.trace.step_load.StepLoadRecorder` (``nbt.profile`` passes one), the
  machine's load is measured around every step, outside its label (the step's duration in the
  trace does not include it): what ``nbt.compare`` needs to leave disturbed steps out.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import CaptureError, NbtUsageError
from nbtoolkit.core.measure_config import DEFAULT_STEPS, DEFAULT_WARMUP
from nbtoolkit.core.native_stderr import native_stderr_silenced
from nbtoolkit.core.profiler_steps import profiler_step_label
from nbtoolkit.core.step_runner import synchronize as device_synchronize

if TYPE_CHECKING:
    from nbtoolkit.trace.step_load import StepLoadRecorder

__all__ = ["record_step_trace", "temporary_trace_file"]


def record_step_trace(
    fn: Callable[[], Any],
    trace_file: str | Path,
    *,
    steps: int = DEFAULT_STEPS,
    warmup: int = DEFAULT_WARMUP,
    record_shapes: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    synchronize: bool = True,
    load: StepLoadRecorder | None = None,
) -> Any:
    """Run ``fn`` ``warmup`` times, then ``steps`` times under torch.profiler; write the Chrome trace.

    Args:
        fn: a zero-argument callable, e.g. one training step.
        trace_file: where the Chrome trace (``.json``) is written; its folder is created.
        steps: profiled calls, one ``ProfilerStep#N`` each (N counts from 0).
        warmup: calls before profiling starts.
        record_shapes, profile_memory, with_stack: passed to ``torch.profiler.profile``.
        synchronize: wait for the device inside each step's label (``MeasureConfig.synchronize``).
        load: measures the machine's load around every profiled step (filled in place).

    Returns what ``fn`` returned last. See the module docstring for how steps are recorded.

    Raises:
        NbtUsageError: ``fn`` is not callable, or ``steps``/``warmup`` are not counts.
        CaptureError: torch.profiler could not export its trace.
    """
    if not callable(fn):
        raise NbtUsageError(f"profile() needs a zero-argument callable, got {type(fn).__name__}")
    if not isinstance(steps, int) or steps < 1:
        raise NbtUsageError(f"steps must be a positive integer, got {steps!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise NbtUsageError(f"warmup must be a non-negative integer, got {warmup!r}")

    import torch
    from torch.profiler import ProfilerActivity

    out = Path(trace_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    wait = device_synchronize if synchronize else _nothing
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]

    value: Any = None
    for _ in range(warmup):
        value = fn()
    wait()  # warm-up kernels finish before the profiler starts: none lands in step 0

    prof = torch.profiler.profile(
        activities=activities,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
    )
    with native_stderr_silenced():  # Kineto's "USDT ... profiler_start" lines
        prof.start()
    try:
        if load is not None:
            load.start()
        for step in range(steps):
            if load is not None:
                load.before_step()
            with torch.profiler.record_function(profiler_step_label(step)):
                value = fn()
                wait()  # inside the label: the step's time covers its device work
            if load is not None:
                load.after_step()  # outside the label: the probe is not part of the step
            prof.step()
    finally:
        with native_stderr_silenced():
            prof.stop()  # also on exceptions and KeyboardInterrupt: never leave a profiler running
    try:
        prof.export_chrome_trace(str(out))
    except Exception as exc:  # torch raises bare RuntimeError on export problems
        raise CaptureError(f"torch.profiler could not export its trace to {out}: {exc}") from exc
    return value


@contextlib.contextmanager
def temporary_trace_file(prefix: str) -> Iterator[Path]:
    """A fresh ``.json`` path in the temporary folder, removed on leaving (whatever happens)."""
    handle, name = tempfile.mkstemp(prefix=prefix, suffix=".json")
    os.close(handle)
    path = Path(name)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _nothing() -> None:
    """No device to wait for (CPU only)."""
