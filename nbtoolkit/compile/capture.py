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

1. the first call (compiles; timed as ``first_call_s``, compile included);
2. N timed calls (``step_time_s`` = median wall time of a compiled step);
3. N calls under ``torch.profiler`` (CPU) to measure the cost of each break (below);
4. one warm-up plus N timed calls with ``torch.compiler.set_stance("force_eager")``
   (``eager_step_time_s``, the same step with every torch.compile directive ignored).

Every compile that happens in any of them (recompiles included) is recorded.

Cost of a graph break (``breaks.eager_us_per_step``), measured in step 3:
torch marks every run of a compiled frame with a profiler range
``Torch-Compiled Region: <frame>/<compile>``; the frame's compiled code calls the graph,
then runs the code at the break eagerly, then calls the resume function, whose own
compiled region nests inside. For each region R on the profiled thread:

- the excluded intervals X are R's direct child regions and the ``TorchDynamo Cache
  Lookup`` range that precedes each (the next graph and its guard check);
- the graph's end is the end of the last ``## Call CompiledFxGraph ##`` range directly in
  R (inductor); for backends whose graphs run as plain aten ops (``eager``,
  ``aot_eager``), the end of the k-th direct child op of R, where k is the graph's op count
  from ``compilation_metrics`` (0 for a frame without a graph: the end of the
  ``Pregraph bytecode`` range, else R's start);
- R's eager time = (R's end - the graph's end) - the part of X after the graph's end.

That eager time is added to the break(s) logged for R's compile id (split evenly when a
compile logged several) and divided by the number of profiled steps. It is host time:
the break's own Python and eager ops, the frame transition and the pregraph work of the
next graph; time in ``backward()`` or outside compiled frames is not attributed. An
op count that differs from the ops actually run (a graph node that runs no aten op, or
several) moves the graph's end by those ops; the inductor marker is exact. The report's
headline sums the costs of all breaks (``report.eager_between_graphs_s``) and shows them as
a share of a profiled step (``report.profiled_step_time_s``, the mean wall time of a step
in run 3), so that both sides of the ratio carry the profiler's overhead.

