"""``capture_graphs``: run torch.compile'd code and record its graphs, breaks, recompiles and failures.

How it records: torch writes its structured compile events (what ``TORCH_TRACE`` writes
to files and tlparse reads) through the logger ``torch.__trace``
(``torch._logging._internal.trace_log``), but only while that logger has a handler. For
the duration of the call a small in-memory handler is attached there; it keeps each
record's ``metadata`` and ``payload``, which are parsed after the run by the same parser
that reads log files (:mod:`nbtoolkit.compile.log_events`). Nothing is parsed from
printed text. An inactive ``LazyTraceHandler`` (torch's default when ``TORCH_TRACE`` is
unset) is set aside during the capture, because on its first record it removes itself
from the logger, which would make the logger skip our handler for that record; an active
one (``TORCH_TRACE`` set) keeps writing its file.

What runs, in order (``steps`` = N):

1. the first call: it compiles; ``first_call_s`` is its wall time, compile included, and
   ``first_call_compile_s`` the compile time of the compiles it ran, so that the first call
   reads as compiling plus running (``compile_time_s`` also counts compiles of later calls);
2. with ``eager_baseline``: one eager warm-up call, then N eager and N compiled calls
   interleaved (eager, compiled, eager, compiled, ...) so that a busy machine slows both
   alike; the eager calls run under ``torch.compiler.set_stance("force_eager")``, the same
   step with every torch.compile directive ignored. Without it, N compiled calls.
   ``step_times_s`` and ``eager_step_times_s`` keep every timed call. The compiles each
   timed compiled call ran (a recompile, a frame reached for the first time) are counted
   from the compile events torch logs during that call (``timed_step_compiles``);
   ``step_time_s`` is the median of the timed compiled calls that compiled nothing (of all
   of them, with a note, when every one compiled);
3. with ``measure_cost``: one compiled call under ``torch.profiler`` with Python stacks
   (it counts the ops each plain-op graph runs), then N compiled calls under the profiler
   without stacks that measure what each break costs (the method:
   :mod:`nbtoolkit.compile.break_cost`).

Every compile that happens in any of them (recompiles included) is recorded. The report
calls compiled vs eager a speed-up (or a slow-down) only when the middle halves (25th to
75th percentile) of the two sets of step times do not overlap, the rule
:class:`nbtoolkit.recompute.comparison.Comparison` uses (:attr:`GraphReport.speedup`).

Errors: an exception raised by the code (a backend failure included) ends the run early;
it is recorded in ``report.error`` (and torch's compile failure in ``report.failures``)
and the report is returned, unless ``raise_errors=True``. ``KeyboardInterrupt`` is always
re-raised. In every case torch's logging state (the trace logger's handlers, level,
propagation, filters) and the compiler stance are restored exactly before returning.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError, StepError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.core.step_runner import run_steps

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.compile.report import GraphReport

__all__ = ["capture_graphs"]


class _RecordCollector(logging.Handler):
    """Keeps (metadata, payload) of every structured trace record; parsing happens after the run."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[tuple[dict[str, Any], str | None]] = []
        # "frame/compile" of every compile torch started, in order (its `dynamo_start` event)
        self.compile_starts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        metadata = getattr(record, "metadata", None)
        if isinstance(metadata, dict):
            self.records.append((metadata, getattr(record, "payload", None)))
            if "dynamo_start" in metadata:
                self.compile_starts.append(f"{metadata.get('frame_id')}/{metadata.get('frame_compile_id')}")


@contextmanager
def _structured_trace_handler() -> Iterator[_RecordCollector]:
    """Attach a collector to torch's structured trace logger; restore the logger exactly after."""
    from torch._logging import _internal as torch_logging

    trace_log = torch_logging.trace_log
    saved_handlers = list(trace_log.handlers)
    saved_level = trace_log.level
    saved_propagate = trace_log.propagate
    saved_disabled = trace_log.disabled
    saved_filters = list(trace_log.filters)
    collector = _RecordCollector()

    def inactive_lazy(handler: logging.Handler) -> bool:
        lazy = getattr(torch_logging, "LazyTraceHandler", None)
        return (
            lazy is not None
            and isinstance(handler, lazy)
            and getattr(handler, "root_dir", None) is None
            and getattr(handler, "stream", None) is None
        )

    try:
        # in place: the logger keeps its own list object, as before
        trace_log.handlers[:] = [collector, *[h for h in saved_handlers if not inactive_lazy(h)]]
        trace_log.setLevel(logging.DEBUG)
        trace_log.disabled = False
        yield collector
    finally:
        trace_log.handlers[:] = saved_handlers
        trace_log.setLevel(saved_level)
        trace_log.propagate = saved_propagate
        trace_log.disabled = saved_disabled
        trace_log.filters[:] = saved_filters
        collector.close()


