"""The one loop that runs and times a user's training step.

:func:`run_steps` calls the step ``warmup`` times, then ``steps`` times, each timed call
bracketed by a device synchronisation (:func:`synchronize`: CUDA, XPU or MPS when in use) and
read with ``time.perf_counter`` (wall), ``time.process_time`` (this process's CPU time,
which waiting for a busy machine's cores does not inflate) and ``time.thread_time`` (the
calling thread's CPU time, which other threads of the process do not inflate either). It
can reset and read the device's peak allocated memory around the measured steps.

An exception raised by the step becomes one :class:`~nbtoolkit.core.errors.StepError` naming the
step and the call that failed, with the original chained (:func:`call_step`), on every path
that measures a step: ``nbt.optimize``, ``nbt.step_metrics``,
``nbt.plan_recompute``, ``nbt.capture_graphs`` and the DeepSpeed ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nbtoolkit.core.errors import NbtError, StepError
from nbtoolkit.core.measure_config import MeasureConfig

__all__ = ["StepRun", "call_step", "run_steps", "step_name", "synchronize", "timed_call"]


def step_name(step: Any) -> str:
    """How messages name the step: its ``__name__`` (a function), else its type's name."""
    return str(getattr(step, "__name__", None) or type(step).__name__)


def call_step(step: Callable[[], Any], what: str, *, name: str | None = None) -> Any:
    """``step()``; what it raises becomes a StepError naming the step and ``what`` call it was.

    nbtoolkit's own errors (e.g. a usage error raised inside a nested measurement) and
    KeyboardInterrupt pass unchanged.
    """
    try:
        return step()
    except (KeyboardInterrupt, NbtError):
        raise
    except Exception as exc:
        label = name or step_name(step)
        detail = str(exc).rstrip()
        end = "" if detail.endswith((".", "!", "?")) else "."  # torch's messages often end a sentence
        raise StepError(
            f"the step {label!r} raised {type(exc).__name__} during the {what}: {detail}{end} "
            "Run it once on its own to see the full traceback, fix it and measure again",
            step=label,
            call=what,
        ) from exc


def synchronize(device: Any = None) -> None:
    """Wait for the work queued on ``device`` (by default every accelerator in use; a no-op on CPU).

    A timer must not stop before the device work of the step it times has ended. Only a
    backend already initialised is synchronised: waking CUDA up here would cost seconds and
    memory in a process that never used it.
    """
    import torch

    kind = str(device).split(":", 1)[0] if device is not None else None
    if kind in ("cpu", "meta"):
        return
    if kind in (None, "cuda") and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize(device if kind == "cuda" else None)
        if kind == "cuda":
            return
    xpu = getattr(torch, "xpu", None)
    if kind in (None, "xpu") and xpu is not None and xpu.is_available() and xpu.is_initialized():
        xpu.synchronize()
    mps = getattr(torch, "mps", None)
    if kind in (None, "mps") and mps is not None and torch.backends.mps.is_available():
        mps.synchronize()


@dataclass
class StepRun:
    """What :func:`run_steps` measured.

    Attributes:
        times_s: wall seconds of each measured step, in order.
        cpu_times_s: processor seconds of the same steps.
        thread_times_s: processor seconds of the calling thread in the same steps.
        warmup_times_s: wall seconds of each warm-up step (what compilation cost shows in).
        values: what each measured step returned.
        peak_bytes: the device's peak allocated bytes during the measured steps (``peak_memory``
            on a CUDA device), else None.
    """

    times_s: list[float] = field(default_factory=list)
    cpu_times_s: list[float] = field(default_factory=list)
    thread_times_s: list[float] = field(default_factory=list)
    warmup_times_s: list[float] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    peak_bytes: int | None = None

    @property
    def value(self) -> Any:
        """What the last measured step returned (None when none ran)."""
        return self.values[-1] if self.values else None


def _cuda_device(device: Any) -> Any:
    """The CUDA device whose peak memory is read, or None when the step does not run on CUDA."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    target = torch.device(device)
    return target if target.type == "cuda" else None


def timed_call(
    step: Callable[[], Any], what: str, *, name: str | None = None, synchronize_device: bool = True
) -> tuple[float, float, Any]:
    """One call of ``step`` between two device synchronisations: (wall seconds, processor seconds
    of the process, what it returned). For callers that schedule single steps themselves (the
    interleaved before/after rounds of ``nbt.optimize``); ``what`` names the call in a StepError."""
    sync = synchronize if synchronize_device else (lambda: None)
    sync()
    start, start_cpu = time.perf_counter(), time.process_time()
    value = call_step(step, what, name=name)
    sync()
    return time.perf_counter() - start, time.process_time() - start_cpu, value


def run_steps(
    step: Callable[[], Any],
    config: MeasureConfig | None = None,
    *,
    device: Any = None,
    name: str | None = None,
    peak_memory: bool = False,
    on_step: Callable[[str], None] | None = None,
    warmup_only: bool = False,
) -> StepRun:
    """Run ``step`` ``config.warmup`` times, then ``config.steps`` times, timing each call.

    Args:
        step: a zero-argument callable running one training step.
        config: steps, warm-up and whether to synchronise (default ``MeasureConfig()``).
        device: the device to synchronise (default: every accelerator in use).
        name: how errors name the step (default: its ``__name__``).
        peak_memory: reset the device's peak statistics before the measured steps and read the
            peak after them (CUDA only: the CPU keeps no allocator statistics).
        on_step: called with ``"warm-up step"`` / ``"timed step"`` after every call.
        warmup_only: run the warm-up steps only (a caller that runs something else, such as a
            FLOP-counted step, between the warm-up and the timed steps).

    Raises:
        StepError: the step raised; the original exception is its ``__cause__``.
    """
    config = config if config is not None else MeasureConfig()
    label = name or step_name(step)
    sync = (lambda: synchronize(device)) if config.synchronize else (lambda: None)
    run = StepRun()
    for index in range(config.warmup):
        sync()
        start = time.perf_counter()
        call_step(step, f"warm-up step {index + 1} of {config.warmup}", name=label)
        sync()
        run.warmup_times_s.append(time.perf_counter() - start)
        if on_step is not None:
            on_step("warm-up step")
    if warmup_only:
        return run
    gpu = _cuda_device(device) if peak_memory else None
    if gpu is not None:
        import torch

        torch.cuda.reset_peak_memory_stats(gpu)
    for index in range(config.steps):
        sync()
        start, start_cpu, start_thread = time.perf_counter(), time.process_time(), time.thread_time()
        value = call_step(step, f"timed step {index + 1} of {config.steps}", name=label)
        sync()
        run.times_s.append(time.perf_counter() - start)
        run.cpu_times_s.append(time.process_time() - start_cpu)
        run.thread_times_s.append(time.thread_time() - start_thread)
        run.values.append(value)
        if on_step is not None:
            on_step("timed step")
    if gpu is not None:
        import torch

        run.peak_bytes = int(torch.cuda.max_memory_allocated(gpu))
    return run
