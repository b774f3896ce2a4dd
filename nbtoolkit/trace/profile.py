"""``nbt.profile``: run a function under ``torch.profiler`` and get a :class:`Trace` back.

The function runs ``warmup`` times unprofiled (first-call costs such as lazy
initialisation or compilation would otherwise dominate), then ``steps`` times under the
profiler with one ``ProfilerStep#N`` per call, recorded by
:func:`nbtoolkit.trace.torch_profiler.record_step_trace`, the same recorder the cluster's
ranks use. The Chrome trace the profiler exports is read back through
:func:`nbtoolkit.load_trace`, so a profiled cell feeds exactly the same analyses and views
as a trace file from a GPU cluster.

The machine's load around every profiled step (load probes, the wait for a processor) is kept
with the trace as ``trace.step_load`` (:mod:`nbtoolkit.trace.step_load`): ``nbt.compare`` uses it
to leave the steps that other work disturbed out of the step-time comparison.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.measure_config import MeasureConfig, measure_config

if TYPE_CHECKING:
    from nbtoolkit.trace.trace import Trace

__all__ = ["profile"]


def profile(
    fn: Callable[[], Any],
    steps: int | None = None,
    *,
    warmup: int | None = None,
    record_shapes: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    trace_path: str | Path | None = None,
    metrics: bool = False,
    tokens_per_step: int | None = None,
    config: MeasureConfig | None = None,
    loop: bool = False,
    after: str = "stop",
) -> Trace:
    """Profile ``steps`` calls of ``fn`` (after ``warmup`` unprofiled calls) and return the Trace.

    Args:
        fn: a zero-argument callable, e.g. one training step.
        steps: profiled calls, one ``ProfilerStep#N`` each (N counts from 0); default
            ``MeasureConfig().steps``.
        warmup: calls before profiling starts; default ``MeasureConfig().warmup``.
        record_shapes, profile_memory, with_stack: passed to ``torch.profiler.profile``.
        trace_path: also keep the exported Chrome trace at this path (``.json``), e.g.
            to open it in Perfetto; by default it goes to a temporary file that is removed.
        metrics: also count the step's FLOPs (one more, unprofiled run under torch's FLOP
            counter) and attach :class:`~nbtoolkit.metrics.step_metrics.StepMetrics` as
            ``trace.step_metrics``, with MFU/HFU in the summary. The step times are the
            profiled ones, so MFU is a lower bound (the profiler adds overhead).
        tokens_per_step: tokens one call of ``fn`` processes, for tokens/s (with ``metrics``).
        config: a :class:`~nbtoolkit.MeasureConfig` (steps, warm-up, whether each step waits
            for its device work); ``steps=``/``warmup=`` given as well win.
        loop: ``fn`` runs a whole training (``lambda: trainer.train()``, a Lightning ``fit``, a
            plain loop): its setup and ``warmup`` training steps (at least 1) run unprofiled, then
            ``steps`` training steps are profiled, one ``ProfilerStep#N`` each (a step ends at an
            optimizer step), then the loop is stopped (:mod:`nbtoolkit.core.loop_measure`).
            ``metrics`` counts FLOPs on one more training step. ``trace.loop`` is the
            :class:`~nbtoolkit.core.training_loop.LoopOutcome`.
        after: with ``loop``: ``"stop"`` (default) stops the loop through the framework's own
            mechanism once its steps are profiled; ``"continue"`` lets it run on, unprofiled.

    CPU activities are always recorded, CUDA ones when CUDA is available; each step waits for
    its device work (the step runner's ``synchronize`` inside the step's label).
    The profiler is stopped in a ``finally`` block, so an exception or a KeyboardInterrupt
    inside ``fn`` leaves no profiler running; the exception propagates unchanged.
    The value ``fn`` returned last is kept in ``trace.value``; the load measured around each step in
    ``trace.step_load`` (``{rank: StepLoad}``, saved with the trace).
    """
    from nbtoolkit.trace.kineto import load_trace
    from nbtoolkit.trace.kineto_args import attach_event_args
    from nbtoolkit.trace.step_load import StepLoadRecorder
    from nbtoolkit.trace.torch_profiler import record_step_trace, temporary_trace_file

    measure = measure_config(config, steps=steps, warmup=warmup)
    if loop:
        from nbtoolkit.core.loop_measure import measure_loop

        def profile_steps(training: Any) -> Trace:
            return profile(
                training,
                config=dataclasses.replace(measure, warmup=0),
                record_shapes=record_shapes,
                profile_memory=profile_memory,
                with_stack=with_stack,
                trace_path=trace_path,
                metrics=metrics,
                tokens_per_step=tokens_per_step,
            )

        # the loop's own steps: one more with metrics (its FLOP-counted step)
        needs = measure.steps + int(metrics)
        return measure_loop(
            fn, profile_steps, api="nbt.profile", warmup=measure.warmup, after=after, needs=needs
        )

    keep = trace_path is not None
    where = (
        contextlib.nullcontext(Path(trace_path))
        if trace_path is not None
        else temporary_trace_file("nbt-profile-")  # removed once the trace is loaded
    )
    recorder = StepLoadRecorder()
    with where as out:
        value = record_step_trace(
            fn,
            out,
            steps=measure.steps,
            warmup=measure.warmup,
            synchronize=measure.synchronize,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            load=recorder,
        )
        step_load = recorder.finish()  # the machine's busy share over the recording, not the loading
        trace = load_trace(out)
        attach_event_args(trace)  # shapes and sync arguments, read before the temporary file goes
    for info in trace.info.values():
        # load_trace notes that a temporary file name carries no rank; here we know why.
        info.notes = [n for n in info.notes if "file name" not in n]
        info.source = str(out) if keep else "nbt.profile (in this process)"
    trace.value = value
    if len(trace.ranks) == 1:  # the profiler writes one rank; its steps are the recorder's
        trace.step_load = {trace.ranks[0]: step_load}
    if metrics:
        _attach_step_metrics(trace, fn, tokens_per_step)
    return trace


def _attach_step_metrics(trace: Trace, fn: Callable[[], Any], tokens_per_step: int | None) -> None:
    """Count FLOPs of one more call of ``fn`` and rate them against the profiled step times."""
    from nbtoolkit.core.errors import MetricsError
    from nbtoolkit.metrics.measure import step_metrics_from_times

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