def capture_graphs(
    fn: Callable[..., Any],
    /,
    *args: Any,
    steps: int | None = None,
    eager_baseline: bool | None = None,
    measure_cost: bool = True,
    raise_errors: bool = False,
    label: str | None = None,
    config: MeasureConfig | None = None,
    loop: bool = False,
    after: str = "stop",
    **kwargs: Any,
) -> GraphReport:
    """Run ``fn(*args, **kwargs)`` and report every graph, graph break, recompile and compile failure.

    ``fn`` is anything that calls torch.compile'd modules or functions (a training step,
    a forward pass, a notebook cell). It is called ``1 + steps`` times, plus ``1 + steps``
    profiled calls when ``measure_cost`` and ``1 + steps`` eager calls when
    ``eager_baseline`` (the module docstring says what each run measures,
    :mod:`nbtoolkit.compile.break_cost` how a break's cost is measured); ``steps=0`` only
    records the compile of one call. ``label`` names the report (default: ``fn``'s
    qualified name).
    ``config`` (a :class:`~nbtoolkit.MeasureConfig`) gives ``steps`` (default
    ``MeasureConfig().steps``; ``steps=`` wins) and whether to synchronise the device; the first,
    compiling call is the warm-up, so its ``warmup`` is not used.
    An exception from ``fn`` is recorded in ``report.error`` (``raise_errors=True``: raised, as
    a StepError for the timed calls). The keyword arguments ``steps``, ``eager_baseline``,
    ``measure_cost``, ``raise_errors``, ``label``, ``config``, ``loop`` and ``after`` belong to
    ``capture_graphs``; pass ``functools.partial(fn, steps=...)`` if ``fn`` itself takes one of those names.

    ``loop=True``: ``fn`` runs a whole training (``lambda: trainer.train()``, a Lightning ``fit``,
    a plain loop; no ``args``). Its setup and first training step are the first, compiling call;
    every later call is the loop's next training step (a step ends at an optimizer step), so the
    loop must have ``1 + steps`` training steps, ``1 + steps`` more with ``measure_cost`` and
    ``1 + steps`` more with ``eager_baseline``. For a loop, ``eager_baseline`` defaults to False:
    eager steps would be other training steps (other batches, a model that has moved on), not
    the same step run eagerly. Then the loop is stopped (``after="stop"``) or runs on to its end
    unmeasured (``after="continue"``); ``report.loop`` is the
    :class:`~nbtoolkit.core.training_loop.LoopOutcome` (:mod:`nbtoolkit.core.loop_measure`).
    ``eager_baseline=None`` (default): True for a step function, False for a loop.

    Returns a :class:`~nbtoolkit.compile.report.GraphReport`; ``report.break_summary()``
    ranks the distinct breaks by measured cost, with a fix hint each.
    """
    if not callable(fn):
        raise NbtUsageError(
            f"capture_graphs needs a callable, got {type(fn).__name__}: pass the step function"
        )
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 0):
        raise NbtUsageError(f"steps must be an integer >= 0, got {steps!r}")
    # steps=0: only the compiling call runs, which a MeasureConfig (steps >= 1) cannot say
    measure = measure_config(config, steps=steps or None, warmup=0)
    steps = 0 if steps == 0 else measure.steps
    if loop:
        return _capture_loop(fn, args, kwargs, steps=steps, measure=measure, eager_baseline=eager_baseline,
                             measure_cost=measure_cost, raise_errors=raise_errors, label=label, after=after)
    original = getattr(fn, "_orig_mod", None)  # a torch.compile'd nn.Module: name the module
    name = label or (type(original).__name__ if original is not None else None)
    name = name or getattr(fn, "__qualname__", None) or type(fn).__name__

    def call() -> Any:
        return fn(*args, **kwargs)

    eager = True if eager_baseline is None else eager_baseline
    return _capture(call, call, name=name, measure=measure, steps=steps, eager_baseline=eager,
                    measure_cost=measure_cost, raise_errors=raise_errors)