Errors: an exception raised by the code (a backend failure included) ends the run early;
it is recorded in ``report.error`` (and torch's compile failure in ``report.failures``)
and the report is returned, unless ``raise_errors=True``. ``KeyboardInterrupt`` is always
re-raised. In every case torch's logging state (the trace logger's handlers, level,
propagation, filters) and the compiler stance are restored exactly before returning.
"""

from __future__ import annotations

import dataclasses
import logging
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

_REGION = "Torch-Compiled Region: "
_CACHE_LOOKUP = "TorchDynamo Cache Lookup"
_PREGRAPH = "Pregraph bytecode"
_INDUCTOR_CALL = "## Call CompiledFxGraph"
_NOT_GRAPH_OPS = (_PREGRAPH, "AOTDispatcher Runtime Wrapper Prologue", _CACHE_LOOKUP)


class _RecordCollector(logging.Handler):
    """Keeps (metadata, payload) of every structured trace record; parsing happens after the run."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[tuple[dict[str, Any], str | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        metadata = getattr(record, "metadata", None)
        if isinstance(metadata, dict):
            self.records.append((metadata, getattr(record, "payload", None)))


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
    eager_baseline: bool = True,
    measure_cost: bool = True,
    raise_errors: bool = False,
    label: str | None = None,
    config: MeasureConfig | None = None,
    **kwargs: Any,
) -> GraphReport:
    """Run ``fn(*args, **kwargs)`` and report every graph, graph break, recompile and compile failure.

    ``fn`` is anything that calls torch.compile'd modules or functions (a training step,
    a forward pass, a notebook cell). It is called ``1 + 2*steps`` times, plus
    ``1 + steps`` eager calls when ``eager_baseline`` (see the module docstring for what
    each run measures and how a break's cost is measured); ``steps=0`` only records the
    compile of one call. ``label`` names the report (default: ``fn``'s qualified name).
    ``config`` (a :class:`~nbtoolkit.MeasureConfig`) gives ``steps`` (default
    ``MeasureConfig().steps``; ``steps=`` wins) and whether to synchronise the device; the first,
    compiling call is the warm-up, so its ``warmup`` is not used.
    An exception from ``fn`` is recorded in ``report.error`` (``raise_errors=True``: raised, as
    a StepError for the timed calls). The keyword arguments ``steps``, ``eager_baseline``,
    ``measure_cost``, ``raise_errors``, ``label`` and ``config`` belong to ``capture_graphs``; pass
    ``functools.partial(fn, steps=...)`` if ``fn`` itself takes one of those names.

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
    import torch

    from nbtoolkit.compile.log_events import CompileEventParser
    from nbtoolkit.compile.report import GraphReport
    from nbtoolkit.compile.user_source import SourcePolicy

    original = getattr(fn, "_orig_mod", None)  # a torch.compile'd nn.Module: name the module
    name = label or (type(original).__name__ if original is not None else None)
    name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
    error: str | None = None
    first_call_s = step_time_s = eager_step_time_s = None
    profiled_events: list[Any] = []
    profiled_steps = 0
    profiler_busy = False
    profiled_step_s: float | None = None

    def call() -> Any:
        return fn(*args, **kwargs)

    with _structured_trace_handler() as collector:
        try:
            first_call_s = _time_calls(call, measure, 1, name)[0]  # the compiling call
            if steps:
                step_time_s = statistics.median(_time_calls(call, measure, steps, name))
                if measure_cost and torch.autograd.profiler._is_profiler_enabled:
                    profiler_busy = True  # a profiler is already running (nbt.profile?): never nest one
                elif measure_cost:
                    profiled_events, profiled_step_s = _profile_calls(call, measure, steps, name)
                    profiled_steps = steps
                if eager_baseline:
                    with torch.compiler.set_stance("force_eager"):
                        # warm-up: the first eager call allocates and loads kernels
                        eager = run_steps(call, dataclasses.replace(measure, warmup=1), name=name)
                        eager_step_time_s = statistics.median(eager.times_s)
        except KeyboardInterrupt:
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
        _attribute_cost(breaks, frames["graphs"], profiled_events, profiled_steps, notes)
    if profiler_busy:
        notes.append("break costs not measured: another torch profiler was running during the capture")
    if error:
        notes.append(f"the code raised {error.splitlines()[0]}; the report covers what ran before")
    return GraphReport(
        **frames,
        compile_ids=[cid for _, cid in parser.compile_ids],
        source=name,
        notes=notes,
        first_call_s=first_call_s,
        step_time_s=step_time_s,
        eager_step_time_s=eager_step_time_s,
        steps=steps if step_time_s is not None else 0,
        error=error,
        profiled_step_time_s=profiled_step_s,
    )


def _time_calls(call: Callable[[], Any], measure: MeasureConfig, n: int, name: str) -> list[float]:
    """Seconds of each of ``n`` calls, no warm-up (the runner's loop)."""
    return run_steps(call, dataclasses.replace(measure, steps=n, warmup=0), name=name).times_s


def _profile_calls(
    call: Callable[[], Any], measure: MeasureConfig, n: int, name: str
) -> tuple[list[Any], float]:
    """Run ``n`` calls under the CPU profiler: its events (FunctionEvents with parents), mean s per call."""
    from torch.profiler import ProfilerActivity, profile

    from nbtoolkit.core.native_stderr import native_stderr_silenced

    prof = profile(activities=[ProfilerActivity.CPU])
    with native_stderr_silenced():  # Kineto's "USDT ... profiler_start" lines
        prof.start()
    try:
        per_call = sum(_time_calls(call, measure, n, name)) / n
    finally:
        with native_stderr_silenced():
            prof.stop()
    return list(prof.events()), per_call


def _attribute_cost(
    breaks: pd.DataFrame, graphs: pd.DataFrame, events: list[Any], steps: int, notes: list[str]
) -> None:
    """Fill ``breaks.eager_us_per_step`` from the profiled regions (algorithm in the module docstring)."""
    op_counts: dict[str, int] = {}
    for row in graphs.itertuples(index=False):
        key = f"{row.frame_id}/{row.frame_compile_id}"
        op_counts[key] = int(row.op_count) if row.op_count is not None and row.op_count == row.op_count else 0
    eager_by_region: dict[str, float] = {}
    regions = [e for e in events if e.name.startswith(_REGION)]
    for region in regions:
        cid = region.name[len(_REGION) :].strip()
        eager_by_region[cid] = eager_by_region.get(cid, 0.0) + _region_eager_us(region, op_counts.get(cid, 0))
    if not regions:
        notes.append("no compiled region ran in the profiled steps: break costs were not measured")
        return
    by_compile: dict[str, list[int]] = {}
    for i, row in enumerate(breaks.itertuples(index=False)):
        by_compile.setdefault(f"{row.frame_id}/{row.frame_compile_id}", []).append(i)
    column = breaks.columns.get_loc("eager_us_per_step")
    for cid, rows in by_compile.items():
        if cid in eager_by_region:
            share = eager_by_region[cid] / steps / len(rows)
            for i in rows:
                breaks.iat[i, column] = share


def _region_eager_us(region: Any, op_count: int) -> float:
    """Host µs of one compiled-region run spent after its graph, outside nested compiled regions."""
    start, end = region.time_range.start, region.time_range.end
    children = sorted(region.cpu_children, key=lambda e: e.time_range.start)
    excluded: list[tuple[float, float]] = []
    for i, child in enumerate(children):
        if child.name.startswith(_REGION):
            lo = child.time_range.start
            if i > 0 and children[i - 1].name == _CACHE_LOOKUP:
                lo = children[i - 1].time_range.start
            excluded.append((lo, child.time_range.end))
    graph_end = start
    pregraph = [c for c in children if c.name == _PREGRAPH]
    if pregraph:
        graph_end = pregraph[0].time_range.end
    inductor_calls = [c for c in children if c.name.startswith(_INDUCTOR_CALL)]
    if inductor_calls:
        graph_end = max(c.time_range.end for c in inductor_calls)
    elif op_count > 0:
        ops = [
            c
            for c in children
            if not c.name.startswith(_REGION)
            and c.name not in _NOT_GRAPH_OPS
            and c.time_range.start >= graph_end
        ]
        if ops:
            graph_end = ops[min(op_count, len(ops)) - 1].time_range.end
    eager = end - graph_end
    for lo, hi in excluded:
        overlap = min(hi, end) - max(lo, graph_end)
        if overlap > 0:
            eager -= overlap
    return max(eager, 0.0)