def _capture_loop(loop: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, steps: int,
                  measure: MeasureConfig, eager_baseline: bool | None, measure_cost: bool, raise_errors: bool,
                  label: str | None, after: str) -> GraphReport:
    """capture_graphs(loop=True): the loop's setup and first step are the compiling call."""
    from nbtoolkit.core.errors import LoopError
    from nbtoolkit.core.loop_measure import begin, measure_loop

    if args or kwargs:
        raise NbtUsageError(
            "with loop=True, fn is the training loop and is called with no arguments: pass "
            "lambda: trainer.train(...) (or functools.partial) instead of arguments to capture_graphs"
        )
    eager = bool(eager_baseline)  # None: no eager steps for a loop (see the docstring)
    name = label or "the training loop"

    needs = (1 + 2 * steps if eager else steps) + (1 + steps if measure_cost and steps else 0)

    def capture_steps(training: Any) -> GraphReport:
        return _capture(training, lambda: begin(training, needs), name=name, measure=measure, steps=steps,
                        eager_baseline=eager, measure_cost=measure_cost, raise_errors=raise_errors,
                        passthrough=(LoopError,))

    report = measure_loop(loop, capture_steps, api="nbt.capture_graphs", warmup=1, after=after, needs=needs,
                          start=False)
    if not eager and steps:
        report.notes.append(
            "no eager baseline: each call of a training loop is its next training step, not the same step "
            "again; eager_baseline=True times eager training steps interleaved (they use more of the loop)"
        )
    return report


def _capture(call: Callable[[], Any], first_call: Callable[[], Any], *, name: str, measure: MeasureConfig,
             steps: int, eager_baseline: bool, measure_cost: bool, raise_errors: bool,
             passthrough: tuple[type[BaseException], ...] = ()) -> GraphReport:
    """The capture itself: ``first_call`` compiles, ``call`` is timed (the module docstring's order).

    Exceptions of the ``passthrough`` types propagate (a training loop that ended too soon)."""
    import torch

    from nbtoolkit.compile.break_cost import attribute_break_costs, graph_op_counts
    from nbtoolkit.compile.log_events import CompileEventParser
    from nbtoolkit.compile.report import GraphReport
    from nbtoolkit.compile.user_source import SourcePolicy

    error: str | None = None
    timing = _Timing()
    profiled_events: list[Any] = []
    profiled_steps = 0
    profiler_busy = False
    profiled_step_s: float | None = None
    ops_run: dict[str, int] = {}

    with _structured_trace_handler() as collector:
        try:
            first = _timed_call(first_call, measure, name, collector)
            timing.first_call_s, timing.first_call_compiles = first
            if steps:
                _interleaved_steps(
                    call, measure, steps, name=name, collector=collector, timing=timing, eager=eager_baseline
                )
                if measure_cost and torch.autograd.profiler._is_profiler_enabled:
                    profiler_busy = True  # a profiler is already running (nbt.profile?): never nest one
                elif measure_cost:
                    # one call with Python stacks first: how many ops each plain-op graph runs
                    ops_run = graph_op_counts(_profile_calls(call, measure, 1, name, with_stack=True)[0])
                    profiled_events, profiled_step_s = _profile_calls(call, measure, steps, name)
                    profiled_steps = steps
        except KeyboardInterrupt:
            raise
        except passthrough:
            raise
        except Exception as exc:
            if raise_errors:
                raise
            # the report names what the user's code raised, not the runner's wrapper of it
            cause = exc.__cause__ if isinstance(exc, StepError) and exc.__cause__ is not None else exc
            error = "".join(traceback.format_exception_only(type(cause), cause)).strip()
        records = list(collector.records)

    parser = CompileEventParser(source=name, source_policy=SourcePolicy.live())
    for metadata, payload in records:
        parser.add(metadata, payload)
    frames = parser.frames()
    notes = list(parser.notes)
    if not records:
        notes.append(
            "torch logged no compile event: did fn call a torch.compile'd module or function "
            "(or was everything already compiled before this call? torch._dynamo.reset() recompiles)"
        )
    breaks = frames["breaks"]
    breaks["eager_us_per_step"] = float("nan")
    if profiled_events:
        attribute_break_costs(
            breaks, frames["graphs"], profiled_events, profiled_steps, notes, ops_run=ops_run
        )
    if profiler_busy:
        notes.append("break costs not measured: another torch profiler was running during the capture")
    if error:
        notes.append(f"the code raised {error.splitlines()[0]}; the report covers what ran before")
    return GraphReport(
        **frames,
        compile_ids=[cid for _, cid in parser.compile_ids],
        source=name,
        notes=notes,
        first_call_s=timing.first_call_s,
        step_time_s=timing.step_time_s(),
        eager_step_time_s=statistics.median(timing.eager_s) if timing.eager_s else None,
        steps=len(timing.compiled_s),
        error=error,
        profiled_step_time_s=profiled_step_s,
        first_call_compile_s=_compile_seconds(frames["compiles"], timing.first_call_compiles),
        step_times_s=list(timing.compiled_s),
        eager_step_times_s=list(timing.eager_s),
        timed_step_compiles=[len(c) for c in timing.compiled_compiles],
    )


@dataclasses.dataclass
class _Timing:
    """What the timed calls measured: seconds, and the compiles ("frame/compile") each call ran."""

    first_call_s: float | None = None
    first_call_compiles: list[str] = dataclasses.field(default_factory=list)
    compiled_s: list[float] = dataclasses.field(default_factory=list)
    compiled_compiles: list[list[str]] = dataclasses.field(default_factory=list)
    eager_s: list[float] = dataclasses.field(default_factory=list)

    def step_time_s(self) -> float | None:
        """Median of the compiled calls that compiled nothing; of all of them when each compiled."""
        clean = [t for t, c in zip(self.compiled_s, self.compiled_compiles, strict=True) if not c]
        chosen = clean or self.compiled_s
        return statistics.median(chosen) if chosen else None


def _timed_call(
    call: Callable[[], Any], measure: MeasureConfig, name: str, collector: _RecordCollector
) -> tuple[float, list[str]]:
    """Seconds of one call (the runner's loop: synchronised, errors named) and the compiles it ran."""
    before = len(collector.compile_starts)
    seconds = run_steps(call, dataclasses.replace(measure, steps=1, warmup=0), name=name).times_s[0]
    return seconds, list(dict.fromkeys(collector.compile_starts[before:]))  # one per compile


def _interleaved_steps(
    call: Callable[[], Any],
    measure: MeasureConfig,
    n: int,
    *,
    name: str,
    collector: _RecordCollector,
    timing: _Timing,
    eager: bool,
) -> None:
    """N compiled calls, each after an eager one when ``eager`` (one eager warm-up first)."""
    import torch

    def eager_call() -> float:
        with torch.compiler.set_stance("force_eager"):
            return _timed_call(call, measure, name, collector)[0]

    if eager:
        eager_call()  # warm-up: the first eager call allocates and loads kernels
    for _ in range(n):
        if eager:
            timing.eager_s.append(eager_call())
        seconds, compiles = _timed_call(call, measure, name, collector)
        timing.compiled_s.append(seconds)
        timing.compiled_compiles.append(compiles)


def _compile_seconds(compiles: pd.DataFrame, ids: list[str]) -> float | None:
    """Compile time (compilation_metrics) of the compiles named "frame/compile" in ``ids``."""
    if not ids or compiles.empty:
        return 0.0 if not ids else None
    wanted = set(ids)
    keys = [f"{f}/{c}" for f, c in zip(compiles["frame_id"], compiles["frame_compile_id"], strict=True)]
    seconds = [
        t
        for key, t in zip(keys, compiles["compile_time_s"], strict=True)
        if key in wanted and not math.isnan(t)
    ]
    return float(sum(seconds))


def _time_calls(call: Callable[[], Any], measure: MeasureConfig, n: int, name: str) -> list[float]:
    """Seconds of each of ``n`` calls, no warm-up (the runner's loop)."""
    return run_steps(call, dataclasses.replace(measure, steps=n, warmup=0), name=name).times_s


def _profile_calls(
    call: Callable[[], Any], measure: MeasureConfig, n: int, name: str, *, with_stack: bool = False
) -> tuple[list[Any], float]:
    """Run ``n`` calls under the CPU profiler: its events (FunctionEvents with parents), mean s per call."""
    from torch.profiler import ProfilerActivity, profile

    from nbtoolkit.core.native_stderr import native_stderr_silenced

    prof = profile(activities=[ProfilerActivity.CPU], with_stack=with_stack)
    with native_stderr_silenced():  # Kineto's "USDT ... profiler_start" lines
        prof.start()
    try:
        per_call = sum(_time_calls(call, measure, n, name)) / n
    finally:
        with native_stderr_silenced():
            prof.stop()
    return list(prof.events()), per_call
